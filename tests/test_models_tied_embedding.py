"""A trainable tied embedding's lookup gives a sparse gradient (mmrlvr.models.tied_embedding).

The gradient the optimiser sees must be the same dense tensor as before; the premise (a [V, H] transient
gone from the backward) is measured in a fresh process by its peak RSS.
"""

import json
import subprocess
import sys

import pytest
import torch

from mmrlvr.models import load_policy
from mmrlvr.models.tied_embedding import sparse_tied_embedding_grad, tied_trainable_embedding


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    from mmrlvr.models.tiny import build_tiny

    return str(build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m"))


def _tied(tiny_dir):
    model, _ = load_policy(tiny_dir)
    model.lm_head.weight = model.get_input_embeddings().weight
    return model


def _grads(model, ids):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids).logits
    torch.log_softmax(logits, -1)[..., 5].sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_tied_gradient_is_the_same_dense_tensor(tiny_dir):
    ids = torch.randint(0, 500, (3, 10), generator=torch.Generator().manual_seed(0))
    model = _tied(tiny_dir)
    dense = _grads(model, ids)
    assert sparse_tied_embedding_grad(model) and model.get_input_embeddings().sparse
    sparse = _grads(model, ids)
    assert dense.keys() == sparse.keys()
    for n in dense:
        assert sparse[n].layout == torch.strided, n
        torch.testing.assert_close(sparse[n], dense[n], rtol=1e-6, atol=1e-7, msg=n)


def test_untied_or_frozen_embeddings_are_left_alone(tiny_dir):
    untied, _ = load_policy(tiny_dir)  # the tiny model's head is its own weight
    assert tied_trainable_embedding(untied) is None and not sparse_tied_embedding_grad(untied)
    assert not untied.get_input_embeddings().sparse
    frozen = _tied(tiny_dir)
    frozen.get_input_embeddings().weight.requires_grad_(False)
    assert not sparse_tied_embedding_grad(frozen)
    assert not sparse_tied_embedding_grad(torch.nn.Linear(2, 2))


PEAK = r"""
import json, sys, torch
from mmrlvr.models.tied_embedding import sparse_tied_embedding_grad
V, H = 60000, 1024  # a [V, H] float32 tensor is 234 MiB
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, H)
        self.head = torch.nn.Linear(H, V, bias=False)
        self.head.weight = self.emb.weight
    def get_input_embeddings(self): return self.emb
    def get_output_embeddings(self): return self.head
torch.manual_seed(0)
m = M()
if sys.argv[1] == "sparse":
    assert sparse_tied_embedding_grad(m)
ids = torch.randint(0, V, (4, 64))
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) / 1024
for _ in range(2):  # the second step: .grad exists, as in training
    m.zero_grad(set_to_none=True)
    loss = torch.log_softmax(m.head(m.emb(ids).mean(1)), -1)[:, 0].sum()
    base = status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")
    loss.backward()
    peak = status("VmHWM") - base
print(json.dumps({"backward_peak_mib": peak}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_the_backward_no_longer_allocates_a_second_vocabulary_sized_gradient():
    def peak(mode):
        out = subprocess.run([sys.executable, "-c", PEAK, mode], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])["backward_peak_mib"]

    dense, sparse = peak("dense"), peak("sparse")
    assert dense - sparse > 150, (dense, sparse)  # ~234 MiB: the dense lookup gradient
