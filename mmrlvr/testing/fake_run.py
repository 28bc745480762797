"""A synthetic run folder for tests, demos and benchmarks — NOT real training output.

``make_fake_run`` writes what a training run writes (``config.yaml``, ``metrics.jsonl``, per-step rollout
shards, content-addressed images) through the real ``RolloutWriter`` and ``ImageStore``, with made-up but
realistically shaped content: images of coloured shapes, counting and grounding prompts, responses in
``<think>…</think><answer>…</answer>`` form (some inconsistent, some truncated), reward components,
rubric criteria, group advantages and per-token signals. With ``video_groups`` it adds video prompts
whose sampled frames are stored like a training run stores them (``extra["video_frames"]``). Nothing here comes from a model; the numbers are
random draws shaped like the real ones, so the inspector and the store can be exercised without
training anything.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from mmrlvr.boxes import iou
from mmrlvr.store.atomic import atomic_write_text
from mmrlvr.store.images import VIDEO_FRAMES_KEY, ImageStore
from mmrlvr.store.reader import METRICS_FILE
from mmrlvr.store.record import RolloutRecord
from mmrlvr.store.writer import RolloutWriter

COLOURS = {"red": (220, 40, 40), "blue": (40, 80, 220), "green": (40, 170, 70), "yellow": (230, 200, 30)}
_TOKEN_RE = re.compile(r"<[^<>]{1,20}>|\s?\w+|\s?[^\w\s]|\s+")
#: a hostile response (only when include_hostile=True) to check that the inspector shows text as text
HOSTILE_TEXT = ("<think>**bold?** <script>alert('x')</script> <img src=x onerror=alert(1)> # heading "
                "[link](javascript:alert(2)) ${7*7} {{7*7}}</think><answer>1</answer>")
_SCRIPT_AT = HOSTILE_TEXT.index("<script>")  # the hostile conclusion span covers the script tag
FILLER = [" Let me look at the image carefully.", " I check each shape one by one.",
          " The shapes do not overlap.", " I count again to be sure.", " Colours are easy to tell apart here."]


def tokenize(text: str) -> list[str]:
    """A toy tokenizer whose tokens concatenate back to ``text`` exactly (like byte-level BPE)."""
    tokens = _TOKEN_RE.findall(text)
    assert "".join(tokens) == text, "fake tokenizer must be lossless"
    return tokens


def _draw_scene(rng: np.random.Generator, size: int) -> tuple[Image.Image, list[tuple[str, list[float]]]]:
    img = Image.new("RGB", (size, size), (245, 245, 240))
    draw = ImageDraw.Draw(img)
    shapes: list[tuple[str, list[float]]] = []
    for _ in range(int(rng.integers(1, 5))):
        colour = str(rng.choice(list(COLOURS)))
        w, h = (int(v) for v in rng.integers(size // 8, size // 3, size=2))
        x, y = int(rng.integers(0, size - w)), int(rng.integers(0, size - h))
        box = [float(x), float(y), float(x + w), float(y + h)]
        if rng.random() < 0.5:
            draw.rectangle(box, fill=COLOURS[colour])
        else:
            draw.ellipse(box, fill=COLOURS[colour])
        shapes.append((colour, box))
    return img, shapes


def _response(rng: np.random.Generator, task: str, target: str, shapes: list[tuple[str, list[float]]],
              filler: int) -> tuple[str, str, list[list[float]], str, bool]:
    """(text, parsed answer, parsed boxes, conclusion, thinking_correct)."""
    true_count = sum(c == target for c, _ in shapes)
    pad = "".join(rng.choice(FILLER) for _ in range(filler))
    if task == "count":
        seen = true_count if rng.random() < 0.7 else int(rng.integers(0, 4))
        answer = seen if rng.random() < 0.8 else int(rng.integers(0, 4))  # sometimes inconsistent
        conclusion = str(seen)
        text = f"<think>{pad} I see {seen} {target}.</think><answer>{answer}</answer>"
        return text, str(answer), [], conclusion, seen == true_count
    boxes = [b for c, b in shapes if c == target] or [shapes[0][1]]
    gt = boxes[0]
    jitter = rng.normal(0, 4 if rng.random() < 0.7 else 20, size=4)
    pred = [float(np.clip(v + j, 0, 10_000)) for v, j in zip(gt, jitter)]
    pred = [min(pred[0], pred[2] - 1), min(pred[1], pred[3] - 1), pred[2], pred[3]]
    box_text = "[" + ", ".join(f"{v:.0f}" for v in pred) + "]"
    where = "left" if gt[0] < 56 else "right"
    text = f"<think>{pad} The {target} shape is on the {where}.</think><answer>{box_text}</answer>"
    return text, box_text, [pred], where, True


def make_fake_run(run_dir: str | os.PathLike[str], steps: int = 3, groups: int = 4, group_size: int = 4,
                  seed: int = 0, *, image_size: int = 112, filler_sentences: tuple[int, int] = (0, 3),
                  include_hostile: bool = False, run_id: str | None = None, video_groups: int = 0,
                  video_frames: int = 8, video_fps: float | None = 2.0) -> Path:
    """Write a synthetic run (see module docstring) to ``run_dir`` and return its path.

    Prompt ``p{g:05d}`` is the same question and image at every step (so the across-step view has
    something to show); its responses change from step to step. With ``include_hostile`` the response of
    step 0, group 0, sample 1 is ``HOSTILE_TEXT`` (script tags, markdown) for escaping tests.

    ``video_groups`` adds that many video prompts ``v{g:05d}`` after the image prompts of every step ("How
    many frames show a red shape?"), each a clip of ``video_frames`` frames and no image, with the
    sampling fps in ``extra["video_fps"]`` (left out when ``video_fps`` is None). They draw from their own
    random stream, so the image prompts' records are the same with or without them.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    run_id = run_id or run_dir.name
    rng = np.random.default_rng(seed)
    images = ImageStore(run_dir)
    prompts = []
    for g in range(groups):
        img, shapes = _draw_scene(rng, image_size)
        task = "count" if g % 2 == 0 else "ground"
        target = shapes[int(rng.integers(0, len(shapes)))][0]
        question = (f"How many {target} shapes are there?" if task == "count"
                    else f"Give the bounding box of the {target} shape as [x1, y1, x2, y2].")
        true_count = sum(c == target for c, _ in shapes)
        gt_boxes = [b for c, b in shapes if c == target]
        prompts.append(dict(id=f"p{g:05d}", task=task, target=target, shapes=shapes, question=question,
                            image=images.put(img), answer=str(true_count) if task == "count" else json.dumps(gt_boxes[0]),
                            gt_boxes=gt_boxes))
    vrng = np.random.default_rng([seed, 1])  # video prompts: a stream of their own (see docstring)
    prompts_v = [_video_prompt(vrng, g, images, image_size // 2, video_frames, video_fps) for g in range(video_groups)]
    atomic_write_text(run_dir / "config.yaml",
                      f"# synthetic run written by mmrlvr.testing.fake_run.make_fake_run (seed {seed})\n"
                      f"seed: {seed}\nrollout:\n  group_size: {group_size}\nsynthetic: true\n")
    metrics_lines = []
    with RolloutWriter(run_dir, run_id) as writer:
        for step in range(steps):
            records = []
            skill = min(0.9, 0.3 + 0.6 * step / max(steps - 1, 1))  # responses get better with steps
            for g, p in enumerate(prompts):
                group = [_fake_record(rng, run_id, step, p, i, group_size, skill, filler_sentences)
                         for i in range(group_size)]
                if include_hostile and step == 0 and g == 0 and group_size > 1:
                    _make_hostile(group[1])
                _set_advantages(group)
                records.extend(group)
            for p in prompts_v:
                group = [_fake_record(vrng, run_id, step, p, i, group_size, skill, filler_sentences)
                         for i in range(group_size)]
                _set_advantages(group)
                records.extend(group)
            writer.write_step(step, records)
            metrics_lines.append(json.dumps(_step_metrics(step, records)))
    atomic_write_text(run_dir / METRICS_FILE, "\n".join(metrics_lines) + "\n")
    return run_dir


def _fake_record(rng: np.random.Generator, run_id: str, step: int, p: dict, i: int, group_size: int,
                 skill: float, filler: tuple[int, int]) -> RolloutRecord:
    text, parsed, pred_boxes, conclusion, thinking_ok = _response(
        rng, p["task"], p["target"], p["shapes"], int(rng.integers(filler[0], filler[1] + 1)))
    finish = "stop"
    if rng.random() < 0.05:  # truncated at max_new_tokens
        text, parsed, pred_boxes, finish = text[: max(10, len(text) // 2)], "", [], "length"
    tokens = tokenize(text)
    n = len(tokens)
    format_ok = float(finish == "stop")
    if p["task"] == "count":
        acc = float(parsed == p["answer"] and rng.random() < skill + 0.3)
        comps = {"format": format_ok, "accuracy": acc}
        gt_boxes: list[list[float]] = []
    else:
        overlap = iou(pred_boxes[0], p["gt_boxes"][0]) if pred_boxes else 0.0
        comps = {"format": format_ok, "iou": round(overlap, 4)}
        acc = float(overlap >= 0.5)
        gt_boxes = p["gt_boxes"]
    answer_correct = bool(acc)
    m = re.search(r"<answer>(.*?)</answer>", text)
    consistent = bool(m) and (p["task"] != "count" or m.group(1) == conclusion)
    comps["consistency"] = float(consistent)
    reward = float(sum(comps.values()) / len(comps))
    span_at = text.find(conclusion, text.find("I see") if "I see" in text else 0)
    # per-token signals, shaped like the real ones
    is_content = np.array([bool(re.search(r"\d|red|blue|green|yellow|left|right", t)) for t in tokens])
    logprob = -rng.exponential(0.6, n) - 2.0 * is_content * rng.random(n)
    entropy = np.abs(rng.normal(0.8, 0.5, n)) + 1.5 * is_content * rng.random(n)
    vision = np.abs(rng.normal(0.05, 0.05, n)) + is_content * rng.uniform(0.5, 2.0, n)
    cut = np.quantile(vision, 0.8) if n else 0.0
    credit = (vision >= cut).astype(np.float32)
    ratio = np.exp(rng.normal(0.0, 0.08, n))
    rubric = []
    if p["task"] == "ground":
        rubric = [
            {"id": "box_tight", "text": "The box tightly encloses the target shape", "category": "grounding",
             "verdict": "pass" if comps["iou"] >= 0.5 else "fail", "score": float(comps["iou"] >= 0.5),
             "weight": 2.0, "rationale": f"IoU {comps['iou']:.2f} against the reference box", "judge": "verifier"},
            {"id": "names_side", "text": "The thinking says which side the shape is on", "category": "reasoning",
             "verdict": "pass" if "shape is on" in text else "unknown", "score": 1.0 if "shape is on" in text else None,
             "weight": 1.0, "rationale": "mentions the side" if "shape is on" in text else "judge output unparseable",
             "judge": "local-judge"},
        ]
    return RolloutRecord(
        run_id=run_id, step=step, prompt_id=p["id"], sample_index=i, group_size=group_size,
        prompt_text=p["question"], image_refs=[p["image"]] if p.get("image") else [], response_text=text,
        response_token_ids=[int(v) for v in rng.integers(10, 50_000, n)], response_tokens=tokens,
        token_logprob=logprob.tolist(), token_entropy=entropy.tolist(),
        token_vision_sensitivity=vision.tolist(), token_credit_weight=credit.tolist(),
        token_advantage=[0.0] * n, token_ratio=ratio.tolist(),
        reward=reward, reward_components=comps, advantage=0.0, finish_reason=finish,
        ground_truth=p["answer"], parsed_answer=parsed or None, parsed_boxes=pred_boxes, gt_boxes=gt_boxes,
        rubric_results=rubric,
        consistency={"verdict": "consistent" if consistent else "inconsistent",
                     "p_consistent": 0.9 if consistent else 0.15, "conclusion": conclusion,
                     "conclusion_span": [span_at, span_at + len(conclusion)] if span_at >= 0 else None,
                     "thinking_correct": thinking_ok, "answer_correct": answer_correct},
        config_hash="synthetic", git_commit="synthetic",
        extra={"synthetic": True, "task": p["task"], **p.get("extra", {})},
    )


def _video_prompt(rng: np.random.Generator, g: int, images: ImageStore, size: int, n_frames: int,
                  fps: float | None) -> dict:
    """A counting prompt over a clip: one shape per frame; the answer is how many frames show ``target``."""
    frame_shapes = []
    refs = []
    for _ in range(n_frames):  # one shape per frame: easy to count by eye
        colour = str(rng.choice(list(COLOURS)))
        d = int(rng.integers(size // 3, size // 2))
        x, y = (int(v) for v in rng.integers(0, size - d, size=2))
        box = [float(x), float(y), float(x + d), float(y + d)]
        img = Image.new("RGB", (size, size), (245, 245, 240))
        ImageDraw.Draw(img).ellipse(box, fill=COLOURS[colour])
        refs.append(images.put(img))
        frame_shapes.append((colour, box))
    target = "red"
    extra: dict = {VIDEO_FRAMES_KEY: [refs]}
    if fps is not None:
        extra["video_fps"] = [float(fps)]
    return dict(id=f"v{g:05d}", task="count", target=target, shapes=frame_shapes, image=None,
                question=f"How many frames show a {target} shape?",
                answer=str(sum(c == target for c, _ in frame_shapes)), gt_boxes=[], extra=extra)


def _make_hostile(rec: RolloutRecord) -> None:
    rec.response_text = HOSTILE_TEXT
    rec.response_tokens = tokenize(HOSTILE_TEXT)
    n = len(rec.response_tokens)
    rec.response_token_ids = list(range(100, 100 + n))
    for name in ("token_logprob", "token_entropy", "token_vision_sensitivity", "token_credit_weight",
                 "token_advantage", "token_ratio"):
        setattr(rec, name, [0.0] * n)
    rec.consistency = {"verdict": "unknown", "p_consistent": None, "conclusion": "<script>alert('x')</script>",
                       "conclusion_span": [_SCRIPT_AT, _SCRIPT_AT + 27], "thinking_correct": None, "answer_correct": None}
    rec.parsed_answer = "<b>1</b>"
    rec.rubric_results = [{"id": "xss", "text": "<script>alert(3)</script>", "category": "<i>c</i>",
                           "verdict": "fail", "score": 0.0, "weight": 1.0,
                           "rationale": "<img src=x onerror=alert(4)>", "judge": "**judge**"}]


def _set_advantages(group: list[RolloutRecord]) -> None:
    """GRPO advantages (r - mean) / (std + 1e-4); per-token advantage = A x credit weight."""
    r = np.array([rec.reward for rec in group])
    adv = (r - r.mean()) / (r.std() + 1e-4)
    for rec, a in zip(group, adv):
        rec.advantage = float(a)
        rec.token_advantage = [float(a) * w for w in rec.token_credit_weight]


def _step_metrics(step: int, records: list[RolloutRecord]) -> dict:
    rewards = np.array([r.reward for r in records])
    comps: dict[str, list[float]] = {}
    for r in records:
        for k, v in r.reward_components.items():
            comps.setdefault(k, []).append(v)
    groups: dict[str, list[float]] = {}
    for r in records:
        groups.setdefault(r.prompt_id, []).append(r.reward)
    credit = [w for r in records for w in r.token_credit_weight]
    correct = [bool(r.consistency and r.consistency.get("answer_correct")) for r in records]
    out = {
        "step": step,
        "reward/mean": float(rewards.mean()),
        **{f"reward/{k}": float(np.mean(v)) for k, v in comps.items()},
        "accuracy": float(np.mean(correct)),
        "inconsistency_rate": float(np.mean([r.consistency is not None and r.consistency["verdict"] == "inconsistent"
                                             for r in records])),
        "response_length/mean": float(np.mean([r.num_response_tokens for r in records])),
        "entropy/mean": float(np.mean([np.mean(r.token_entropy) for r in records if r.token_entropy])),
        "credit/selected_fraction": float(np.mean(credit)) if credit else 0.0,
        "zero_std_group_fraction": float(np.mean([np.std(v) < 1e-8 for v in groups.values()])),
        "kl": 0.001 * step,
        "loss": float(-rewards.std()),
        "synthetic": True,
    }
    return out
