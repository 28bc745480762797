"""Warm start: a tiny VLM supervised-fine-tuned on a synthetic task to a *middling* accuracy, cached.

Why: RL from verifiable rewards needs a policy that already emits the response format and is right some of
the time but far from always — a random tiny model never earns a reward, a converged one has nothing left
to learn. The recipe, as measured on 2 CPU cores: AdamW 1e-3, batch 32, loss on the response only; greedy ~43%
after ~300 steps on ``count`` (chance 25%), ~75% later. The video task has its own step budget and split
sizes (``TASK_DEFAULTS``). We evaluate a small validation split every
``eval_every`` steps and stop once greedy accuracy reaches ``stop_at`` (default 0.45), so the held-out
accuracy lands in the 30-60% window instead of depending on the machine's speed.

``answer_noise=p`` replaces the answer in a fraction p of the SFT targets by a random one from the task's
answer set while keeping the (correct) thinking: a ready-made thinking-answer inconsistent policy
(docs/consistency.md).

The result is cached: ``out_dir/warmstart.json`` holds the metrics and a hash of the options; a second
call with the same options returns it at once. The json is written last (atomically), so an interrupted
build is redone.

The build runs on pinned CPU kernels (``mmrlvr.models.kernels``), in a child process when this one was not
started pinned: the same options give the same bytes on the same kind of CPU whatever its thread count or load,
and on most other x86-64 CPUs -- but not all (an AMD EPYC and an Intel Xeon with AMX, both AVX-512, built the
count warm start alike to step 100 of 550 and then apart, held-out greedy 0.53 vs 0.545). That is why the
demo's and the tiny configs' warm starts *ship* with the package (``SHIPPED``): every machine starts from the same
bytes.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import random
import re
import time
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from mmrlvr.data import make_rows, rows_to_samples
from mmrlvr.data import synth
from mmrlvr.errors import UserError
from mmrlvr.evaluation import EvalSeen, heldout_accuracy, tool_metrics
from mmrlvr.models.kernels import LABEL as KERNELS
from mmrlvr.models.kernels import check_pinned, env_pinned, kernel_state, pinned_env
from mmrlvr.models.loading import load_policy
from mmrlvr.models.tiny import build_tiny
from mmrlvr.rollout.hf import HFEngine, expand_vision, prompt_texts
from mmrlvr.types import Sample

WARMSTART_VERSION = 3  # bump when the recipe changes: invalidates every cache (2: fixed threads, deterministic;
# 3: pinned CPU kernels)
# The build runs on this many intra-op threads whatever the machine or OMP_NUM_THREADS: a float sum's order
# (and so every trained weight) depends on how a matmul is split over threads, so the same options give the
# same bits on a 2-core laptop and a 64-core server, loaded or idle.
BUILD_THREADS = 1


@contextlib.contextmanager
def deterministic_build(threads: int = BUILD_THREADS):
    """Fixed intra-op thread count, deterministic algorithms and oneDNN off for the duration of a build (then
    restored); with the pinned environment (``mmrlvr.models.kernels.PINNED_ENV``) this is the pinned state."""
    old_threads, old_mkldnn = torch.get_num_threads(), torch.backends.mkldnn.enabled
    old_det, old_warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.set_num_threads(threads)
    torch.backends.mkldnn.enabled = False
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.set_num_threads(old_threads)
        torch.backends.mkldnn.enabled = old_mkldnn
        torch.use_deterministic_algorithms(old_det, warn_only=old_warn)


def build_determinants() -> dict[str, Any]:
    """What besides the options decides the warm start's bits: thread count, kernels and the torch build."""
    return {"threads": BUILD_THREADS, "torch": torch.__version__.split("+")[0], "kernels": KERNELS}
RESULT_FILE = "warmstart.json"
IN_PROGRESS = ".warmstart-in-progress"

