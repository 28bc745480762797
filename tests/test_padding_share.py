"""tokens/padding_share: the padded share of the reference, credit and update passes, counted at the language
model's input for every call a pass makes, equals the share worked out from the step's own masks — with and
without prefix sharing, on the three Qwen-VL families — and a pass's calls are told apart by the stage running."""

from __future__ import annotations

import pytest
import torch

from analysis_helpers import FAST_RUN
from mmrlvr.config import load_config
from mmrlvr.train.padding import PaddingMeter, in_stage
from mmrlvr.train.trainer import Trainer


def _step(tmp_path, model: str, *overrides: str):
    cfg = load_config("configs/demo-tiny.yaml", [f"output_dir={tmp_path}", f"model.path={model}", *FAST_RUN,
                                                 "rollout.max_new_tokens=24", *overrides])
    trainer = Trainer(cfg)
    batch = trainer.pipeline.run(0)
    return trainer, batch


def _expected(batch, prefix_shared: bool) -> float:
    r = batch.rollouts
    mask = r.attention_mask
    width = r.response_mask.shape[1]
    prompt, response = mask[:, :-width], mask[:, -width:]
    if not prefix_shared:
        return 1.0 - float(mask.sum()) / mask.numel()
    # each group's prompt runs once; its responses run on the prompt's cache, fed all but the last response token
    # (whose logits would predict past the end)
    starts = [s.start for s in r.group_slices()]
    fed = response[:, :-1]
    real = float(prompt[starts].sum() + fed.sum())
    return 1.0 - real / (len(starts) * prompt.shape[1] + fed.numel())


@pytest.mark.parametrize("shared", [True, False])
def test_the_logged_share_is_the_masks_share(tmp_path, shared):
    trainer, batch = _step(tmp_path, "tiny:qwen2_5_vl:warm", f"model.prefix_sharing={str(shared).lower()}")
    m = batch.logged
    want = _expected(batch, shared)
    assert 0.0 < want < 1.0  # ragged responses (the warm start stops at different lengths): the check's premise
    assert m["tokens/padding_share/update"] == pytest.approx(want, abs=1e-9)
    assert m["tokens/padding_share/reference"] == pytest.approx(want, abs=1e-9)
    assert m["tokens/padding_share"] == pytest.approx(want, abs=1e-9)
    assert "tokens/padding_share/credit" not in m  # no credit scheme: no credit pass


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_each_family_is_counted_at_its_language_model(family):
    """A padded two-row batch (prompts of different lengths, an image each) through the real model class: the hook
    sits on the family's language model and reads the mask the backbone hands it."""
    from PIL import Image
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from mmrlvr.train.model_path import resolve_model_path

    folder = resolve_model_path(f"tiny:{family}")
    processor = AutoProcessor.from_pretrained(folder)
    model = AutoModelForImageTextToText.from_pretrained(folder).eval()
    texts = [processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": t}]}],
                                           add_generation_prompt=True) for t in ("red?", "how many blue shapes are there?")]
    processor.tokenizer.padding_side = "left"
    image = Image.new("RGB", (56, 56), (200, 30, 30))
    inputs = processor(text=texts, images=[image, image], padding=True, return_tensors="pt")
    mask = inputs["attention_mask"]
    assert 0 < int((mask == 0).sum())  # the premise: one row is padded
    meter = PaddingMeter().attach(model)
    with torch.no_grad(), in_stage("update"):
        model(**inputs)
    metrics = meter.take()
    assert metrics["tokens/padding_share/update"] == pytest.approx(1.0 - float(mask.sum()) / mask.numel())
    assert metrics["tokens/padding_share/update"].n == mask.numel()


def test_a_credit_schemes_perturbed_pass_is_its_own_line(tmp_path):
    trainer, batch = _step(tmp_path, "tiny:qwen2_5_vl:warm", "credit.scheme=vppo")
    m = batch.logged
    # the perturbed pass encodes each group's prompt once, as the update does with prefix sharing
    assert m["tokens/padding_share/credit"] == pytest.approx(_expected(batch, True), abs=1e-9)
    assert m["tokens/padding_share"] == pytest.approx(_expected(batch, True), abs=1e-9)


def test_calls_outside_a_training_pass_and_unmasked_calls():
    lm = torch.nn.Linear(4, 4)
    meter = PaddingMeter().attach(lm)
    x = torch.zeros(2, 5, 4)
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 0, 0]])

    def call(**kw):  # the language model's keyword call, as the Qwen-VL backbone makes it
        lm.forward = lambda *a, **k: None
        lm(**kw)

    call(inputs_embeds=x, attention_mask=mask)  # no stage: generation, evaluation
    with in_stage("generate"):
        call(inputs_embeds=x, attention_mask=mask)
    assert meter.take() == {}
    with in_stage("update"):
        call(inputs_embeds=x, attention_mask=mask)  # 7 of 10 real
        call(inputs_embeds=x[:, -2:], attention_mask=mask)  # a cached call: the last 2 positions, 2 of 4 real
    with in_stage("reference"):
        call(inputs_embeds=x)  # no mask: all real
    metrics = meter.take()
    assert metrics["tokens/padding_share/update"] == pytest.approx(1 - 9 / 14)
    assert metrics["tokens/padding_share/reference"] == 0.0
    assert metrics["tokens/padding_share"] == pytest.approx(1 - 19 / 24)
    assert {k: (v.kind, v.n) for k, v in metrics.items()} == {
        "tokens/padding_share/update": ("mean", 14.0), "tokens/padding_share/reference": ("mean", 10.0),
        "tokens/padding_share": ("mean", 24.0)}
    assert meter.take() == {}  # reset
    meter.detach()


def test_several_processes_combine_to_the_global_batchs_share():
    """Each rank's share is weighted by the positions it computed (carried by the metric), not by its rows."""
    from mmrlvr.metric import Metric, combine

    rank0 = {"tokens/padding_share": Metric.mean(0.5, n=10), "reward/mean": Metric.mean(0.0, n=6)}  # 5 of 10 padded
    rank1 = {"tokens/padding_share": Metric.mean(0.0, n=30), "reward/mean": Metric.mean(0.0, n=2)}  # 0 of 30
    assert combine([rank0, rank1])["tokens/padding_share"] == pytest.approx(5 / 40)
