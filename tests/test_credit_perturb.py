"""Perturbations of Qwen-layout pixel values: exact patch round trips on a real image processor's output,
seeding, shape preservation, and what each perturbation does to the pixels."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from mmrlvr.credit import PERTURBATIONS, PatchLayout, patchify, perturb_vision, unpatchify
from mmrlvr.errors import UserError


@pytest.fixture(scope="module")
def processor():
    return Qwen2VLImageProcessorPil(size={"shortest_edge": 56 * 56, "longest_edge": 112 * 112})


@pytest.fixture(scope="module")
def images():
    rng = np.random.RandomState(0)
    # 84x112 and 56x56 are multiples of 28 (patch 14 x merge 2), so the processor does not resize them.
    return [Image.fromarray(rng.randint(0, 256, (84, 112, 3), dtype=np.uint8)),
            Image.fromarray(rng.randint(0, 256, (56, 56, 3), dtype=np.uint8))]


@pytest.fixture(scope="module")
def processed(processor, images):
    out = processor(images, return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


@pytest.fixture(scope="module")
def layout(processor):
    return PatchLayout.from_processor(processor)


def test_layout_read_from_processor(layout):
    assert (layout.patch_size, layout.temporal_patch_size, layout.merge_size) == (14, 2, 2)
    assert layout.row_width == 3 * 2 * 14 * 14
    # black = (0 - mean) / std: red channel -0.48145466 / 0.26862954 = -1.79226...
    torch.testing.assert_close(layout.black()[0], torch.tensor(-1.7922625), atol=1e-5, rtol=0)


def test_unpatchify_rebuilds_the_normalised_image(processed, images, layout):
    pv, grid = processed
    assert grid.tolist() == [[1, 6, 8], [1, 4, 4]]  # 84/14 x 112/14, 56/14 x 56/14
    frames = unpatchify(pv, grid, layout)
    assert [tuple(f.shape) for f in frames] == [(2, 3, 84, 112), (2, 3, 56, 56)]
    for img, f in zip(images, frames):
        ref = np.asarray(img, dtype=np.float32).transpose(2, 0, 1) / 255.0  # [3, H, W]
        mean = np.array(layout.image_mean, dtype=np.float32)[:, None, None]
        std = np.array(layout.image_std, dtype=np.float32)[:, None, None]
        expected = torch.from_numpy((ref - mean) / std)
        torch.testing.assert_close(f[0], expected, atol=1e-5, rtol=1e-5)
        assert torch.equal(f[0], f[1])  # a still image: both temporal copies equal


def test_patchify_round_trip_is_exact(processed, layout):
    pv, grid = processed
    pv2, grid2 = patchify(unpatchify(pv, grid, layout), layout)
    assert torch.equal(pv2, pv)
    assert torch.equal(grid2, grid)


def test_round_trip_for_a_video_layout(layout):
    # Two temporal groups (4 frames), 2x4 patches: every frame different, exact inverse both ways.
    frames = [torch.randn(4, 3, 28, 56, generator=torch.Generator().manual_seed(1))]
    pv, grid = patchify(frames, layout)
    assert grid.tolist() == [[2, 2, 4]] and pv.shape == (16, layout.row_width)
    assert torch.equal(unpatchify(pv, grid, layout)[0], frames[0])


@pytest.mark.parametrize("name,params", [("gaussian", {}), ("zero", {}), ("patch_blackout", {"p": 0.5}),
                                         ("patch_blackout", {"p": 0.6, "unit": "merge"}),
                                         ("blur", {"sigma": 2.0})])
def test_perturbations_are_seeded_and_shape_preserving(processed, layout, name, params):
    pv, grid = processed
    fn = PERTURBATIONS.get(name)
    a = fn(pv, grid, generator=torch.Generator().manual_seed(7), layout=layout, **params)
    b = fn(pv, grid, generator=torch.Generator().manual_seed(7), layout=layout, **params)
    assert a.shape == pv.shape and a.dtype == pv.dtype
    assert torch.equal(a, b)
    assert not torch.equal(a, pv)
    if name in ("gaussian", "patch_blackout"):
        c = fn(pv, grid, generator=torch.Generator().manual_seed(8), layout=layout, **params)
        assert not torch.equal(a, c)


def test_gaussian_noise_std_and_still_image(processed, layout):
    pv, grid = processed
    out = PERTURBATIONS.get("gaussian")(pv, grid, generator=torch.Generator().manual_seed(0), layout=layout,
                                        std=0.5)
    noise = out - pv  # 112 patches x 1176 values, half of them the temporal copy
    assert abs(float(noise.std()) - 0.5) < 0.01
    # one draw per pixel, shared by the two temporal copies of the still image
    frames = unpatchify(out, grid, layout)
    assert all(torch.equal(f[0], f[1]) for f in frames)


def test_zero_is_black_in_normalised_space(processed, layout):
    pv, grid = processed
    out = PERTURBATIONS.get("zero")(pv, grid, layout=layout)
    frames = unpatchify(out, grid, layout)
    for f in frames:
        for c in range(3):  # every pixel of channel c equals (0 - mean_c) / std_c
            assert torch.allclose(f[:, c], layout.black()[c].expand_as(f[:, c]))


def test_patch_blackout_fraction_and_units(layout):
    # 1 image of 224x224 -> 16x16 = 256 patches of random content
    frames = [torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(2)).repeat(2, 1, 1, 1)]
    pv, grid = patchify(frames, layout)
    black = layout.black()
    fn = PERTURBATIONS.get("patch_blackout")
    out = fn(pv, grid, generator=torch.Generator().manual_seed(0), layout=layout, p=0.6)
    is_black = torch.tensor([torch.allclose(r.view(3, -1), black[:, None].expand(3, 2 * 14 * 14))
                             for r in out])
    unchanged = (out == pv).all(-1)
    assert bool((is_black ^ unchanged).all())  # every patch is either fully black or untouched
    assert 0.5 < float(is_black.float().mean()) < 0.7  # ~p = 0.6 of 256 patches
    merged = fn(pv, grid, generator=torch.Generator().manual_seed(0), layout=layout, p=0.5, unit="merge")
    hit = (merged != pv).any(-1).view(-1, 4)  # rows of one merge unit are consecutive
    assert bool((hit.all(-1) | ~hit.any(-1)).all())  # a 2x2 unit is all black or all intact
    assert torch.equal(fn(pv, grid, layout=layout, p=0.0), pv)
    with pytest.raises(UserError):
        fn(pv, grid, layout=layout, p=1.5)


def test_blur_keeps_constants_and_smooths(layout):
    const = [torch.full((2, 3, 56, 56), 0.7)]
    pv, grid = patchify(const, layout)
    out = PERTURBATIONS.get("blur")(pv, grid, layout=layout, sigma=2.0)
    torch.testing.assert_close(out, pv)  # a blur of a constant image is the same constant
    noisy = [torch.randn(1, 3, 56, 56, generator=torch.Generator().manual_seed(3)).repeat(2, 1, 1, 1)]
    pv, grid = patchify(noisy, layout)
    out = PERTURBATIONS.get("blur")(pv, grid, layout=layout, sigma=2.0)
    assert float(out.std()) < 0.5 * float(pv.std())
    torch.testing.assert_close(out.mean(), pv.mean(), atol=0.05, rtol=0)


def test_perturb_vision_copies_and_validates(processed, processor):
    pv, grid = processed
    vision = {"pixel_values": pv, "image_grid_thw": grid, "other": 1}
    a = perturb_vision(vision, "gaussian", seed=3, processor=processor)
    b = perturb_vision(vision, "gaussian", seed=3, processor=processor)
    assert torch.equal(a["pixel_values"], b["pixel_values"]) and a["image_grid_thw"] is grid
    assert a["other"] == 1 and vision["pixel_values"] is pv  # the input dict is untouched
    with pytest.raises(UserError, match="no parameter"):
        perturb_vision(vision, "gaussian", seed=3, processor=processor, sigma=1.0)
    with pytest.raises(UserError, match="layout"):
        perturb_vision(vision, "gaussian", seed=3)
    with pytest.raises(KeyError, match="known"):
        perturb_vision(vision, "nope", seed=3, processor=processor)


def test_wrong_layout_is_a_clear_error(processed):
    pv, grid = processed
    qwen3 = PatchLayout(patch_size=16, image_mean=(0.5,) * 3, image_std=(0.5,) * 3)
    with pytest.raises(UserError, match="expected"):
        PERTURBATIONS.get("gaussian")(pv, grid, layout=qwen3)


def test_distinct_images_groups_copies(processed):
    from mmrlvr.credit.perturb import distinct_images

    pv, grid = processed  # two different images a, b
    blocks = torch.split(pv, grid.prod(-1).tolist())
    order = [0, 0, 1, 0, 1]  # a a b a b
    pv5 = torch.cat([blocks[i] for i in order])
    unique, source = distinct_images(pv5, grid[order])
    assert unique == [0, 2] and source == [0, 0, 1, 0, 1]
