"""Video inputs: frame sampling (files and frame folders), the loader's ``videos`` column, and the Qwen
video token layout through the real processors and models of the three tiny families (no torchvision).

Expected values are worked by hand: frame indices from the even-spacing rule, token counts from
T/2 * (H/p) * (W/p) / merge^2, Qwen3-VL timestamps as the mean time of each frame pair.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from mmrlvr.data import load_samples
from mmrlvr.data.prompts import build_messages
from mmrlvr.data.video import VideoOptions, load_video, n_frames_to_sample
from mmrlvr.data.video_processing import FrameVideoProcessor, ensure_video_processor, video_processor_kwargs
from mmrlvr.errors import DataError
from mmrlvr.types import Sample


def write_mp4(path, n_frames: int, fps: float, size=(56, 56)) -> None:
    """Frame i is a flat grey of level 10*i (so a decoded frame tells which source frame it was)."""
    import cv2

    w, h = size
    out = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
    assert out.isOpened()
    for i in range(n_frames):
        out.write(np.full((h, w, 3), 10 * i, dtype=np.uint8))
    out.release()


def test_frame_counts():
    opts = VideoOptions(fps=2, max_frames=8, min_frames=2)
    assert n_frames_to_sample(100, 25.0, opts) == 8   # 4 s * 2 fps = 8
    assert n_frames_to_sample(250, 25.0, opts) == 8   # 10 s -> 20, capped at 8
    assert n_frames_to_sample(25, 25.0, opts) == 2    # 1 s -> 2
    assert n_frames_to_sample(75, 25.0, opts) == 6    # 3 s -> 6
    assert n_frames_to_sample(3, 25.0, opts) == 2     # under min: 2 (a Qwen temporal patch)


def test_video_file_sampling(tmp_path):
    write_mp4(tmp_path / "v.mp4", 20, 10.0)  # 2 s at 10 fps -> 4 frames at 2 fps
    v = load_video(str(tmp_path / "v.mp4"), opts=VideoOptions(fps=2, max_frames=8, max_pixels=56 * 56))
    # 4 evenly spaced of 20: round(i * 19 / 3) = 0, 6, 13, 19
    assert v["indices"] == [0, 6, 13, 19] and v["n_source_frames"] == 20 and v["source_fps"] == 10.0
    assert v["fps"] == pytest.approx(2.0)  # 4 frames over 2 s
    levels = [int(np.asarray(f)[20, 20, 0]) for f in v["frames"]]
    assert all(abs(lv - 10 * i) <= 6 for lv, i in zip(levels, [0, 6, 13, 19]))  # mp4v is lossy
    assert all(f.size == (56, 56) for f in v["frames"])


def test_frame_folder_and_loader_column(tmp_path):
    folder = tmp_path / "clip"
    folder.mkdir()
    for i in range(6):
        Image.new("RGB", (84, 56), (40 * i, 0, 0)).save(folder / f"{i:03d}.png")
    rows = [{"problem": "<video>How many frames show red?", "answer": "3", "videos": ["clip"]},
            {"problem": "How many?", "answer": "2", "videos": ["clip"], "images": []}]
    (a, b), report = load_samples(rows, preset="easyr1", image_dir=tmp_path,
                                  video=VideoOptions(fps=2, max_frames=4, source_fps=2))
    v = a.meta["videos"][0]
    # 6 frames at 2 fps = 3 s -> 6 wanted, capped at 4: indices round(i * 5 / 3) = 0, 2, 3, 5
    assert v["indices"] == [0, 2, 3, 5] and [f.getpixel((0, 0))[0] for f in v["frames"]] == [0, 80, 120, 200]
    assert [p["type"] for p in a.messages[-1]["content"]] == ["video", "text"]
    assert [p["type"] for p in b.messages[-1]["content"]] == ["video", "text"]  # no placeholder: video first
    bad = [{"problem": "<video><video>Compare.", "answer": "1", "videos": ["clip"]}]
    with pytest.raises(DataError, match=r"row 0, field 'videos': the problem has 2 <video> placeholder\(s\) but the "
                                        r"row has 1 video\(s\)"):
        load_samples(bad, preset="easyr1", image_dir=tmp_path)
    with pytest.raises(DataError, match=r"row 0, field 'videos': video 0: video not found"):
        load_samples([{"problem": "q", "answer": "1", "videos": ["nope.mp4"]}], preset="easyr1", image_dir=tmp_path)


def test_video_patches_of_a_still_clip_equal_the_image_patches():
    """A 2-frame clip of one image must give the rows the image processor gives that image (it tiles an
    image over the temporal patch): an independent check of the patch order."""
    from transformers import Qwen2VLImageProcessorPil

    ip = Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2, min_pixels=28 * 28,
                                  max_pixels=448 * 448)
    rng = np.random.default_rng(0)
    im = Image.fromarray(rng.integers(0, 255, (56, 84, 3), dtype=np.uint8))
    ref = ip(images=[im], return_tensors="np")
    vp = FrameVideoProcessor.like(ip)
    rows, grid = vp.patchify([im, im])
    assert grid == [1, 4, 6] and ref["image_grid_thw"].tolist() == [[1, 4, 6]]
    np.testing.assert_allclose(rows, ref["pixel_values"], atol=1e-5)


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def family_model(request, tmp_path_factory):
    from mmrlvr.models.compat import load_processor
    from mmrlvr.models.loading import load_policy
    from mmrlvr.models.tiny import build_tiny

    path = build_tiny(request.param, tmp_path_factory.mktemp(request.param) / "m")
    model = load_policy(path)[0]
    return request.param, model, ensure_video_processor(load_processor(path, request.param))


def test_video_token_layout_through_the_real_processor_and_model(family_model):
    import torch

    from mmrlvr.rollout.hf import prompt_texts

    family, model, proc = family_model
    f = 32 if family == "qwen3_vl" else 28  # patch 16 x merge 2 for Qwen3-VL, 14 x 2 otherwise
    frames = [Image.new("RGB", (3 * f, 2 * f), (60 * i, 0, 0)) for i in range(4)]
    video = {"frames": frames, "fps": 1.0, "source_fps": 2.0, "indices": [0, 2, 4, 6], "n_source_frames": 8}
    s = Sample(id="v", messages=build_messages("<video>How many?", 0, "plain", n_videos=1), images=[], answer="1",
               meta={"videos": [video]})
    enc = proc(text=prompt_texts(proc, [s]), return_tensors="pt", **video_processor_kwargs([s]))
    assert enc["video_grid_thw"].tolist() == [[2, 4, 6]]  # 4 frames / 2, 2f/(f/2), 3f/(f/2)
    ids = enc["input_ids"][0].tolist()
    pad = proc.tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert ids.count(pad) == 2 * 4 * 6 // 4  # 12 tokens: T/2 * H/p * W/p / merge^2
    text = proc.tokenizer.decode(ids)
    if family == "qwen3_vl":  # frame pairs at source times (0, 1) and (2, 3) s -> 0.5 s and 2.5 s
        assert "<0.5 seconds>" in text and "<2.5 seconds>" in text
    if family == "qwen2_5_vl":  # temporal patch 2 / sampled fps (4 of 8 frames at 2 fps = 1 fps) = 2 s
        assert enc["second_per_grid_ts"].tolist() == [2.0]
    with torch.no_grad():
        out = model(**enc)  # the model itself checks that video features and tokens match
    assert out.logits.shape[1] == len(ids)


def test_prompt_lengths_count_video_tokens(family_model):
    from mmrlvr.data.length import prompt_lengths
    from mmrlvr.rollout.hf import prompt_texts

    family, _, proc = family_model
    f = 32 if family == "qwen3_vl" else 28
    frames = [Image.new("RGB", (2 * f, 2 * f)) for _ in range(2)]
    video = {"frames": frames, "fps": 2.0, "source_fps": 2.0, "indices": [0, 1], "n_source_frames": 2}
    s = Sample(id="v", messages=build_messages("<video>Count.", 0, "plain", n_videos=1), images=[], answer="1",
               meta={"videos": [video]})
    enc = proc(text=prompt_texts(proc, [s]), **video_processor_kwargs([s]))
    assert prompt_lengths([s], proc) == [len(enc["input_ids"][0])]


def test_hf_engine_generates_from_videos_and_teacher_forcing_matches(family_model):
    """Two video prompts x G=2 through the HF engine; the old log-probs equal a teacher-forced forward of the
    returned batch (so the video inputs were expanded to the rows in the model's own layout)."""
    import torch

    from mmrlvr.rollout.base import SamplingParams
    from mmrlvr.rollout.hf import HFEngine

    family, model, proc = family_model
    f = 32 if family == "qwen3_vl" else 28
    samples = []
    for k in range(2):
        frames = [Image.new("RGB", (2 * f, 2 * f), (100 * k, 50 * i, 0)) for i in range(4)]
        video = {"frames": frames, "fps": 2.0, "source_fps": 2.0, "indices": [0, 1, 2, 3], "n_source_frames": 4}
        samples.append(Sample(id=f"v{k}", messages=build_messages("<video>How many?", 0, "plain", n_videos=1),
                              images=[], answer="1", meta={"videos": [video]}))
    engine = HFEngine(model, proc)
    batch = engine.generate(samples, 2, SamplingParams(max_new_tokens=4), seed=0, step=0)
    # one grid per row, in patches: 4 frames / 2, 2f / (f/2) = 4, 4; each row owns 2*4*4 = 32 patch rows
    assert batch.vision["video_grid_thw"].tolist() == [[2, 4, 4]] * 4
    assert batch.vision["pixel_values_videos"].shape[0] == 4 * 32
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, **batch.vision).logits
    p = batch.prompt_length
    lp = torch.log_softmax(logits[:, p - 1:-1].float(), dim=-1).gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
    mask = batch.response_mask > 0
    torch.testing.assert_close(lp[mask], batch.old_logprobs[mask], atol=2e-4, rtol=1e-4)


