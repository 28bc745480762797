"""The full fine-tuning KL reference (mmrlvr.train.runtime.reference_copy): frozen weights held once.

The reference must stay the *initial* policy while the policy trains; sharing the frozen parameters (the
vision tower with ``model.freeze_vision``) is only sound because they never change. Both are checked on
the tiny Qwen2.5-VL: storage shared for frozen tensors, separate for trainable ones, and after optimiser
steps on the policy the reference still gives the initial model's logits.
"""

import pytest
import torch

from mmrlvr.models import load_policy
from mmrlvr.models.lora import freeze_vision
from mmrlvr.train.runtime import reference_copy


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> str:
    from mmrlvr.models.tiny import build_tiny

    return str(build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny") / "m"))


def _ptrs(model: torch.nn.Module, frozen: bool) -> set[int]:
    return {p.data_ptr() for p in model.parameters() if p.requires_grad != frozen}


def test_frozen_shared_trainable_copied_and_reference_stays_initial(tiny_dir):
    torch.manual_seed(0)
    model, _ = load_policy(tiny_dir)
    freeze_vision(model)
    n_frozen = sum(not p.requires_grad for p in model.parameters())
    assert n_frozen > 0  # the premise: a frozen vision tower
    ids = torch.randint(0, 500, (2, 12))
    with torch.no_grad():
        before = model(input_ids=ids).logits.clone()

    ref = reference_copy(model)
    assert all(not p.requires_grad for p in ref.parameters())
    ref_ptrs = {p.data_ptr() for p in ref.parameters()}
    assert _ptrs(model, frozen=True) <= ref_ptrs  # the frozen weights are the same storage
    assert not (_ptrs(model, frozen=False) & ref_ptrs)  # the trainable ones are copies
    assert len(list(ref.parameters())) == len(list(model.parameters()))

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        model(input_ids=ids).logits.square().mean().backward()
        opt.step()
    with torch.no_grad():
        after_policy, after_ref = model(input_ids=ids).logits, ref(input_ids=ids).logits
    assert not torch.allclose(after_policy, before)  # the policy moved
    torch.testing.assert_close(after_ref, before, rtol=0, atol=0)  # the reference did not


def test_share_frozen_off_copies_everything(tiny_dir):
    model, _ = load_policy(tiny_dir)
    freeze_vision(model)
    ref = reference_copy(model, share_frozen=False)
    assert not ({p.data_ptr() for p in model.parameters()} & {p.data_ptr() for p in ref.parameters()})
