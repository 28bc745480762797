"""Multi-turn rollouts with tools that return images (``mmrlvr.rollout.multiturn``), on all three tiny families.

A scripted policy (tests/scripted_policy.py: forced tokens, the model's own log-probs) calls ``zoom``; the tests check
that the returned image reaches the next turn's model inputs (its pixel values, its image tokens and their place,
and the next turn's log-probs), that tool turns carry no loss while the trainer's teacher-forced log-probs equal the
sampler's, that every way a call can fail becomes a counted message the model reads, and the turn / token limits.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from PIL import Image, ImageDraw

import mmrlvr.rollout.sampling as sampling
from mmrlvr.models.loading import load_policy
from mmrlvr.rollout.base import SamplingParams
from mmrlvr.rollout.hf import HFEngine
from mmrlvr.rollout.multiturn import ToolUse, generate_multiturn
from mmrlvr.tools import TOOLS, ToolResult
from mmrlvr.tools.builtin import ZOOM_SIDE
from mmrlvr.train.model_path import resolve_model_path
from mmrlvr.types import Sample
from scripted_policy import scripted_sampler, turn_seed

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
ANSWER = "<think>seen</think><answer>3</answer>"
BOX = [0, 0, 56, 42]


def call(name="zoom", **arguments):
    arguments = arguments or {"image": 0, "box": BOX}
    return f'<think>look</think>\n<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


_MODELS: dict[str, tuple] = {}


def engine(family="qwen2_5_vl"):
    if family not in _MODELS:
        _MODELS[family] = load_policy(resolve_model_path(f"tiny:{family}"))
    model, processor = _MODELS[family]
    return HFEngine(model, processor)


def picture(seed=0):
    im = Image.new("RGB", (112, 84), "white")
    d = ImageDraw.Draw(im)
    d.rectangle([10 + seed, 8, 40, 30], fill="red")
    d.ellipse([60, 40, 100, 80], fill="blue")
    return im


def sample(image=None, sid="a"):
    return Sample(id=sid, messages=[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}],
                  images=[image or picture()], answer="3", answer_type="number")


def run(monkeypatch, eng, turns, samples=None, group_size=1, by_seed=None, **use_kwargs):
    monkeypatch.setattr(sampling, "RowSampler", scripted_sampler(eng.tokenizer, turns, by_seed))
    use = ToolUse(tools={"zoom": TOOLS.get("zoom"), "rotate": TOOLS.get("rotate"), **use_kwargs.pop("tools", {})},
                  **use_kwargs)
    batch = generate_multiturn(eng, samples or [sample()], group_size, SamplingParams(max_new_tokens=160), use,
                               seed=0, step=0)
    return batch, use


def expected_zoom(image, box):
    """The crop the zoom tool must return, computed here from PIL directly."""
    crop = image.crop(tuple(box))
    scale = ZOOM_SIDE / max(crop.size)
    return crop.resize((round(crop.size[0] * scale), round(crop.size[1] * scale)))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_zoomed_image_reaches_the_next_turn(monkeypatch, family):
    eng = engine(family)
    seen = []
    real_generate = eng.model.generate

    def spy(**kwargs):
        seen.append({k: v for k, v in kwargs.items() if k != "logits_processor"})
        return real_generate(**kwargs)

    monkeypatch.setattr(eng.model, "generate", spy)
    batch, use = run(monkeypatch, eng, [call(), ANSWER])
    turns = batch.turns[0]
    assert [t["kind"] for t in turns] == ["model", "tool", "model"]
    assert batch.completions[0].text == ANSWER  # the final model turn: what answer and format rewards read
    assert turns[1]["calls"] == [{"name": "zoom", "arguments": {"image": 0, "box": BOX}, "error": None}]
    assert use.counters["calls"] == 1 and sum(v for k, v in use.counters.items() if k != "calls") == 0

    # pixel values: the row holds the prompt image, then exactly the processor's encoding of the expected crop
    proc = eng.processor
    want = proc.image_processor(images=[expected_zoom(picture(), BOX)], return_tensors="pt")
    prompt = proc.image_processor(images=[picture()], return_tensors="pt")
    grid = batch.vision["image_grid_thw"]
    assert grid.tolist() == [prompt["image_grid_thw"][0].tolist(), want["image_grid_thw"][0].tolist()]
    n_prompt = int(prompt["image_grid_thw"].prod())
    torch.testing.assert_close(batch.vision["pixel_values"][n_prompt:], want["pixel_values"], rtol=0, atol=0)
    assert batch.row_images[0][1].size == expected_zoom(picture(), BOX).size

    # image tokens: the returned image's placeholders sit inside the tool turn, one per merged patch
    pad = eng.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    merge = proc.image_processor.merge_size ** 2
    P = batch.prompt_length
    positions = (batch.response_ids[0] == pad).nonzero().flatten().tolist()
    assert len(positions) == int(want["image_grid_thw"].prod()) // merge
    assert all(turns[1]["start"] <= p < turns[1]["end"] for p in positions)
    assert int((batch.input_ids[0, :P] == pad).sum()) == n_prompt // merge
    assert batch.images_per_row(eng.tokenizer.convert_tokens_to_ids("<|vision_start|>")) == [2]

    # the second model turn's generate call carries the returned image (features of it alone) and all grids
    assert len(seen) == 2
    second = seen[1]
    assert second["image_grid_thw"].tolist() == grid.tolist()
    assert int((second["input_ids"] == pad).sum()) == int((batch.input_ids[0] == pad).sum())  # the whole history
    if "mm_encoder_outputs" in second:
        from mmrlvr.models.cache_arg import continues_with_new_images

        pooled = second["mm_encoder_outputs"]["image"].pooler_output
        if continues_with_new_images(eng.model):  # on top of the cache: the returned image's features alone
            assert len(pooled) == 1 and pooled[0].shape[0] == len(positions)
        else:  # transformers 5.19: the whole history again, both images
            assert len(pooled) == 2 and pooled[1].shape[0] == len(positions)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_next_turn_reads_the_returned_image(monkeypatch, family):
    """Same script, a different picture inside the zoom box: the answer turn's log-probs change; a different
    picture outside it (not returned by the zoom, only in the prompt at low resolution) changes them too, but the
    tool turn's own image tokens are what differ in the first case."""
    eng = engine(family)
    a, _ = run(monkeypatch, eng, [call(), ANSWER], samples=[sample(picture(0))])
    b, _ = run(monkeypatch, eng, [call(), ANSWER], samples=[sample(picture(6))])
    last = lambda batch: batch.old_logprobs[0, batch.turns[0][2]["start"]:batch.turns[0][2]["end"]]  # noqa: E731
    assert not torch.allclose(last(a), last(b))
    n_prompt = int(a.vision["image_grid_thw"][0].prod())
    assert not torch.equal(a.vision["pixel_values"][n_prompt:], b.vision["pixel_values"][n_prompt:])