def test_slice_video_rows_takes_exactly_the_rows_videos():
    import torch

    from mmrlvr.data.video_processing import slice_video_rows

    grid = torch.tensor([[1, 2, 2], [2, 2, 2], [1, 2, 4]])  # 4, 8 and 8 patch rows
    pixels = torch.arange(20).unsqueeze(1).float()
    inputs = {"pixel_values_videos": pixels, "video_grid_thw": grid, "second_per_grid_ts": torch.tensor([1.0, 2.0, 3.0])}
    out = slice_video_rows(inputs, slice(1, 3), [1, 0, 2])  # rows 1..2 own videos 1 and 2 (row 1 has none)
    assert out["video_grid_thw"].tolist() == [[2, 2, 2], [1, 2, 4]]
    assert out["pixel_values_videos"].squeeze(1).tolist() == list(range(4, 20))
    assert out["second_per_grid_ts"].tolist() == [2.0, 3.0]
    assert slice_video_rows({"input_ids": pixels}, slice(0, 1), [1]) == {}


def test_synth_video_count_rows():
    from mmrlvr.data.loading import rows_to_samples
    from mmrlvr.data.synth_video import make_video_rows

    rows = make_video_rows("video_count", "train", 40)
    answers = [int(r["answer"]) for r in rows]
    assert set(answers) == {0, 1, 2, 3}
    for r in rows:  # the answer is the number of frames whose shape has the asked colour
        assert r["meta"]["frame_colours"].count(r["meta"]["colour"]) == int(r["answer"])
        frames = r["videos"][0]["frames"]
        assert len(frames) == 4 and all(f.size == (56, 56) for f in frames)
    test_hashes = {r["meta"]["scene_hash"] for r in make_video_rows("video_count", "test", 40)}
    assert not test_hashes & {r["meta"]["scene_hash"] for r in rows}
    s = rows_to_samples(rows[:1])[0]
    assert s.images == [] and len(s.meta["videos"]) == 1
    assert [p["type"] for p in s.messages[-1]["content"]] == ["video", "text"]


