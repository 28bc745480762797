"""Perturbations of the visual input, applied to the processor's ``pixel_values`` directly.

Vision-sensitive credit (docs/credit.md) compares the policy on the real image I with the policy on a
perturbed image I'. The trainer already holds the processed inputs of every rollout, so perturbing
``pixel_values`` in place of the decoded image avoids a second run of the processor, and the token layout
(number of image tokens, position ids) stays identical between the two passes — only what the vision tower
sees changes.

Qwen-family processors (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) hand over images as flattened patches:

    pixel_values    [num_patches, C * Tp * P * P]   already normalised: (x/255 - mean_c) / std_c
    image_grid_thw  [n_images, 3]                   (t, h, w) in patches; num_patches = sum t*h*w

Rows of one image are ordered (t, h/m, w/m, m, m): the m*m patches of one merge unit (the group the
model merges into one LLM token) are consecutive. Columns are ordered (C, Tp, P, P). A still image is
stored as Tp identical temporal copies (Tp = ``temporal_patch_size`` = 2), so the perturbations below draw
one value per pixel and broadcast it over the temporal copies when the copies are equal, keeping a still
image a still image. Video inputs (``pixel_values_videos``) use the same layout and are perturbed the same way.

Every perturbation is ``fn(pixel_values, grid_thw, *, generator, layout | processor, **params) ->
pixel_values`` (same shape, dtype and device), seeded through a ``torch.Generator`` (on any device: draws
are made on the generator's device and moved), registered in ``PERTURBATIONS``. The layout (patch size,
merge size, normalisation) is read from ``processor`` when no ``layout`` is given.

Not done here: perturbations of the decoded image before the processor (crop, colour jitter, ...), and
layouts other than Qwen's flattened patches (LLaVA-style ``[B, C, H, W]`` pixel values).
"""

from __future__ import annotations

import hashlib
import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable

from mmrlvr.errors import UserError
from mmrlvr.lazy_import import lazy_module
from mmrlvr.registry import Registry

torch = lazy_module("torch")  # config checks read PERTURBATIONS without torch; the perturbations import it
F = lazy_module("torch.nn.functional")

Perturbation = Callable[..., Any]  # fn(pixel_values, grid_thw, *, generator, layout | processor, **params) -> Tensor
PERTURBATIONS: Registry[Perturbation] = Registry("perturbation")