# Per-task recipe for the options a caller leaves unset (``UNSET``); every other task takes the signature's
# defaults, so the image tasks' options, hashes and cached warm starts are unchanged. ``synth:video_count``
# sits at chance for ~600 SFT steps before it takes off (measured: val greedy 0.49 at step 700 on Qwen2.5-VL,
# 0.46 at 900 on Qwen3-VL), so it gets room for 1200 steps; 128 validation clips keep a chance-level spike
# (constant answers score 0.19-0.34) from tripping the 0.45 stop (SE ~0.04 at chance); 2048 training clips
# keep the build's encoding small (docs/data.md has the figures).
TASK_DEFAULTS: dict[str, dict[str, Any]] = {
    "video_count": {"steps": 1200, "stop_at": 0.45, "eval_every": 50, "n_train": 2048, "n_val": 128, "n_test": 200},
    # two images of 256 patches per example (the 896-px scene seen at 224 px, the zoom at 224 px), ~1.2 MB in
    # bfloat16: 4096 rows keep the encoded set near 5 GB (1024 rows were seen 25 times each in 800 steps);
    # greedy validation runs both turns, so it is sparser and smaller
    "zoom": {"steps": 500, "stop_at": 0.6, "eval_every": 100, "n_train": 4096, "n_val": 64, "n_test": 200},
}
UNSET: Any = type("Unset", (), {"__repr__": lambda self: "UNSET"})()  # "not given": the task's default applies
_SIGNATURE_DEFAULTS: dict[str, Any] = {"steps": 600, "stop_at": 0.45, "eval_every": 50, "n_train": 4096,
                                       "n_val": 200, "n_test": 200}


def task_options(task: str, **given: Any) -> dict[str, Any]:
    """``given`` with each ``UNSET`` value replaced by ``task``'s recipe default (``TASK_DEFAULTS``), else the
    common one.

    >>> task_options("count", steps=UNSET, stop_at=None)["steps"], task_options("video_count", steps=UNSET)["steps"]
    (600, 1200)
    """
    defaults = {**_SIGNATURE_DEFAULTS, **TASK_DEFAULTS.get(task, {})}
    return {key: defaults[key] if value is UNSET else value for key, value in given.items()}


def answer_space(task: str, rng: random.Random) -> str:
    """A uniformly random answer for ``task`` (what a noisy SFT target says instead of the truth)."""
    if task in ("count", "count_chatter"):
        return str(rng.randint(0, 3))
    if task == "largest_colour":
        return rng.choice(synth.COLOURS)
    if task == "left_right":
        return rng.choice(("left", "right"))
    if task == "geometry":
        return str(rng.choice(synth.ANGLES))
    if task in synth.GROUNDING_TASKS:
        x1, y1 = rng.randint(0, 80), rng.randint(0, 80)
        return json.dumps([x1, y1, x1 + rng.randint(20, 40), y1 + rng.randint(20, 40)])
    raise UserError(f"no answer space for task {task!r}")


def noisy_target(solution: str, task: str, answer_noise: float, rng: random.Random) -> str:
    """``solution`` with its <answer> replaced by a random one with probability ``answer_noise``."""
    if answer_noise <= 0 or rng.random() >= answer_noise:
        return solution
    return re.sub(r"<answer>.*?</answer>", lambda _: f"<answer>{answer_space(task, rng)}</answer>", solution,
                  count=1, flags=re.DOTALL)


# -- SFT batches --------------------------------------------------------------------------------------