def test_synth_video_frames_show_one_big_centred_shape_of_the_listed_colour():
    """Each frame's colour must reach every merged token of its pair (the fix that made the task learnable):
    the shape covers the frame's centre and at least 20% of the frame (the smallest, a 39-px triangle: ~24%),
    and no other colour than white and the listed one is drawn."""
    from mmrlvr.data.synth import RGB
    from mmrlvr.data.synth_video import make_video_rows

    for r in make_video_rows("video_count", "test", 30):
        for frame, colour in zip(r["videos"][0]["frames"], r["meta"]["frame_colours"]):
            a = np.asarray(frame)
            hit = (a == np.array(RGB[colour])).all(-1)
            white = (a == 255).all(-1)
            assert hit[26:30, 26:30].all() and hit.mean() >= 0.20, r["id"]
            assert (hit | white).all(), r["id"]


def test_video_warm_start_recipe_is_its_own_and_leaves_the_image_tasks_alone(tmp_path, monkeypatch):
    """Video tasks take TASK_DEFAULTS and carry the clips' version in the cache key; image tasks get the
    signature defaults and the option keys every task has (no video key)."""
    import mmrlvr.models.warmstart as ws
    from mmrlvr.data.synth_video import VIDEO_DATA_VERSION

    seen = []
    monkeypatch.setattr(ws, "_build", lambda out, marker, options, digest, **kw: seen.append(options) or {})
    monkeypatch.setattr(ws, "env_pinned", lambda: True)  # build "here" (the stub), not in a pinned child
    monkeypatch.setattr(ws, "check_pinned", lambda state: None)
    monkeypatch.setattr(ws, "shipped_copy", lambda digest: None)  # the count recipe is shipped: build it here too
    ws.warm_start(tmp_path / "v", task="video_count", progress=False)
    ws.warm_start(tmp_path / "c", task="count", progress=False)
    ws.warm_start(tmp_path / "v2", task="video_count", steps=5, stop_at=None, progress=False)
    video, count, given = seen
    assert (given["steps"], given["stop_at"], given["n_val"]) == (5, None, ws.TASK_DEFAULTS["video_count"]["n_val"])
    assert {k: video[k] for k in ws.TASK_DEFAULTS["video_count"]} == ws.TASK_DEFAULTS["video_count"]
    assert video["video_data"] == VIDEO_DATA_VERSION
    assert {k: count[k] for k in ("steps", "stop_at", "eval_every", "n_train", "n_val", "n_test")} == \
        {"steps": 600, "stop_at": 0.45, "eval_every": 50, "n_train": 4096, "n_val": 200, "n_test": 200}
    assert set(count) == {"version", "family", "task", "steps", "answer_noise", "seed", "stop_at", "eval_every",
                          "batch_size", "lr", "n_train", "n_val", "n_test", "k", "template", "threads", "torch", "kernels"}


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_synth_video_count_trains_two_steps(family, tmp_path):
    from mmrlvr.config import load_config
    from mmrlvr.train.trainer import Trainer

    cfg = load_config(None, [
        f"output_dir={tmp_path / 'run'}", f"model.path=tiny:{family}", "data.train=synth:video_count",
        "data.eval=synth:video_count", "data.train_size=8", "data.eval_size=2", "rollout.prompts_per_step=2",
        "rollout.group_size=2", "rollout.max_new_tokens=8", "algo.micro_batch_size=4", "max_steps=2",
        "save_every=0", "eval.k=2", "progress=false", "tensorboard=false"])
    summary = Trainer(cfg).train()
    assert summary["skipped_steps"] == 0 and summary["last"]["loss"] is not None
    # the teacher-forced forward saw the same video inputs as the sampler: ratio 1 on the first epoch
    assert summary["last"]["ratio/mean"] == pytest.approx(1.0, abs=1e-4)