# OpenAI CLIP normalisation used by the Qwen2-VL / Qwen2.5-VL image processors.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class PatchLayout:
    """How a processor flattens images into ``pixel_values`` rows.

    patch_size:          P, spatial side of one patch in pixels (14 for Qwen2/2.5-VL, 16 for Qwen3-VL)
    temporal_patch_size: Tp, frames stacked in one patch (2; a still image is repeated Tp times)
    merge_size:          m, patches merged into one LLM token per side (2 -> 2x2 patches per token)
    image_mean/std:      per-channel normalisation the processor applied, in [0, 1] pixel units
    """

    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    image_mean: tuple[float, ...] = CLIP_MEAN
    image_std: tuple[float, ...] = CLIP_STD

    @property
    def channels(self) -> int:
        return len(self.image_mean)

    @property
    def row_width(self) -> int:
        return self.channels * self.temporal_patch_size * self.patch_size ** 2

    @classmethod
    def from_processor(cls, processor: Any) -> "PatchLayout":
        """Read the layout from a processor or its ``image_processor`` (Qwen2/2.5/3-VL)."""
        ip = getattr(processor, "image_processor", processor)
        mean, std = getattr(ip, "image_mean", CLIP_MEAN), getattr(ip, "image_std", CLIP_STD)
        if isinstance(mean, (int, float)):
            mean = (float(mean),) * 3
        if isinstance(std, (int, float)):
            std = (float(std),) * 3
        return cls(patch_size=int(getattr(ip, "patch_size", 14)),
                   temporal_patch_size=int(getattr(ip, "temporal_patch_size", 2)),
                   merge_size=int(getattr(ip, "merge_size", 2)),
                   image_mean=tuple(float(x) for x in mean), image_std=tuple(float(x) for x in std))

    def black(self, device: torch.device | None = None, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A black pixel (0 in [0, 1] units) in normalised space: (0 - mean_c) / std_c, shape [C].

        ``dtype`` None is float32. For CLIP mean/std that is about (-1.79, -1.75, -1.48)."""
        return torch.tensor([-m / s for m, s in zip(self.image_mean, self.image_std)], device=device,
                            dtype=torch.float32 if dtype is None else dtype)


def _resolve(layout: PatchLayout | None, processor: Any, generator: torch.Generator | None
             ) -> tuple[PatchLayout, torch.Generator]:
    if layout is None:
        if processor is None:
            raise UserError("a perturbation needs the processor's patch layout: pass layout= or processor=")
        layout = PatchLayout.from_processor(processor)
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    return layout, generator


def _rand(kind: str, shape: tuple[int, ...], generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """randn / rand drawn on the generator's device (so a CPU generator works for CUDA inputs), float32."""
    fn = torch.randn if kind == "normal" else torch.rand
    return fn(shape, generator=generator, device=generator.device).to(device)


def _check(pixel_values: torch.Tensor, grid_thw: torch.Tensor, layout: PatchLayout) -> None:
    if pixel_values.dim() != 2 or pixel_values.shape[1] != layout.row_width:
        raise UserError(
            f"pixel_values has shape {tuple(pixel_values.shape)}; expected [num_patches, {layout.row_width}] "
            f"(C={layout.channels} x Tp={layout.temporal_patch_size} x P={layout.patch_size}^2). "
            "Is the PatchLayout read from the same processor that made these pixel values?")
    total = int(grid_thw.prod(-1).sum()) if grid_thw.numel() else 0
    if total != pixel_values.shape[0]:
        raise UserError(f"image_grid_thw covers {total} patches but pixel_values has {pixel_values.shape[0]} rows")


def unpatchify(pixel_values: torch.Tensor, grid_thw: torch.Tensor, layout: PatchLayout) -> list[torch.Tensor]:
    """Rebuild each image (or video) from its rows: a list of [t*Tp, C, h*P, w*P] frame stacks.

    pixel_values: [num_patches, C*Tp*P*P]; grid_thw: [n_images, 3]. Inverse of ``patchify``."""
    _check(pixel_values, grid_thw, layout)
    P, Tp, m, C = layout.patch_size, layout.temporal_patch_size, layout.merge_size, layout.channels
    frames, start = [], 0
    for t, h, w in grid_thw.tolist():
        rows = pixel_values[start:start + t * h * w]  # [t*h*w, C*Tp*P*P]
        start += t * h * w
        x = rows.reshape(t, h // m, w // m, m, m, C, Tp, P, P)
        # (t, bh, bw, mh, mw, C, Tp, ph, pw) -> (t, Tp, C, bh, mh, ph, bw, mw, pw)
        x = x.permute(0, 6, 5, 1, 3, 7, 2, 4, 8)
        frames.append(x.reshape(t * Tp, C, h * P, w * P))
    return frames


def patchify(frames: list[torch.Tensor], layout: PatchLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """Flatten frame stacks [t*Tp, C, H, W] back into (pixel_values [num_patches, C*Tp*P*P], grid_thw [n, 3]).

    Uses the processor's row order (t, h/m, w/m, m, m) and column order (C, Tp, P, P)."""
    P, Tp, m, C = layout.patch_size, layout.temporal_patch_size, layout.merge_size, layout.channels
    rows, grids = [], []
    for x in frames:
        n_frames, c, H, W = x.shape
        if c != C or n_frames % Tp or H % (P * m) or W % (P * m):
            raise UserError(f"frame stack of shape {tuple(x.shape)} does not fit patch {P}, merge {m}, "
                            f"temporal patch {Tp}, {C} channels")
        t, h, w = n_frames // Tp, H // P, W // P
        y = x.reshape(t, Tp, C, h // m, m, P, w // m, m, P)
        y = y.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)  # inverse of unpatchify's permutation
        rows.append(y.reshape(t * h * w, C * Tp * P * P))
        grids.append([t, h, w])
    return torch.cat(rows, 0), torch.tensor(grids, dtype=torch.long, device=frames[0].device)


def _as_cells(pixel_values: torch.Tensor, layout: PatchLayout) -> torch.Tensor:
    """View rows as [num_patches, C, Tp, P*P] (float32 copy) for per-channel / per-frame work."""
    return pixel_values.float().reshape(-1, layout.channels, layout.temporal_patch_size, layout.patch_size ** 2)


def _still(cells: torch.Tensor) -> bool:
    """True when every temporal copy equals the first (a still image, as processors store them)."""
    return bool((cells == cells[:, :, :1]).all())


@PERTURBATIONS.register("gaussian")
def gaussian_noise(pixel_values: torch.Tensor, grid_thw: torch.Tensor, *, generator: torch.Generator | None = None,
                   layout: PatchLayout | None = None, processor: Any = None, std: float = 2.0) -> torch.Tensor:
    """Add N(0, std^2) noise to the normalised pixels (VEPO's default perturbation).

    ``std`` is in normalised units; in [0, 1] pixel units the noise is std * std_c per channel, i.e. with
    CLIP's std (0.269, 0.261, 0.276) the default std=2.0 is about 0.54 (~137 of 255 grey levels). The
    noise is not clipped to the valid pixel range. One draw per pixel, shared by a still image's
    temporal copies. Default 2.0: the value of VEPO's official code (issue 14; was 1.0 [ours] before);
    ``credit.perturbation_params: {std: ...}`` overrides it."""
    layout, generator = _resolve(layout, processor, generator)
    _check(pixel_values, grid_thw, layout)
    cells = _as_cells(pixel_values, layout)  # [n, C, Tp, P*P]
    shape = (cells.shape[0], cells.shape[1], 1 if _still(cells) else cells.shape[2], cells.shape[3])
    noise = _rand("normal", shape, generator, cells.device) * std
    return (cells + noise).reshape(pixel_values.shape).to(pixel_values.dtype)


@PERTURBATIONS.register("zero")
def zero_image(pixel_values: torch.Tensor, grid_thw: torch.Tensor, *, generator: torch.Generator | None = None,
               layout: PatchLayout | None = None, processor: Any = None) -> torch.Tensor:
    """Replace every image by a black one: (0 - mean_c) / std_c per channel in normalised space.

    A literal 0 in normalised space would be the mean colour (a grey), not "no image"; black is the
    counterfactual the papers call the zero image. The generator is unused (deterministic)."""
    layout, _ = _resolve(layout, processor, generator)
    _check(pixel_values, grid_thw, layout)
    cells = _as_cells(pixel_values, layout)
    black = layout.black(cells.device)[None, :, None, None]  # [1, C, 1, 1]
    return black.expand_as(cells).reshape(pixel_values.shape).to(pixel_values.dtype)


@PERTURBATIONS.register("patch_blackout")
def patch_blackout(pixel_values: torch.Tensor, grid_thw: torch.Tensor, *, generator: torch.Generator | None = None,
                   layout: PatchLayout | None = None, processor: Any = None, p: float = 0.5,
                   unit: str = "patch") -> torch.Tensor:
    """Blacken random patches, each with probability ``p`` (0.5 VPPO, 0.6 PAPO).

    unit="patch": one processor patch (P x P pixels, 14 px for Qwen2/2.5-VL — the papers' 14-px patches;
    16 px for Qwen3-VL) per draw. unit="merge": one merge unit (m*m patches = one LLM image token,
    28 x 28 px) per draw, so an image token is either intact or fully black. A blackened patch is black
    in every temporal copy and channel, i.e. (0 - mean_c) / std_c."""
    layout, generator = _resolve(layout, processor, generator)
    _check(pixel_values, grid_thw, layout)
    if not 0.0 <= p <= 1.0:
        raise UserError(f"patch_blackout: p must be in [0, 1], got {p}")
    if unit not in ("patch", "merge"):
        raise UserError(f"patch_blackout: unit must be 'patch' or 'merge', got {unit!r}")
    cells = _as_cells(pixel_values, layout)  # [n, C, Tp, P*P]
    group = 1 if unit == "patch" else layout.merge_size ** 2
    # Rows of one merge unit are consecutive, and every image's row count is a multiple of m*m.
    hit = _rand("uniform", (cells.shape[0] // group,), generator, cells.device) < p
    hit = hit.repeat_interleave(group)[:, None, None, None]  # [n, 1, 1, 1]
    black = layout.black(cells.device)[None, :, None, None]
    return torch.where(hit, black.expand_as(cells), cells).reshape(pixel_values.shape).to(pixel_values.dtype)


def _gaussian_kernel(sigma: float, device: torch.device) -> torch.Tensor:
    radius = max(1, int(math.ceil(3.0 * sigma)))
    x = torch.arange(-radius, radius + 1, device=device, dtype=torch.float32)
    k = torch.exp(-0.5 * (x / sigma) ** 2)
    return k / k.sum()  # [2r+1]


@PERTURBATIONS.register("blur")
def gaussian_blur(pixel_values: torch.Tensor, grid_thw: torch.Tensor, *, generator: torch.Generator | None = None,
                  layout: PatchLayout | None = None, processor: Any = None, sigma: float = 3.0) -> torch.Tensor:
    """Gaussian blur (std ``sigma`` in pixels, kernel radius ceil(3 sigma)) of each rebuilt image.

    The image is rebuilt from its patches (``unpatchify``), blurred with a separable kernel and
    replicate padding, and re-patchified. Blurring the normalised pixels equals normalising the blurred
    image: normalisation is a per-channel affine map and the kernel sums to 1. Deterministic (the
    generator is unused). [ours: sigma default]"""
    layout, _ = _resolve(layout, processor, generator)
    if sigma <= 0:
        return pixel_values.clone()
    frames = unpatchify(pixel_values.float(), grid_thw, layout)
    k = _gaussian_kernel(sigma, pixel_values.device)
    r, C = (k.numel() - 1) // 2, layout.channels
    kx = k.view(1, 1, 1, -1).repeat(C, 1, 1, 1)  # [C, 1, 1, 2r+1]
    ky = k.view(1, 1, -1, 1).repeat(C, 1, 1, 1)  # [C, 1, 2r+1, 1]
    out = []
    for x in frames:  # [F, C, H, W]
        x = F.conv2d(F.pad(x, (r, r, 0, 0), mode="replicate"), kx, groups=C)
        x = F.conv2d(F.pad(x, (0, 0, r, r), mode="replicate"), ky, groups=C)
        out.append(x)
    pv, _ = patchify(out, layout)
    return pv.to(pixel_values.dtype)


def distinct_images(pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> tuple[list[int], list[int]]:
    """Find identical images in a batch (the G rollouts of a prompt carry G copies of its image).

    pixel_values: [num_patches, D]; grid_thw: [n, 3]. Returns (unique, source): ``unique`` lists the index
    of the first copy of every distinct image, ``source[i]`` the position in ``unique`` of image i's
    content. Candidates are bucketed by grid and two cheap sums, then confirmed with ``torch.equal``."""
    sizes = grid_thw.prod(-1).tolist()
    blocks = torch.split(pixel_values, sizes)
    buckets: dict[tuple, list[int]] = {}
    unique: list[int] = []
    source: list[int] = []
    for i, block in enumerate(blocks):
        key = (tuple(grid_thw[i].tolist()), float(block.sum()), float(block[::7].sum()))
        for u in buckets.get(key, []):
            if torch.equal(blocks[unique[u]], block):
                source.append(u)
                break
        else:
            buckets.setdefault(key, []).append(len(unique))
            source.append(len(unique))
            unique.append(i)
    return unique, source


def image_seed(seed: int, block: torch.Tensor, grid_row: torch.Tensor) -> int:
    """The perturbation seed of one image: a function of (``seed``, the image's content and grid), not of its
    position in the batch, so an image gets the same perturbation whichever rank, row or batch it is in."""
    h = hashlib.blake2b(digest_size=8)
    h.update(int(seed).to_bytes(8, "little", signed=True))
    h.update(grid_row.detach().cpu().to(torch.int64).numpy().tobytes())
    h.update(block.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return int.from_bytes(h.digest(), "little") & ((1 << 63) - 1)


def _per_distinct(fn: Perturbation, pv: torch.Tensor, grid: torch.Tensor, *, seed: int, **kwargs: Any) -> torch.Tensor:
    """Apply ``fn`` once per distinct image, each with its own generator seeded by ``image_seed``, and copy the
    result to every copy of that image."""
    unique, source = distinct_images(pv, grid)
    blocks = torch.split(pv, grid.prod(-1).tolist())
    out = []
    for i in unique:
        gen = torch.Generator(device=pv.device)
        gen.manual_seed(image_seed(seed, blocks[i], grid[i]))
        out.append(fn(blocks[i], grid[i:i + 1], generator=gen, **kwargs))
    return torch.cat([out[u] for u in source])


def perturb_vision(vision: dict[str, Any], name: str, *, seed: int, layout: PatchLayout | None = None,
                   processor: Any = None, **params: Any) -> dict[str, Any]:
    """Return a copy of the model's vision inputs with ``pixel_values`` (and ``pixel_values_videos``)
    perturbed by the registered perturbation ``name``; every other entry is passed through unchanged.

    vision: e.g. ``RolloutBatch.vision`` = {"pixel_values": [n, C*Tp*P*P], "image_grid_thw": [k, 3], ...}.
    Each distinct image is perturbed with its own generator (on the tensor's device) seeded by ``seed`` and
    the image's content (``image_seed``): the same seed gives the same perturbation, identical images (the G
    rollouts of one prompt) get the identical perturbation — the counterfactual is "this prompt with image
    I'", and the extra forward can run the vision tower once per distinct image — and an image's
    perturbation does not depend on which other images share the batch, so N processes, each with its share
    of the step's prompts, perturb exactly what one process does."""
    fn = PERTURBATIONS.get(name)
    accepted = [k for k, v in inspect.signature(fn).parameters.items()
                if v.kind is v.KEYWORD_ONLY and k not in ("generator", "layout", "processor")]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise UserError(f"perturbation {name!r} has no parameter(s) {unknown}; it takes {accepted or 'none'}")
    out = dict(vision)
    for key, grid_key in (("pixel_values", "image_grid_thw"), ("pixel_values_videos", "video_grid_thw")):
        pv = vision.get(key)
        if pv is None:
            continue
        if vision.get(grid_key) is None:
            raise UserError(f"vision inputs have {key!r} but no {grid_key!r}; cannot perturb them")
        out[key] = _per_distinct(fn, pv, vision[grid_key], seed=seed, layout=layout, processor=processor, **params)
    return out