@pytest.mark.parametrize("family", FAMILIES)
def test_tool_turns_carry_no_loss_and_the_trainer_recomputes_the_samplers_logprobs(monkeypatch, family):
    """Rows of different shapes in one batch: turns of different lengths (padding between a short turn and its tool
    turn), different tools (images of different sizes), a row that answers at once and one cut by the budget."""
    from mmrlvr.train.forward import token_logprobs

    eng = engine(family)
    by_seed = {
        turn_seed("a", 0, 0): call(),
        turn_seed("a", 0, 1): call("rotate", image=1, degrees=90),
        turn_seed("a", 1, 0): "<think>look look look again</think>\n" + call()[len("<think>look</think>\n"):],
        turn_seed("a", 1, 1): ANSWER,
        turn_seed("b", 0, 0): ANSWER,  # answers without a tool
        turn_seed("b", 1, 0): call("rotate", image=0, degrees=45),
        turn_seed("b", 1, 1): "<think>" + "long " * 60 + "</think>",  # runs out of max_new_tokens: finish length
    }
    batch, _ = run(monkeypatch, eng, [ANSWER], samples=[sample(picture(0), "a"), sample(picture(3), "b")],
                   group_size=2, by_seed=by_seed, max_tokens=1000)
    assert batch.num_rows == 4
    kinds = [[t["kind"] for t in turns] for turns in batch.turns]
    assert kinds == [["model", "tool", "model", "tool", "model"], ["model", "tool", "model"], ["model"],
                     ["model", "tool", "model"]]
    assert [c.finish_reason for c in batch.completions] == ["stop", "stop", "stop", "length"]
    P = batch.prompt_length
    padded = 0
    for i, turns in enumerate(batch.turns):
        for t in turns:
            span = batch.response_mask[i, t["start"]:t["end"]]
            assert bool((span == (1.0 if t["kind"] == "model" else 0.0)).all()), t
            assert bool((batch.attention_mask[i, P + t["start"]:P + t["end"]] == 1).all())
        between = [(a["end"], b["start"]) for a, b in zip(turns, turns[1:])]
        padded += sum(b - a for a, b in between)
        for a, b in between:  # padding between turns: no attention, no loss
            assert int(batch.attention_mask[i, P + a:P + b].sum()) == 0 and float(batch.response_mask[i, a:b].sum()) == 0
        assert float(batch.response_mask[i, turns[-1]["end"]:].sum()) == 0
    assert padded > 0  # the batch really held turns of different lengths
    assert batch.images_per_row(eng.tokenizer.convert_tokens_to_ids("<|vision_start|>")) == [3, 2, 1, 2]
    eng.model.eval()
    with torch.no_grad():
        lp, _ = token_logprobs(eng.model, batch.model_inputs(), batch.response_ids)
    mask = batch.response_mask > 0
    assert int(mask.sum()) > 100
    diff = (lp - batch.old_logprobs)[mask].abs().max()
    assert float(diff) < 1e-5, float(diff)