def encode_sft(processor: Any, samples: list[Sample], targets: list[str], chunk: int = 64) -> list[dict[str, Any]]:
    """One dict per example: unpadded ``input_ids`` [T], per-token extras, vision rows, response length.

    The processor runs once per example (in chunks); ``collate_sft`` then pads any subset cheaply.
    Video samples (``meta["videos"]``, e.g. ``synth:video_count``) carry their video rows the same way.
    """
    from mmrlvr.data.video_processing import VIDEO_KEYS, ensure_video_processor, slice_video_rows, video_processor_kwargs

    tokenizer = processor.tokenizer
    eos = tokenizer.eos_token
    out: list[dict[str, Any]] = []
    for start in range(0, len(samples), chunk):
        part, tgt = samples[start:start + chunk], targets[start:start + chunk]
        video = video_processor_kwargs(part)
        if video:
            ensure_video_processor(processor)
        texts = [p + t + eos for p, t in zip(prompt_texts(processor, part), tgt)]
        kwargs: dict[str, Any] = {"text": texts, "return_tensors": "pt", "padding": True, **video}
        if any(s.images for s in part):
            kwargs["images"] = [s.images for s in part]
        inputs = dict(processor(**kwargs))
        videos_per = [len(s.meta.get("videos") or []) for s in part]
        vision = expand_vision(inputs, [len(s.images) for s in part], 1, videos_per)
        n_resp = [len(tokenizer(t + eos, add_special_tokens=False).input_ids) for t in tgt]
        offsets = [0]
        if "image_grid_thw" in vision:
            for p in vision["image_grid_thw"].prod(-1).tolist():
                offsets.append(offsets[-1] + p)
        img = 0
        for i, s in enumerate(part):
            keep = inputs["attention_mask"][i].bool()
            k = len(s.images)
            example = {
                "input_ids": inputs["input_ids"][i][keep],
                "per_token": {key: v[i][keep] for key, v in vision.items()
                              if v.dim() == 2 and v.shape == inputs["input_ids"].shape},
                "n_resp": n_resp[i],
            }
            if "image_grid_thw" in vision:
                example["pixel_values"] = vision["pixel_values"][offsets[img]:offsets[img + k]]
                example["image_grid_thw"] = vision["image_grid_thw"][img:img + k]
            example.update(slice_video_rows({key: vision[key] for key in VIDEO_KEYS if key in vision},
                                            slice(i, i + 1), videos_per))
            out.append(example)
            img += k
    return out


#: training rows drawn and encoded at a time (a multiple of ``encode_sft``'s processor chunk, so the bytes do not
#: depend on it)
ENCODE_CHUNK = 256
#: tasks fine-tuned from another task's warm start of the same family instead of a fresh tiny model (``base``): the
#: zoom task's last turn is counting, which the count warm start's vision and language already do; from a fresh model,
#: 500 steps learnt the call's format but neither where to look nor how to count
BASE_TASKS: dict[str, str] = {"zoom": "count"}
#: tasks whose reference is a multi-turn trajectory, and the tools it calls (``meta["reference_turns"]``)
TOOL_TASKS: dict[str, list[str]] = {"zoom": ["zoom"]}
#: response tokens per model turn when sampling a tool task (the zoom task's first turn, thinking and call, is ~100
#: tokens of the tiny BPE)
TOOL_TURN_TOKENS = 128
#: the share of a tool task's SFT examples that look in the wrong place first (``meta["decoy_turns"]``), every turn
#: trained, their answer what the wrong crop shows: the warm start is a policy that looks in the right place about
#: two times in three and always answers from what it saw, so RL has a choice to learn (where to look) whose reward
#: follows from the image. Unlabelled decoy calls with the gold answer after them (the previous recipe) taught the
#: model to answer without reading the crop: greedy gave one count for every scene
DECOY_SHARE = 0.35
#: model turns when sampling a tool task (validation, the held-out metrics): the reference's two, as
#: ``configs/zoom-tiny.yaml`` allows
TOOL_MAX_TURNS = 2


