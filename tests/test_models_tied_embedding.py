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
from mmrlvr.algos.logits import logprobs_from_hidden
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
    if sys.argv[2] == "fused":  # the trainer's head: chunked log-probs from the head's input
        loss = logprobs_from_hidden(m.emb(ids), m.head.weight, ids)[0].sum()
    else:
        loss = torch.log_softmax(m.head(m.emb(ids).mean(1)), -1)[:, 0].sum()
    base = status("VmRSS")
    open("/proc/self/clear_refs", "w").write("5")
    loss.backward()
    peak = status("VmHWM") - base
print(json.dumps({"backward_peak_mib": peak}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
@pytest.mark.parametrize("head", ["linear", "fused"])
def test_the_backward_no_longer_allocates_a_second_vocabulary_sized_gradient(head):
    """With nn.Linear's head and with the fused chunked head (whose dense share is written into .grad directly:
    returned to autograd, the dense + sparse sum was a new [V, H] tensor and the saving was 1 MiB)."""
    def peak(mode):
        out = subprocess.run([sys.executable, "-c", PEAK, mode, head], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])["backward_peak_mib"]

    dense, sparse = peak("dense"), peak("sparse")
    assert dense - sparse > 100, (dense, sparse)  # ~234 MiB: a [V, H] float32 gradient (fused: 481 -> 351)


def test_fused_head_with_a_sparse_tied_lookup_gives_the_same_dense_gradient(tiny_dir):
    """The fused head writes its share into .grad; the lookup's sparse share is added to it in place. Over two
    micro-batches (gradient accumulation) the sum is the dense autograd path's."""
    from mmrlvr.algos.logits import logprobs_from_hidden

    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 500, (2, 9), generator=gen) for _ in range(2)]

    def grads(model):
        model.zero_grad(set_to_none=True)
        emb = model.get_input_embeddings()
        for ids in batches:
            hidden = model.model.language_model(input_ids=ids).last_hidden_state
            logp, _ = logprobs_from_hidden(hidden, model.lm_head.weight, ids, chunk_size=5)
            (logp * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, emb.weight.grad

    dense, _ = grads(_tied(tiny_dir))
    model = _tied(tiny_dir)
    assert sparse_tied_embedding_grad(model)
    sparse, tied_grad = grads(model)
    assert tied_grad.layout == torch.strided and dense.keys() == sparse.keys()
    for n in dense:
        torch.testing.assert_close(sparse[n], dense[n], rtol=1e-5, atol=1e-7, msg=n)
