"""GRPO-CARE likelihood consistency: EMA reference math, answer probabilities, the judge on a real tiny VLM."""

from __future__ import annotations

import math

import pytest
import torch
from PIL import Image
from torch.testing import assert_close

from mmrlvr.consistency import ConsistencyReward, LikelihoodJudge, build_judge
from mmrlvr.consistency.bonus import care_bonus
from mmrlvr.consistency.likelihood import EMAReference, answer_likelihoods, answer_probs, build_answer_inputs
from mmrlvr.errors import UserError
from mmrlvr.types import Completion, Sample


# ----------------------------------------------------------------------------------------- pure math

def test_answer_probs_hand_worked():
    V = 3
    logits = torch.zeros(4, 2, V)
    logits[0, 1, 0] = math.log(3.0)  # row 0: P(tok 0) = 1/3 then 3/(3+1+1) = 0.6
    logits[1, 0, 0] = math.log(9.0)  # row 1: P = 9/11, second token masked out
    logits[2, :, 0] = 10.0  # row 2: P ~ 0.9999 -> clamped to 0.95
    ids = torch.zeros(4, 2, dtype=torch.long)
    mask = torch.tensor([[1, 1], [1, 0], [1, 1], [0, 0]], dtype=torch.float)  # row 3: no answer tokens
    p = answer_probs(logits, ids, mask)
    # row 0: exp(mean(log 1/3, log 0.6)) = sqrt(0.2) = 0.44721
    assert_close(p[:3], torch.tensor([math.sqrt(0.2), 9 / 11, 0.95]))
    assert torch.isnan(p[3])


def test_ema_update_math_every_and_exact_swap():
    lin = torch.nn.Linear(2, 1, bias=True)
    lin.bias.requires_grad_(False)  # frozen parameters are not tracked
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[0.0, 0.0]]))
    ema = EMAReference(lin, decay=0.9, every=2)
    assert list(ema.shadow) == ["weight"]
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0]]))  # "training" moved the weights
    assert not ema.maybe_update(lin, 0) and not ema.maybe_update(lin, 1)
    assert_close(ema.shadow["weight"], torch.tensor([[0.0, 0.0]]))
    assert ema.maybe_update(lin, 2)
    # 0.9 * (0, 0) + 0.1 * (1, 2) = (0.1, 0.2)
    assert_close(ema.shadow["weight"], torch.tensor([[0.1, 0.2]]))
    assert not ema.maybe_update(lin, 3) and ema.maybe_update(lin, 4)
    # 0.9 * (0.1, 0.2) + 0.1 * (1, 2) = (0.19, 0.38)
    assert_close(ema.shadow["weight"], torch.tensor([[0.19, 0.38]]))
    own = lin.weight.data_ptr()
    with ema.applied(lin):
        assert_close(lin.weight.data, torch.tensor([[0.19, 0.38]]))
        x = torch.tensor([[1.0, 1.0]])
        assert_close(lin(x) - lin.bias, torch.tensor([[0.57]]))  # 0.19 + 0.38
    assert lin.weight.data_ptr() == own  # the policy's own storage is back, untouched
    assert_close(lin.weight.data, torch.tensor([[1.0, 2.0]]))
    state = ema.state_dict()
    again = EMAReference(lin, decay=0.5, every=7)
    again.load_state_dict(state)
    assert (again.decay, again.every, again.num_updates) == (0.9, 2, 2)
    assert_close(again.shadow["weight"], ema.shadow["weight"])


def test_ema_keeps_float32_for_low_precision_params():
    lin = torch.nn.Linear(4, 4, bias=False).to(torch.bfloat16)
    ema = EMAReference(lin, decay=0.995, every=1)
    assert ema.shadow["weight"].dtype == torch.float32
    start = ema.shadow["weight"].clone()
    with torch.no_grad():
        lin.weight.add_(1.0)
    ema.update(lin)
    # a 0.005 step survives in float32 (it would round away in bf16 for |w| ~ 1)
    assert_close(ema.shadow["weight"] - start, torch.full((4, 4), 0.005), atol=1e-3, rtol=0)
    with ema.applied(lin):
        assert lin.weight.dtype == torch.bfloat16


def test_ema_rejects_bad_settings():
    lin = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError):
        EMAReference(lin, decay=1.5)
    with pytest.raises(ValueError):
        EMAReference(lin, every=0)
    lin.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable"):
        EMAReference(lin)


# --------------------------------------------------------------------------------- real tiny VLM