def test_every_failed_call_is_a_counted_message_the_model_reads(monkeypatch):
    eng = engine()

    def boom(image: int, context=None) -> str:
        """Always fails.

        Args:
            image: an image index
        """
        raise RuntimeError("disk on fire")

    def slow(image: int) -> str:
        """Never in time.

        Args:
            image: an image index
        """
        time.sleep(3)
        return "late"

    def huge(image: int) -> Image.Image:
        """Too big.

        Args:
            image: an image index
        """
        return Image.new("RGB", (2000, 2000))

    def sliver(image: int) -> Image.Image:
        """Past the processor's 200:1 aspect limit.

        Args:
            image: an image index
        """
        return Image.new("RGB", (300, 1))

    def empty(image: int) -> Image.Image:
        """No pixels at all.

        Args:
            image: an image index
        """
        return Image.new("RGB", (0, 0))

    def array(image: int) -> list:
        """An array where an image belongs.

        Args:
            image: an image index
        """
        return ["here", __import__("numpy").zeros((8, 8, 3), dtype="uint8")]

    scripts = [
        "<tool_call>\n{not json}\n</tool_call>",  # malformed_call
        call("crop", image=0),  # unknown_tool
        call("zoom", image=0),  # bad_arguments (no box)
        call("boom", image=0),  # tool_error
        call("slow", image=0),  # timeout
        call("huge", image=0),  # image_too_large
        call("zoom", image=7, box=BOX),  # tool_error: no such image
        call("sliver", image=0),  # bad_image: the processor refuses it
        call("empty", image=0),  # bad_image
        call("array", image=0),  # bad_image: not a PIL image
        ANSWER,
    ]
    batch, use = run(monkeypatch, eng, scripts, max_turns=11, max_tokens=6000, time_budget_s=0.5,
                     tools={"boom": boom, "slow": slow, "huge": huge, "sliver": sliver, "empty": empty, "array": array})
    tool_turns = [t for t in batch.turns[0] if t["kind"] == "tool"]
    kinds = ["malformed_call", "unknown_tool", "bad_arguments", "tool_error", "timeout", "image_too_large",
             "tool_error", "bad_image", "bad_image", "bad_image"]
    assert [t["calls"][0]["error"].split(":")[0] for t in tool_turns] == kinds
    for t, kind in zip(tool_turns, kinds):
        assert f"Error ({kind})" in t["text"] and t["images"] == []
    assert "the tools are: array, boom, empty, huge, rotate, sliver, slow, zoom" in tool_turns[1]["text"]
    assert "aspect ratio" in tool_turns[7]["text"] and "ndarray, not a PIL image" in tool_turns[9]["text"]
    assert dict(use.counters) == {"calls": 10, "malformed_call": 1, "unknown_tool": 1, "bad_arguments": 1,
                                  "tool_error": 2, "timeout": 1, "image_too_large": 1, "bad_image": 3}
    assert batch.completions[0].finish_reason == "stop" and "3" in batch.completions[0].text
    assert batch.vision["image_grid_thw"].shape[0] == 1  # no failed call added an image


