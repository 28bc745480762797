"""Qwen-VL video inputs without torchvision: sampled frames -> ``pixel_values_videos`` + ``video_grid_thw``.

transformers' ``Qwen2VLVideoProcessor`` / ``Qwen3VLVideoProcessor`` need torchvision, which does not
import beside the CPU torch, so the image-only processors of ``mmrlvr.models.compat`` have no
video processor at all. ``FrameVideoProcessor`` is a small numpy stand-in for *already sampled and
resized* frames (``mmrlvr.data.video``), producing the stock processors' exact layout:

- frames are rescaled (1/255) and normalised with the image processor's mean / std;
- the frame count is padded to a multiple of ``temporal_patch_size`` by repeating the last frame;
- ``video_grid_thw = [T / temporal_patch_size, H / patch, W / patch]`` and the patches are flattened in
  the stock ``patchify`` order: (t, h-block, w-block, h-in-merge, w-in-merge) rows of
  (channel, temporal, patch-row, patch-col) values - so a 2-frame clip of one still image gives exactly
  the rows the image processor gives for that image (tests/test_data_video.py checks this);
- ``video_metadata`` (``transformers.video_utils.VideoMetadata``: source fps, frame indices) lets the
  stock processors do the rest: the ``<|video_pad|>`` expansion (T*H*W/merge^2 tokens for Qwen2/2.5-VL;
  Qwen3-VL's per-frame ``<t seconds>`` timestamps) and Qwen2.5-VL's ``second_per_grid_ts``.

``ensure_video_processor(processor)`` attaches one to a processor that has none (with torchvision the
stock video processor is kept), and ``video_processor_kwargs(samples)`` builds the ``videos`` /
``video_metadata`` arguments for a batch of samples.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image


class FrameVideoProcessor:
    """A torch-free video processor for pre-sampled frames (see the module docstring)."""

    model_input_names = ["pixel_values_videos", "video_grid_thw"]

    def __init__(self, patch_size: int, merge_size: int, temporal_patch_size: int, image_mean: Any,
                 image_std: Any) -> None:
        self.patch_size, self.merge_size, self.temporal_patch_size = patch_size, merge_size, temporal_patch_size
        self.image_mean = np.asarray(image_mean, dtype=np.float32).reshape(1, 3, 1, 1)
        self.image_std = np.asarray(image_std, dtype=np.float32).reshape(1, 3, 1, 1)

    @classmethod
    def like(cls, image_processor: Any) -> "FrameVideoProcessor":
        return cls(image_processor.patch_size, image_processor.merge_size, image_processor.temporal_patch_size,
                   image_processor.image_mean, image_processor.image_std)

    def patchify(self, frames: list[Image.Image]) -> tuple[np.ndarray, list[int]]:
        """(patch rows [t*h*w, C*tps*p*p], [t, h, w]) of one video's frames."""
        size = frames[0].size
        if any(f.size != size for f in frames):
            raise ValueError(f"all frames of a video must have one size, got {sorted({f.size for f in frames})}")
        p, m, tps = self.patch_size, self.merge_size, self.temporal_patch_size
        w, h = size
        if h % (p * m) or w % (p * m):  # e.g. 56-px frames for Qwen3-VL (factor 32): resize as the stock one does
            from mmrlvr.data.images import smart_resize

            nh, nw = smart_resize(h, w, factor=p * m, min_pixels=(p * m) ** 2, max_pixels=max(h * w * 4, (p * m) ** 2))
            frames = [f.resize((nw, nh), Image.Resampling.BICUBIC) for f in frames]
            w, h = nw, nh
        x = np.stack([np.asarray(f.convert("RGB"), dtype=np.float32) for f in frames]) / 255.0  # [T, H, W, C]
        x = x.transpose(0, 3, 1, 2)  # [T, C, H, W]
        x = (x - self.image_mean) / self.image_std
        if pad := -x.shape[0] % tps:
            x = np.concatenate([x, np.repeat(x[-1:], pad, axis=0)], axis=0)
        t, c = x.shape[0], x.shape[1]
        gt, gh, gw = t // tps, h // p, w // p
        x = x.reshape(gt, tps, c, gh // m, m, p, gw // m, m, p)
        x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # the stock patchify permutation, without the batch axis
        return x.reshape(gt * gh * gw, c * tps * p * p), [gt, gh, gw]

    def __call__(self, videos: Any, video_metadata: Any = None, return_tensors: Any = None, **_: Any) -> Any:
        from transformers.feature_extraction_utils import BatchFeature
        from transformers.video_utils import VideoMetadata

        videos = [list(v) for v in videos]
        rows, grids = [], []
        for frames in videos:
            r, g = self.patchify(frames)
            rows.append(r)
            grids.append(g)
        out = BatchFeature({"pixel_values_videos": np.concatenate(rows, axis=0),
                            "video_grid_thw": np.asarray(grids, dtype=np.int64)}, tensor_type=return_tensors)
        metas = list(video_metadata) if video_metadata is not None else [None] * len(videos)
        out["video_metadata"] = [m if isinstance(m, VideoMetadata) else VideoMetadata(
            **(m or {"total_num_frames": len(f), "fps": 2.0, "frames_indices": list(range(len(f)))}))
            for m, f in zip(metas, videos)]
        return out


def ensure_video_processor(processor: Any) -> Any:
    """Give ``processor`` a video processor when it has none (torchvision missing); returns it.

    Also upgrades the chat template of tiny models built before video support (their template dropped
    video parts, so a video prompt would carry no ``<|video_pad|>``): ``upgrade_tiny_template``; every other
    template is left alone.
    """
    if getattr(processor, "video_processor", None) is None and hasattr(processor, "image_processor"):
        processor.video_processor = FrameVideoProcessor.like(processor.image_processor)
    from mmrlvr.models.tiny import upgrade_tiny_template

    upgrade_tiny_template(processor)
    return processor


def video_metadata(video: dict[str, Any]) -> Any:
    """``VideoMetadata`` of one loaded video (``mmrlvr.data.video.load_video``'s dict)."""
    from transformers.video_utils import VideoMetadata

    n = len(video["frames"])
    return VideoMetadata(total_num_frames=int(video.get("n_source_frames", n)),
                         fps=float(video.get("source_fps", video["fps"])),
                         frames_indices=list(video.get("indices", range(n))),
                         width=video["frames"][0].size[0], height=video["frames"][0].size[1])


def video_processor_kwargs(samples: list[Any]) -> dict[str, Any]:
    """``videos`` / ``video_metadata`` processor arguments for the videos of ``samples`` (in order); {} if none."""
    videos = [v for s in samples for v in (s.meta.get("videos") or [])]
    if not videos:
        return {}
    return {"videos": [v["frames"] for v in videos], "video_metadata": [video_metadata(v) for v in videos],
            "do_sample_frames": False}


VIDEO_KEYS: tuple[str, ...] = ("pixel_values_videos", "video_grid_thw", "second_per_grid_ts")


def slice_video_rows(inputs: dict[str, Any], rows: slice, videos_per_row: list[int]) -> dict[str, Any]:
    """The video entries of N-row model inputs for ``rows`` (a micro-batch), in the Qwen flat layout.

    ``pixel_values_videos`` holds every video's patch rows back to back and ``video_grid_thw`` /
    ``second_per_grid_ts`` one entry per video, so a micro-batch must take exactly its rows' videos (the
    image analogue is ``mmrlvr.train.forward.slice_inputs``). Returns only the keys present.
    """
    grid = inputs.get("video_grid_thw")
    if grid is None:
        return {}
    v0, v1 = sum(videos_per_row[:rows.start]), sum(videos_per_row[:rows.stop])
    patches = [int(x) for x in grid.prod(-1).tolist()]
    p0, p1 = sum(patches[:v0]), sum(patches[:v1])
    out: dict[str, Any] = {"video_grid_thw": grid[v0:v1]}
    if "pixel_values_videos" in inputs:
        out["pixel_values_videos"] = inputs["pixel_values_videos"][p0:p1]
    if "second_per_grid_ts" in inputs:
        out["second_per_grid_ts"] = inputs["second_per_grid_ts"][v0:v1]
    return out