def encode_sft_turns(processor: Any, samples: list[Sample], tools: list[str],
                     decoy_share: float = 0.0) -> list[dict[str, Any]]:
    """``encode_sft``'s examples for multi-turn references (``sample.meta["reference_turns"]``: the model turns, each
    but the last ending in tool calls): the calls run through the real tools and their answers are encoded exactly as
    a multi-turn rollout encodes them (``mmrlvr.rollout.multiturn``), so SFT trains on the sequences RL samples.
    The prompts do not list the tools (``describe=False``: the warm start learns the call itself, and the tiny BPE
    spends ~600 tokens on the schema block); runs from such a warm start set ``rollout.tool_params.describe: false``.
    ``label_mask`` marks the model's tokens (each turn and its end-of-turn token); tool turns are context only.
    ``decoy_share``: the share of samples (chosen by a hash of their id) encoded from ``meta["decoy_turns"]`` where
    they have them (labelled like any reference).
    Pixel values are stored in bfloat16 (an 8-bit image loses nothing that matters; half the memory)."""
    from mmrlvr.rollout.multiturn import ToolUse, tool_turn
    from mmrlvr.tools import TOOLS, parse_tool_calls

    tokenizer = processor.tokenizer
    eos_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
    use = ToolUse(tools={name: TOOLS.get(name) for name in tools}, describe=False)
    schemas = use.schemas()
    out: list[dict[str, Any]] = []
    for s in samples:
        prompt = processor(text=prompt_texts(processor, [s], schemas), images=[s.images] if s.images else None,
                           return_tensors="pt")
        ids = prompt["input_ids"][0].tolist()
        labels = [False] * len(ids)
        per_token = {k: v[0].tolist() for k, v in prompt.items() if torch.is_tensor(v) and v.dim() == 2
                     and v.shape == prompt["input_ids"].shape and k not in ("input_ids", "attention_mask")}
        pixels = [prompt["pixel_values"]] if "pixel_values" in prompt else []
        grids = [prompt["image_grid_thw"]] if "image_grid_thw" in prompt else []
        images = list(s.images)
        decoy = bool(s.meta.get("decoy_turns")) and random.Random(f"decoy/{s.id}").random() < decoy_share
        turns = s.meta["decoy_turns" if decoy else "reference_turns"]
        for j, text in enumerate(turns):
            turn_ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [eos_id]
            ids += turn_ids
            labels += [True] * len(turn_ids)
            for key in per_token:
                per_token[key] += [0] * len(turn_ids)
            if j == len(turns) - 1:
                break
            calls = parse_tool_calls(text)
            seg = tool_turn(processor, images, s, calls, use, tokenizer.eos_token)
            if any(c["error"] for c in seg["calls"]):
                raise ValueError(f"sample {s.id!r}: reference turn {j} makes a call that fails: {seg['calls']}")
            images += seg["images"]
            ids += seg["ids"]
            labels += [False] * len(seg["ids"])
            for key in per_token:
                per_token[key] += seg["types"] if key == "mm_token_type_ids" else [0] * len(seg["ids"])
            pixels += seg["pixels"]
            grids += [g[None] for g in seg["grids"]]
        example = {"input_ids": torch.tensor(ids), "label_mask": torch.tensor(labels),
                   "per_token": {k: torch.tensor(v, dtype=prompt[k].dtype) for k, v in per_token.items()},
                   "n_resp": len(ids) - int(prompt["input_ids"].shape[1])}
        if pixels:  # kept in bfloat16 (half the memory: several 224-px images per example); collate_sft restores float32
            example["pixel_values"] = torch.cat(pixels).to(torch.bfloat16)
            example["image_grid_thw"] = torch.cat(grids)
        out.append(example)
    return out