def test_a_zoom_into_a_one_pixel_strip_of_a_large_scene_is_a_message_not_a_crash(monkeypatch):
    """Seen in a zoom study: a box 1 px tall across an 896-px scene came back 224x1, which Qwen's image processor
    refuses (aspect over 200) while encoding the tool turn — the whole run died. Now the call is a bad_image error."""
    eng = engine()
    scene = Image.new("RGB", (896, 672), "white")
    batch, use = run(monkeypatch, eng, [call("zoom", image=0, box=[0, 300, 896, 301]), ANSWER],
                     samples=[sample(scene)])
    tool = [t for t in batch.turns[0] if t["kind"] == "tool"][0]
    assert tool["calls"][0]["error"].startswith("bad_image") and "Error (bad_image)" in tool["text"]
    assert dict(use.counters) == {"calls": 1, "bad_image": 1}
    assert batch.completions[0].finish_reason == "stop" and batch.vision["image_grid_thw"].shape[0] == 1


def test_turn_and_token_limits(monkeypatch):
    eng = engine()
    one, _ = run(monkeypatch, eng, [call(), ANSWER], max_turns=1)
    assert [t["kind"] for t in one.turns[0]] == ["model"] and one.completions[0].finish_reason == "turns"
    short, _ = run(monkeypatch, eng, [call(), ANSWER], max_tokens=120)  # the call fits, its tool turn does not
    assert [t["kind"] for t in short.turns[0]] == ["model"] and short.completions[0].finish_reason == "length"
    assert short.response_ids.shape[1] <= 120
    cut, _ = run(monkeypatch, eng, [call(), ANSWER], max_tokens=30)  # the call itself is cut
    assert cut.completions[0].finish_reason == "length" and cut.response_ids.shape[1] == 30


def test_a_row_s_tool_arguments_fill_what_the_call_leaves_out(monkeypatch):
    eng = engine()
    s = sample()
    s.meta["tools_kwargs"] = {"zoom": {"box": BOX}}  # verl's extra_info.tools_kwargs layout
    batch, use = run(monkeypatch, eng, [call("zoom", image=0), ANSWER], samples=[s])
    assert batch.turns[0][1]["calls"][0]["error"] is None and len(batch.row_images[0]) == 2


LONG = "<think>" + "count count " * 60 + "</think><answer>3</answer>"  # longer than one turn's token budget
SUMMARY = "<think>So far: 3 red.</think>"


def test_resum_completes_a_trajectory_longer_than_its_budget_and_the_summary_replaces_the_history(monkeypatch):
    from mmrlvr.rollout.multiturn import Summarize
    from mmrlvr.train.forward import token_logprobs

    eng = engine()
    by_seed = {turn_seed("a", 0, 0): LONG, turn_seed("a", 0, 1): SUMMARY}
    plain, _ = run(monkeypatch, eng, [LONG], by_seed=by_seed, max_tokens=1000)
    assert plain.completions[0].finish_reason == "length" and "<answer>" not in plain.completions[0].text

    by_seed[turn_seed("a/segment1", 0, 0)] = ANSWER  # the restarted segment answers at once
    monkeypatch.setattr(sampling, "RowSampler", scripted_sampler(eng.tokenizer, [LONG], by_seed))
    use = ToolUse(tools={"zoom": TOOLS.get("zoom")}, max_turns=4, max_tokens=1000)
    summarize = Summarize(at_tokens=10_000)  # only a turn that runs out of tokens triggers it here
    batch = generate_multiturn(eng, [sample()], 1, SamplingParams(max_new_tokens=64), use, seed=0, step=0,
                               summarize=summarize)
    assert batch.num_rows == 2 and batch.trajectory_index.tolist() == [0, 0]
    assert batch.final_segment.tolist() == [False, True]
    first, second = batch.turns
    assert [t["kind"] for t in first] == ["model", "user", "summary"] and [t["kind"] for t in second] == ["model"]
    assert first[2]["text"] == SUMMARY
    # both segments are scored on the trajectory's answer: every segment trains with its final reward
    assert [c.text for c in batch.completions] == [ANSWER, ANSWER]
    assert [c.finish_reason for c in batch.completions] == ["summarized", "stop"]
    # the second segment's inputs: the prompt and the summary, not the history it replaces
    P = batch.prompt_length
    tok = eng.tokenizer
    second_prompt = tok.decode(batch.input_ids[1, :P][batch.attention_mask[1, :P] > 0])
    assert "So far: 3 red." in second_prompt and "count count" not in second_prompt
    assert second_prompt.count("<|vision_start|>") == 1  # the prompt's image, once
    first_text = tok.decode(batch.input_ids[0][batch.attention_mask[0] > 0])
    assert "count count" in first_text and "Summarise your progress" in first_text
    # the request is masked; the summary and the cut turn carry loss; the sampler's log-probs are the trainer's
    req = first[1]
    assert float(batch.response_mask[0, req["start"]:req["end"]].sum()) == 0
    assert bool((batch.response_mask[0, first[2]["start"]:first[2]["end"]] == 1).all())
    eng.model.eval()
    with torch.no_grad():
        lp, _ = token_logprobs(eng.model, batch.model_inputs(), batch.response_ids)
    mask = batch.response_mask > 0
    assert float((lp - batch.old_logprobs)[mask].abs().max()) < 1e-5