def test_video_frames_are_content_addressed_in_the_run_store(tmp_path):
    from mmrlvr.data.synth_video import make_video_rows
    from mmrlvr.data.loading import rows_to_samples
    from mmrlvr.store.images import ImageStore, resolve_in_run, video_frame_refs

    s = rows_to_samples(make_video_rows("video_count", "train", 1))[0]
    store = ImageStore(tmp_path)
    refs = video_frame_refs(s, store.put)
    assert len(refs) == 1 and len(refs[0]) == 4
    assert video_frame_refs(s, store.put) == refs  # the same frames: the same files, stored once
    frames = s.meta["videos"][0]["frames"]
    for r, f in zip(refs[0], frames):
        assert np.array_equal(np.asarray(Image.open(resolve_in_run(tmp_path, r))), np.asarray(f))
    n_files = len(list((tmp_path / "images").rglob("*.png")))
    assert n_files == len(set(refs[0]))


def test_credit_perturbations_reach_video_frames():
    """perturb_vision perturbs pixel_values_videos in the same patch layout (frames of a clip), seeded."""
    import torch

    from mmrlvr.credit.perturb import PatchLayout, perturb_vision, unpatchify

    ip_like = FrameVideoProcessor(14, 2, 2, [0.5, 0.5, 0.5], [0.5, 0.5, 0.5])
    frames = [Image.new("RGB", (56, 56), (200, 50 * i, 0)) for i in range(4)]
    rows, grid = ip_like.patchify(frames)
    vision = {"pixel_values_videos": torch.tensor(rows), "video_grid_thw": torch.tensor([grid])}
    layout = PatchLayout(patch_size=14, merge_size=2, temporal_patch_size=2, image_mean=(0.5, 0.5, 0.5),
                         image_std=(0.5, 0.5, 0.5))
    a = perturb_vision(vision, "zero", seed=1, layout=layout)
    b = perturb_vision(vision, "zero", seed=1, layout=layout)
    assert torch.equal(a["pixel_values_videos"], b["pixel_values_videos"])
    assert not torch.equal(a["pixel_values_videos"], vision["pixel_values_videos"])
    assert torch.equal(a["video_grid_thw"], vision["video_grid_thw"])
    (clip,) = unpatchify(a["pixel_values_videos"], a["video_grid_thw"], layout)
    assert clip.shape[0] == 4  # 4 frames back, each perturbed


def test_sft_batches_carry_video_inputs(family_model):
    """The warm start's SFT encoding (mmrlvr.models.warmstart) handles video rows: labels on the response
    only, one video grid per example, and the model takes the collated batch."""
    import torch

    from mmrlvr.data.loading import rows_to_samples
    from mmrlvr.data.synth_video import make_video_rows
    from mmrlvr.models.warmstart import collate_sft, encode_sft

    family, model, proc = family_model
    rows = make_video_rows("video_count", "train", 3)
    examples = encode_sft(proc, rows_to_samples(rows), [r["solution"] for r in rows])
    # 4 frames of 56 px (Qwen3-VL: resized to 64): 2 frame pairs x 4x4 patches = 32 patch rows, 8 tokens
    assert all(e["video_grid_thw"].tolist() == [[2, 4, 4]] for e in examples)
    batch = collate_sft(examples, proc.tokenizer.pad_token_id)
    assert batch["video_grid_thw"].shape[0] == 3
    n_resp = [(batch["labels"][i] != -100).sum().item() for i in range(3)]
    assert n_resp == [e["n_resp"] for e in examples]
    with torch.no_grad():
        assert torch.isfinite(model(**batch).loss)