def collate_sft(examples: list[dict[str, Any]], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-padded batch with ``labels`` = -100 everywhere except the response tokens."""
    length = max(len(e["input_ids"]) for e in examples)
    b = len(examples)
    input_ids = torch.full((b, length), pad_id, dtype=torch.long)
    attention = torch.zeros(b, length, dtype=torch.long)
    labels = torch.full((b, length), -100, dtype=torch.long)
    per_token = {key: torch.zeros(b, length, dtype=v.dtype) for key, v in examples[0]["per_token"].items()}
    for i, e in enumerate(examples):
        t = len(e["input_ids"])
        input_ids[i, length - t:] = e["input_ids"]
        attention[i, length - t:] = 1
        if "label_mask" in e:  # multi-turn: the model's turns only
            labels[i, length - t:] = torch.where(e["label_mask"], e["input_ids"], torch.full_like(e["input_ids"], -100))
        else:
            labels[i, length - e["n_resp"]:] = e["input_ids"][t - e["n_resp"]:]
        for key, v in e["per_token"].items():
            per_token[key][i, length - t:] = v
    vision = {key: torch.cat([e[key] for e in examples])
              for key in ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw",
                          "second_per_grid_ts") if key in examples[0]}
    if "pixel_values" in vision and vision["pixel_values"].dtype == torch.bfloat16:  # encode_sft_turns' storage
        vision["pixel_values"] = vision["pixel_values"].float()
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels, **per_token, **vision}


# -- the warm start -----------------------------------------------------------------------------------

def _options_hash(options: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(options, sort_keys=True).encode()).hexdigest()[:16]


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


@contextlib.contextmanager
def build_lock(out_dir: str | Path):
    """Hold the inter-process lock of one model folder: one builder at a time, the others wait (saying so on
    stderr) and then find its result.

    ``resolve_model_path`` (a run's ``tiny:...`` spec, the test suite's background builds) and ``mmrlvr tiny
    build`` take the same lock, so two of them pointed at one folder never write it at once."""
    import sys

    from filelock import FileLock, Timeout

    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(out.parent / f".{out.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        print(f"waiting for another process building {out} ...", file=sys.stderr, flush=True)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def cached_result(out_dir: str | Path, options_hash: str) -> dict[str, Any] | None:
    """The stored metrics if ``out_dir`` holds a finished warm start with these options, else None."""
    path = Path(out_dir) / RESULT_FILE
    if not path.exists() or not (Path(out_dir) / "config.json").exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if data.get("options_hash") == options_hash else None


#: warm starts shipped with the package (``mmrlvr/models/shipped/<folder>``: the files a build writes, 2.8 MB each):
#: the demo's (count), and those of the tiny configs -- consistency-tiny's (count, answer noise 0.9),
#: grounding-tiny's (grounding_single) and zoom-tiny's (zoom, on the count one) -- so each is in place at once after
#: an install instead of 6-15 min of SFT on 2 cores (zoom: 40-80 min), and every machine trains from the same bytes
#: (a build is CPU-kind dependent in its last bits: module docstring). A shipped copy is used only when its
#: ``options_hash`` is the one this code computes for the request — a changed recipe, task drawing or torch
#: builds as before — and ``force`` always builds. The count build reproduces the shipped bytes on the kind of CPU
#: that built them (test: ``mmrlvr tiny build --family qwen2_5_vl --out DIR --warm-start --force``, compared file
#: by file). To refresh after a recipe change: build with ``--force`` and copy the folder's files here
#: (``ship_warm_start``).
SHIPPED = Path(__file__).parent / "shipped"
SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "chat_template.jinja",
                 "processor_config.json", "tokenizer.json", "tokenizer_config.json")


def shipped_copy(options_hash: str) -> Path | None:
    """The shipped warm start built with these options, if the package holds one."""
    if not SHIPPED.is_dir():
        return None
    for folder in sorted(SHIPPED.iterdir()):
        if cached_result(folder, options_hash) is not None and all((folder / f).is_file() for f in SHIPPED_FILES):
            return folder
    return None


def _install_shipped(src: Path, out: Path) -> dict[str, Any]:
    """Copy a shipped warm start into ``out``: each file through a temporary name, the result file last (a
    folder without it is not a finished warm start, so an interrupted copy is rebuilt, never half-used)."""
    import os
    import shutil

    out.mkdir(parents=True, exist_ok=True)
    (out / RESULT_FILE).unlink(missing_ok=True)
    for name in (*SHIPPED_FILES, RESULT_FILE):
        tmp = out / f".{name}.copy"
        shutil.copyfile(src / name, tmp)
        os.replace(tmp, out / name)
    return json.loads((out / RESULT_FILE).read_text())


def ship_warm_start(built: str | Path, name: str) -> Path:
    """Copy a finished warm start (built with ``force``) into the package's shipped folder ``name``."""
    import shutil

    src = Path(built)
    if not (src / RESULT_FILE).is_file():
        raise UserError(f"{str(src)!r} is not a finished warm start (no {RESULT_FILE})")
    dest = SHIPPED / name
    dest.mkdir(parents=True, exist_ok=True)
    for f in (*SHIPPED_FILES, RESULT_FILE):
        shutil.copyfile(src / f, dest / f)
    return dest


def warm_start(out_dir: str | Path, *, family: str = "qwen2_5_vl", task: str = "count", steps: int = UNSET,
               answer_noise: float = 0.0, seed: int = 0, force: bool = False, stop_at: float | None = UNSET,
               eval_every: int = UNSET, batch_size: int = 32, lr: float = 1e-3, n_train: int = UNSET,
               n_val: int = UNSET, n_test: int = UNSET, k: int = 8, template: str = "r1",
               progress: bool = True, tools: bool = True, base: str | Path | None = None) -> dict[str, Any]:
    """Build a tiny ``family`` model in ``out_dir``, SFT it on ``task``, evaluate on held-out test rows.

    base: a finished warm start's folder to fine-tune instead of a fresh tiny model (``BASE_TASKS`` says which task's
    the run specs use); its options hash is part of this recipe.

    tools: for a tool task (``TOOL_TASKS``), False trains and evaluates it in one turn — the final answer right
    after the prompt, no call — the baseline that shows what the model can read without looking again.

    steps: the most optimizer steps; training stops earlier once greedy accuracy on ``n_val`` validation
    rows reaches ``stop_at`` (None: always run ``steps``). ``steps``, ``stop_at``, ``eval_every``, ``n_train``,
    ``n_val`` and ``n_test`` left unset take the task's recipe (``TASK_DEFAULTS``; 600 / 0.45 / 50 / 4096 /
    200 / 200 for the image tasks). Returns (and writes to ``out_dir/warmstart.json``)
    the held-out metrics: ``greedy_accuracy``, ``avg@k``, ``pass@k``, ``format_rate``, plus ``steps_run``,
    ``train_s``, ``total_s``, the validation history and ``cached`` (True when read back from disk or copied from
    the package's shipped build of the same options: ``SHIPPED``; ``force`` always builds).
    """
    if not 0.0 <= answer_noise <= 1.0:
        raise UserError(f"answer_noise must be in [0, 1], got {answer_noise}")
    from mmrlvr.data.synth_video import VIDEO_TASKS

    if task not in synth.TASKS and task not in VIDEO_TASKS:
        raise UserError(f"unknown synthetic task {task!r}; known tasks: {', '.join(synth.TASKS + VIDEO_TASKS)}")
    resolved = task_options(task, steps=steps, stop_at=stop_at, eval_every=eval_every, n_train=n_train, n_val=n_val,
                            n_test=n_test)
    steps, stop_at, eval_every = resolved["steps"], resolved["stop_at"], resolved["eval_every"]
    n_train, n_val, n_test = resolved["n_train"], resolved["n_val"], resolved["n_test"]
    options = {"version": WARMSTART_VERSION, "family": family, "task": task, "steps": steps,
               "answer_noise": answer_noise, "seed": seed, "stop_at": stop_at, "eval_every": eval_every,
               "batch_size": batch_size, "lr": lr, "n_train": n_train, "n_val": n_val, "n_test": n_test, "k": k,
               "template": template, **build_determinants()}
    if task in TOOL_TASKS:  # multi-turn sampling is part of the recipe (other tasks: unchanged keys and hash)
        options["tools"] = TOOL_TASKS[task] if tools else []
        options["turn_tokens"] = TOOL_TURN_TOKENS
        if tools:  # (the one-turn baseline's recipe does not involve them)
            options.update(decoy_share=DECOY_SHARE, max_turns=TOOL_MAX_TURNS)
    if base is not None:
        base_result = Path(base) / RESULT_FILE
        if not base_result.exists():
            raise UserError(f"warm start base {str(base)!r} is not a finished warm start (no {RESULT_FILE})")
        options["base"] = json.loads(base_result.read_text())["options_hash"]
    if task in synth.DATA_VERSIONS:  # the task's drawing is part of the recipe (other tasks: unchanged keys and hash)
        options["task_data"] = synth.DATA_VERSIONS[task]
    if task in VIDEO_TASKS:  # the clips' drawing is part of the recipe (image tasks: unchanged keys and hash)
        from mmrlvr.data.synth_video import VIDEO_DATA_VERSION

        options["video_data"] = VIDEO_DATA_VERSION
    digest = _options_hash(options)
    out = Path(out_dir)
    if not force and (hit := cached_result(out, digest)) is not None:
        return {**hit, "cached": True}
    marker = out / IN_PROGRESS
    if (out / "config.json").exists() and not force and not (out / RESULT_FILE).exists() and not marker.exists():
        raise UserError(f"{str(out)!r} holds a model that is not a warm start; pass force=True (--force) to "
                        "overwrite it")
    if not force and (src := shipped_copy(digest)) is not None:  # the package ships this very build
        return {**_install_shipped(src, out), "cached": True, "shipped": True}
    kwargs = dict(family=family, task=task, steps=steps, answer_noise=answer_noise, seed=seed, stop_at=stop_at,
                  eval_every=eval_every, batch_size=batch_size, lr=lr, n_train=n_train, n_val=n_val, n_test=n_test,
                  k=k, template=template, progress=progress, tools=tools, base=None if base is None else str(base))
    if not env_pinned():
        return _build_in_pinned_child(out, digest, {**kwargs, "force": force})
    with deterministic_build():
        check_pinned(kernel_state())
        return _build(out, marker, options, digest, **kwargs)


def _build_in_pinned_child(out: Path, digest: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    """Run ``warm_start`` in a child process started on the pinned kernels (its progress bar shows through)."""
    import subprocess
    import sys

    code = ("import json, sys; from mmrlvr.models.warmstart import warm_start; "
            "warm_start(sys.argv[1], **json.loads(sys.argv[2]))")
    proc = subprocess.run([sys.executable, "-c", code, str(out), json.dumps(kwargs)], env=pinned_env())
    hit = cached_result(out, digest)
    if proc.returncode != 0 or hit is None:
        raise RuntimeError(f"warm start of {str(out)!r} failed in its pinned build process (exit {proc.returncode}; "
                           "its error is printed above)")
    return {**hit, "cached": False}


def _build(out: Path, marker: Path, options: dict[str, Any], digest: str, *, family: str, task: str, steps: int,
           answer_noise: float, seed: int, stop_at: float | None, eval_every: int, batch_size: int, lr: float,
           n_train: int, n_val: int, n_test: int, k: int, template: str, progress: bool,
           tools: bool = True, base: str | None = None) -> dict[str, Any]:
    """The warm start itself (``warm_start`` runs it under ``deterministic_build``)."""
    t_start = time.perf_counter()
    _start_model(out, marker, family, seed, base)
    model, processor = load_policy(out)
    tokenizer = processor.tokenizer

    from mmrlvr.data.synth_video import VIDEO_TASKS, make_video_row, make_video_rows

    rows_of, row_of = (make_video_rows, make_video_row) if task in VIDEO_TASKS else (make_rows, synth.make_row)
    rng = random.Random(f"warmstart/{seed}")
    val_rows = rows_of(task, "train", n_val, seed=seed + 10_000)  # other scenes than the training rows
    test_rows = rows_of(task, "test", n_test, seed=seed)
    tools = TOOL_TASKS.get(task) if tools else None
    examples = _sft_examples(processor, row_of, task, n_train, seed, template, tools, answer_noise, rng)

    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    engine, max_new = _sampling_engine(model, processor, tools)
    validate = functools.partial(_validate, engine, rows_to_samples(val_rows, template=template), max_new, seed)
    bar = tqdm(total=steps, desc=f"warm start {family}/{task}", unit="step", disable=not progress)
    t_train = time.perf_counter()
    step, history = _train(model, optimizer, examples, tokenizer.pad_token_id, rng, bar, validate, steps=steps,
                           batch_size=batch_size, eval_every=eval_every, stop_at=stop_at)
    bar.close()
    train_s = time.perf_counter() - t_train
    model.eval()
    model.save_pretrained(out)
    test = heldout_accuracy(engine, rows_to_samples(test_rows, template=template), k=k, temperature=1.0, max_new_tokens=max_new,
                    seed=seed, progress=progress)
    result = {**test, "family": family, "task": task, "answer_noise": answer_noise, "seed": seed,
              "steps_run": step, "train_s": round(train_s, 2), "total_s": round(time.perf_counter() - t_start, 2),
              "val_history": history, "chance": _chance(task), "options": options, "options_hash": digest,
              "build_kernels": kernel_state()}
    _write_json_atomic(out / RESULT_FILE, result)
    marker.unlink(missing_ok=True)
    return {**result, "cached": False}


def _start_model(out: Path, marker: Path, family: str, seed: int, base: str | None) -> None:
    """Mark ``out`` as a build in progress (a rerun may overwrite it without --force) and put the starting model
    there: a fresh tiny ``family`` model, or the files of the ``base`` warm start."""
    out.mkdir(parents=True, exist_ok=True)
    marker.touch()
    (out / RESULT_FILE).unlink(missing_ok=True)
    if base is None:
        build_tiny(family, out, seed=seed)
    else:  # the base's model, tokenizer and processor files (not its result: this build writes its own)
        import shutil

        for f in Path(base).iterdir():
            if f.is_file() and f.name not in (RESULT_FILE, IN_PROGRESS):
                shutil.copy2(f, out / f.name)


def _sft_examples(processor: Any, row_of: Any, task: str, n_train: int, seed: int, template: str,
                  tools: list[str] | None, answer_noise: float, rng: random.Random) -> list[dict[str, Any]]:
    """The ``n_train`` training rows encoded for SFT: multi-turn references (the call, the tool's answer, the final
    turn) for a tool task, else one response each (its answer replaced at rate ``answer_noise``, drawn from ``rng``).
    Rows are drawn, encoded and dropped a chunk at a time: the zoom task's 896-px images would hold ~2.4 MB each for
    the whole build otherwise."""
    examples: list[dict[str, Any]] = []
    for start in range(0, n_train, ENCODE_CHUNK):
        rows = [row_of(task, "train", i, seed) for i in range(start, min(n_train, start + ENCODE_CHUNK))]
        samples = rows_to_samples(rows, template=template)
        if tools:
            examples += encode_sft_turns(processor, samples, tools, decoy_share=DECOY_SHARE)
        else:
            examples += encode_sft(processor, samples, [noisy_target(r["solution"], task, answer_noise, rng)
                                                         for r in rows])
    return examples


def _sampling_engine(model: Any, processor: Any, tools: list[str] | None) -> tuple[Any, int]:
    """The engine that validation and the held-out test sample with, and its tokens per turn: a tool task samples
    as a run with these tools does."""
    engine: Any = HFEngine(model, processor)
    if not tools:
        return engine, 32
    from mmrlvr.rollout.multiturn import ToolEngine, ToolUse
    from mmrlvr.tools import TOOLS

    engine = ToolEngine(engine, ToolUse(tools={name: TOOLS.get(name) for name in tools}, describe=False,
                                        max_turns=TOOL_MAX_TURNS))
    return engine, TOOL_TURN_TOKENS


def _train(model: Any, optimizer: torch.optim.Optimizer, examples: list[dict[str, Any]], pad_id: int,
           rng: random.Random, bar: Any, validate: Callable[[int, torch.Tensor], tuple[float, dict[str, float]]], *,
           steps: int, batch_size: int, eval_every: int, stop_at: float | None) -> tuple[int, list[dict[str, float]]]:
    """SFT on batches of ``examples`` in epoch orders drawn from ``rng``, validated every ``eval_every`` steps and at
    the last; stops after ``steps`` or once validation accuracy reaches ``stop_at``. Returns the steps run and the
    validation history."""
    history: list[dict[str, float]] = []
    order: list[int] = []
    step = 0
    model.train()
    while step < steps:
        if len(order) < batch_size:
            order += rng.sample(range(len(examples)), len(examples))  # a fresh epoch order
        idx, order = order[:batch_size], order[batch_size:]
        batch = collate_sft([examples[i] for i in idx], pad_id)
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if step % eval_every == 0 or step == steps:
            accuracy, entry = validate(step, loss)
            history.append(entry)
            bar.set_postfix(loss=f"{loss.item():.3f}", val=f"{accuracy:.2f}")
            model.train()
            if stop_at is not None and accuracy >= stop_at:
                break
    return step, history


def _validate(engine: Any, val_samples: list[Sample], max_new: int, seed: int, step: int, loss: torch.Tensor
              ) -> tuple[float, dict[str, float]]:
    """Greedy accuracy on the validation samples and the history entry for ``step`` (with the multi-turn metrics of
    a tool task)."""
    seen = EvalSeen()
    val = heldout_accuracy(engine, val_samples, k=0, max_new_tokens=max_new, seed=seed, progress=False, observe=seen)
    return val["greedy_accuracy"], {
        "step": step, "loss": float(loss.item()), "val_greedy_accuracy": val["greedy_accuracy"],
        **{f"val_greedy_{key}": v for key, v in tool_metrics(seen.completions, seen.samples).items()}}


def _chance(task: str) -> float | None:
    """Accuracy of uniform guessing over the task's answers (None where not meaningful)."""
    return {"count": 1 / 4, "count_chatter": 1 / 4, "zoom": 1 / (synth.ZOOM_ANSWERS[1] - synth.ZOOM_ANSWERS[0] + 1), "video_count": 1 / 4, "largest_colour": 1 / len(synth.COLOURS), "left_right": 1 / 2,
            "geometry": 1 / len(synth.ANGLES)}.get(task)