def test_resum_summarises_when_the_context_reaches_at_tokens(monkeypatch):
    from mmrlvr.rollout.multiturn import Summarize

    eng = engine()
    by_seed = {turn_seed("a", 0, 0): call(), turn_seed("a", 0, 1): SUMMARY, turn_seed("a/segment1", 0, 0): ANSWER}
    monkeypatch.setattr(sampling, "RowSampler", scripted_sampler(eng.tokenizer, [ANSWER], by_seed))
    use = ToolUse(tools={"zoom": TOOLS.get("zoom")}, max_turns=4, max_tokens=2000)
    batch = generate_multiturn(eng, [sample()], 1, SamplingParams(max_new_tokens=160), use, seed=0, step=0,
                               summarize=Summarize(at_tokens=100))  # the prompt and the call pass 100 tokens
    first, second = batch.turns
    # the call wanted a tool, but the context was full: summarise instead; the zoom never ran
    assert [t["kind"] for t in first] == ["model", "user", "summary"] and use.counters["calls"] == 0
    assert batch.completions[1].finish_reason == "stop" and batch.completions[0].text == ANSWER


def test_vllm_continuation_requests_place_every_image_where_the_hf_sequence_has_it(monkeypatch):
    """The next turn's vLLM request carries the HF trajectory's tokens with one placeholder per image, and the images
    in order; expanding each placeholder by its image's grid gives back the HF sequence exactly."""
    from mmrlvr.rollout.vllm import continuation_request

    eng = engine()
    batch, _ = run(monkeypatch, eng, [call(), call("rotate", image=1, degrees=90), ANSWER])
    turns = batch.turns[0]
    P = batch.prompt_length
    third = turns[4]["start"]  # the answer turn: everything before it is what the request must carry
    real = batch.attention_mask[0, :P + third] > 0
    ids = batch.input_ids[0, :P + third][real].tolist()
    images = batch.row_images[0]
    pad = eng.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    req = continuation_request(ids, images, pad, SamplingParams(max_new_tokens=16), seed=3,
                               stop_token_ids=eng.eos_ids)
    prompt = req["prompt"]
    assert prompt["multi_modal_data"]["image"] == images and len(images) == 3
    collapsed = prompt["prompt_token_ids"]
    assert sum(1 for t in collapsed if t == pad) == 3
    merge = eng.processor.image_processor.merge_size ** 2
    sizes = iter((batch.vision["image_grid_thw"].prod(-1) // merge).tolist())
    expanded = [x for t in collapsed for x in ([pad] * next(sizes) if t == pad else [t])]
    assert expanded == ids
    assert req["sampling"]["seed"] == 3 and req["sampling"]["stop_token_ids"] == eng.eos_ids
    with pytest.raises(Exception, match="2 images"):
        continuation_request(ids, images[:2], pad, SamplingParams(), seed=0)


def test_vision_credit_perturbs_every_image_the_trajectory_saw_and_credits_only_model_tokens(monkeypatch):
    """What an "image" is for the vision-sensitive credit schemes on a multi-turn row: every image in the sequence
    (the prompt's and each one a tool returned), all perturbed in the counterfactual pass; tool turns have no
    signal and no credit (they carry no loss)."""
    from mmrlvr.credit import perturb_vision, token_signals_from_model
    from mmrlvr.credit.schemes import build_scheme

    eng = engine()
    batch, _ = run(monkeypatch, eng, [call(), ANSWER], group_size=2)
    grid = batch.vision["image_grid_thw"]
    assert grid.shape[0] == 4  # two rows, each the prompt image and a zoom
    pert = perturb_vision(batch.vision, "gaussian", seed=0, processor=eng.processor)
    blocks = torch.split(batch.vision["pixel_values"], grid.prod(-1).tolist())
    changed = [not torch.equal(a, b) for a, b in zip(blocks, torch.split(pert["pixel_values"], grid.prod(-1).tolist()))]
    assert changed == [True, True, True, True]
    eng.model.eval()
    inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
    signals = token_signals_from_model(eng.model, {**inputs, **batch.vision}, {**inputs, **pert}, batch.prompt_length,
                                       batch.response_ids, batch.response_mask, old_logprobs=batch.old_logprobs)
    tool = batch.turns[0][1]
    assert float(signals.jsd[0, tool["start"]:tool["end"]].abs().sum()) == 0  # no signal on the tool turn
    assert float(signals.jsd[0, batch.turns[0][2]["start"]:batch.turns[0][2]["end"]].sum()) > 0  # the answer reads it
    scheme = build_scheme("vepo")
    credit = scheme(signals, batch.response_mask.clone(), torch.tensor([1.0, -1.0]), old_logprobs=batch.old_logprobs)
    weights = batch.response_mask * credit.token_weights
    assert float(weights[0, tool["start"]:tool["end"]].abs().sum()) == 0


def test_consistency_reads_the_final_turn(monkeypatch):
    """The inconsistency rate and the answer span read the final thinking and answer, not the earlier turns."""
    from mmrlvr.consistency.metrics import score_completions
    from mmrlvr.consistency.spans import answer_token_mask

    eng = engine()
    inconsistent = "<think>I see 2 red.</think><answer>3</answer>"
    batch, _ = run(monkeypatch, eng, ["<think>I see 3 red.</think>\n" + call()[len("<think>look</think>\n"):],
                                      inconsistent])
    assert batch.completions[0].text == inconsistent
    m = score_completions(batch.completions, batch.samples)
    assert m["inconsistency_rate"] == 1.0  # "2" in the final thinking vs "3" answered (the first turn said 3)
    mask = answer_token_mask([c.text for c in batch.completions], batch.response_ids, batch.response_mask,
                             eng.tokenizer)
    marked = mask[0].nonzero().flatten().tolist()
    last = batch.turns[0][2]
    assert marked and all(last["start"] <= j < last["end"] for j in marked)
    assert "3" in eng.tokenizer.decode(batch.response_ids[0, marked].tolist())


def test_a_verl_row_s_tools_kwargs_reach_the_sample(tmp_path):
    """verl's ``extra_info.tools_kwargs`` ({tool: {create_kwargs, execute_kwargs}}) is read into
    ``sample.meta["tools_kwargs"]``, what the tools get; a malformed one names the row and field."""
    from mmrlvr.data import load_samples

    picture().save(tmp_path / "p.png")
    rows = [{"prompt": [{"role": "user", "content": "<image>How many?"}], "images": ["p.png"],
             "reward_model": {"ground_truth": "3"}, "data_source": "zoomy",
             "extra_info": {"index": i, "tools_kwargs": tk}}
            for i, tk in enumerate([{"zoom": {"create_kwargs": {"coords": "normalized_1000"}, "execute_kwargs": {}}},
                                    {"zoom": "not an object"}])]
    path = tmp_path / "train.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    samples, report = load_samples(str(path), preset="verl", on_error="skip")
    assert samples[0].meta["tools_kwargs"] == {"zoom": {"coords": "normalized_1000"}}
    assert len(report.skipped) == 1 and report.skipped[0].field == "tools_kwargs"
    assert "zoom" in report.skipped[0].message


def test_a_plug_in_tool_is_offered_by_name_and_runs(monkeypatch, tmp_path):
    from mmrlvr.config import load_config
    from mmrlvr.plugins import load_plugins
    from mmrlvr.train.stages.generate import MultiTurnRollouts

    plugin = tmp_path / "crop_top_tool.py"
    plugin.write_text('''from mmrlvr.tools import ToolResult, register_tool


@register_tool()
def crop_top(image: int, rows: int, context=None) -> ToolResult:
    """Keep the top of an image.

    Args:
        image: image index
        rows: how many pixel rows to keep
    """
    src = context.images[image]
    return ToolResult(text=f"top {rows} rows", images=[src.crop((0, 0, src.width, rows))])
''')
    load_plugins([str(plugin)])
    cfg = load_config(ROOT / "configs" / "demo-tiny.yaml", [f"plugins=[{plugin}]", "rollout.tools=[crop_top, zoom]"])
    assert MultiTurnRollouts.validate(cfg) == []
    eng = engine()
    batch, use = run(monkeypatch, eng, [call("crop_top", image=0, rows=20), ANSWER],
                     tools={"crop_top": TOOLS.get("crop_top")})
    assert batch.turns[0][1]["calls"][0]["error"] is None and batch.row_images[0][1].size == (112, 20)