@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    from mmrlvr.models.tiny import build_tiny

    return build_tiny("qwen2_5_vl", tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def tiny(tiny_folder):
    """A fresh (model, processor) per test: LoRA wrapping freezes the base model's parameters."""
    from transformers import AutoModelForImageTextToText

    from mmrlvr.models.compat import load_processor

    return AutoModelForImageTextToText.from_pretrained(tiny_folder), load_processor(tiny_folder, "qwen2_5_vl")


def _count(colour: str = "red") -> Sample:
    img = Image.new("RGB", (112, 112), (255, 255, 255))
    return Sample(id="c", messages=[{"role": "user", "content": [{"type": "image"}, {
        "type": "text", "text": f"How many {colour} shapes are there?"}]}], images=[img], answer="2",
        answer_type="number", meta={"task": "count", "colour": colour})


ROWS = ["<think>I see 2 red, 1 blue.</think><answer>2</answer>",
        "<think>I see 2 red, 1 blue.</think><answer>12</answer>",
        "<think>I see 2 red.</think>",  # no answer: cannot judge
        "<think>I see 1 red.</think><answer>1</answer>"]


def test_teacher_forced_layout_matches_a_full_forward(tiny):
    model, proc = tiny
    comps, samples = [Completion(t) for t in ROWS], [_count()] * 4
    batch = build_answer_inputs(proc, comps, samples)
    assert batch.rows == [0, 1, 3]
    P, A = batch.prefix_length, batch.answer_ids.shape[1]
    assert batch.inputs["input_ids"].shape == (3, P + A)
    assert batch.answer_mask.sum(1).tolist() == [1.0, 2.0, 1.0]  # "2", "1" "2" (digits split), "1"
    model.eval()
    with torch.no_grad():  # full logits, shifted by hand: token j of the answer is predicted at P-1+j
        logits = model(**batch.inputs).logits[:, P - 1:P - 1 + A]
    want = answer_probs(logits, batch.answer_ids, batch.answer_mask)
    got = answer_likelihoods(model, proc, comps, samples)
    assert got[2] is None
    assert_close(torch.tensor([got[0], got[1], got[3]]), want.float(), rtol=1e-4, atol=1e-7)
    # a row scored alone gives the same p as in the batch (padding does not leak)
    alone = answer_likelihoods(model, proc, [comps[1]], [samples[1]])[0]
    assert alone == pytest.approx(got[1], rel=1e-4)
    assert all(0.0 < p <= 0.95 for p in (got[0], got[1], got[3]))


def test_lora_ema_tracks_adapter_only_and_scores_under_the_reference(tiny):
    from peft import LoraConfig, get_peft_model

    model, proc = tiny
    torch.manual_seed(0)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj",
                                                                                      "v_proj", "o_proj"]))
    judge = build_judge("likelihood", decay=0.995, every=10)
    assert isinstance(judge, LikelihoodJudge)
    judge.attach(peft_model, proc)
    assert judge.ema.shadow and all("lora_" in n for n in judge.ema.shadow)
    # 2 layers x 4 projections x (A, B)
    assert len(judge.ema.shadow) == 16
    with torch.no_grad():  # "training" moves the adapter away from its zero-B start
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    comps, samples = [Completion(t) for t in ROWS], [_count()] * 4
    p_ref = judge.p_consistent(comps, samples)
    # the EMA still holds lora_B = 0, i.e. exactly the base model: same p as with the adapter disabled
    with peft_model.disable_adapter():
        p_base = answer_likelihoods(peft_model, proc, comps, samples)
    p_policy = answer_likelihoods(peft_model, proc, comps, samples)
    assert p_ref[2] is None
    for i in (0, 1, 3):
        assert p_ref[i] == pytest.approx(p_base[i], rel=1e-5)
        assert p_ref[i] != pytest.approx(p_policy[i], rel=1e-3)
    # updates only every 10 optimizer steps; then the reference moves towards the policy
    assert not judge.on_optimizer_step(peft_model, 9)
    assert judge.p_consistent(comps, samples)[0] == pytest.approx(p_ref[0], rel=1e-6)
    assert judge.on_optimizer_step(peft_model, 10)
    moved = judge.p_consistent(comps, samples)[0]
    assert moved != pytest.approx(p_ref[0], rel=1e-6)


def test_care_reward_with_likelihood_judge(tiny):
    model, proc = tiny
    reward = ConsistencyReward(variant="care", group_size=4)  # default judge for care: likelihood
    assert reward.needs_policy
    comps = [Completion(t) for t in ROWS]
    with pytest.raises(UserError, match="attach"):
        reward.score_batch(comps, [_count()] * 4)
    reward.attach_policy(model, proc)
    results = reward.score_batch(comps, [_count()] * 4)
    p = [r.parsed["p_consistent"] for r in results]
    assert p[2] is None and all(x is not None for x in (p[0], p[1], p[3]))
    # recompute the bonus from the judged p: acc (1, 0, 0, 0) -> only row 0 is accurate and it sets the
    # bar itself, so it earns 0.5 * 1
    acc = torch.tensor([1.0, 0.0, 0.0, 0.0])
    pt = torch.tensor([float("nan") if x is None else x for x in p])
    want = care_bonus(acc, pt, torch.zeros(4, dtype=torch.long))
    assert [r.score for r in results] == pytest.approx(want.tolist())
    assert [r.score for r in results] == pytest.approx([0.5, 0.0, 0.0, 0.0])
    reward.on_optimizer_step(model, 10)  # the trainer's hook: an EMA step, no error
    assert reward.judge.ema.num_updates == 1
