"""Image loading from every accepted form, smart_resize, and the pixel limit."""

from __future__ import annotations

import base64
import io
import random

import numpy as np
import pytest
from PIL import Image

from mmrlvr.data.images import load_image, prepare_image, resize_image, smart_resize
from mmrlvr.errors import DataError


def _png(size=(30, 20), colour=(10, 200, 30), mode="RGB") -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, colour).save(buf, format="PNG")
    return buf.getvalue()


@pytest.mark.parametrize("hw, kwargs, expected", [
    ((112, 112), {}, (112, 112)),  # multiples of 28 stay
    ((112, 112), {"factor": 32}, (128, 128)),  # 112/32 = 3.5 -> round to 4 -> 128 (Qwen3-VL)
    ((100, 200), {}, (112, 196)),  # 100/28 = 3.57 -> 4*28 = 112; 200/28 = 7.14 -> 7*28 = 196
    ((10, 10), {}, (56, 56)),  # 28*28 = 784 < min 3136: beta = sqrt(3136/100) = 5.6 -> 56
    ((2000, 1000), {"max_pixels": 200_000}, (616, 308)),  # beta = sqrt(2e6/2e5) = 3.162; 632.5 -> 616, 316 -> 308
])
def test_smart_resize_hand_worked(hw, kwargs, expected):
    assert smart_resize(*hw, **kwargs) == expected


def test_smart_resize_matches_qwen_vl_utils():
    compat = pytest.importorskip("mmrlvr.models.compat")
    q = compat.import_qwen_vl_utils()
    rng = random.Random(0)
    checked = 0
    for _ in range(3000):
        h, w = rng.randint(1, 4000), rng.randint(1, 4000)
        if max(h, w) / min(h, w) > 200:
            continue
        factor = rng.choice([28, 32])
        lo, hi = rng.choice([(3136, 1003520), (256 * 28 * 28, 1280 * 28 * 28), (3136, 200_000)])
        theirs = q.smart_resize(h, w, factor, lo, hi)
        if 0 in theirs:  # qwen-vl-utils can floor a thin side to 0; we keep at least one factor
            assert min(smart_resize(h, w, factor, lo, hi)) == factor
            continue
        assert smart_resize(h, w, factor, lo, hi) == theirs, (h, w, factor, lo, hi)
        checked += 1
    assert checked > 2000


def test_resize_keeps_object_when_size_fits():
    img = Image.new("RGB", (112, 56))
    assert resize_image(img) is img
    assert resize_image(Image.new("RGB", (100, 200))).size == (112, 196)  # (w, h) of smart_resize(200, 100)


def test_load_from_every_form(tmp_path):
    data = _png()
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.png").write_bytes(data)
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    forms = [
        data, bytearray(data), {"bytes": data, "path": None}, {"bytes": None, "path": "sub/a.png"},
        "sub/a.png", str(tmp_path / "sub" / "a.png"), "file://" + str(tmp_path / "sub" / "a.png"), url,
        Image.open(io.BytesIO(data)), np.full((20, 30, 3), (10, 200, 30), dtype=np.uint8),
    ]
    for value in forms:
        img = load_image(value, base_dir=tmp_path)
        assert img.mode == "RGB" and img.size == (30, 20), type(value)
        assert img.getpixel((0, 0)) == (10, 200, 30), type(value)


def test_transparent_image_goes_on_white():
    img = load_image(_png(colour=(255, 0, 0, 0), mode="RGBA"))  # fully transparent red
    assert img.getpixel((3, 3)) == (255, 255, 255)
    grey = load_image(Image.new("L", (4, 4), 7))
    assert grey.getpixel((0, 0)) == (7, 7, 7)


@pytest.mark.parametrize("value, message", [
    ("missing.png", "image file not found"),
    (b"not an image at all", "could not be decoded"),
    (_png()[:40], "could not be decoded"),  # truncated PNG
    ("data:image/png;base64,@@@", "invalid base64"),
    ("data:image/png,abc", "not a base64 image"),
    ("https://example.com/a.png", "is a URL"),
    ({"bytes": None, "path": None}, "neither 'bytes' nor 'path'"),
    (3.5, "cannot read an image from a value of type float"),
    ("", "empty"),
])
def test_bad_image_values(tmp_path, value, message):
    with pytest.raises(DataError, match=message):
        load_image(value, base_dir=tmp_path)


def test_pixel_limit_refuses_before_decoding():
    big = _png(size=(3000, 3000))  # a flat PNG: tiny on disk, 9 M pixels decoded
    assert len(big) < 100_000
    with pytest.raises(DataError, match="3000x3000 = 9,000,000 pixels, over the limit of 1,000,000"):
        load_image(big, max_image_pixels=1_000_000)
    with pytest.raises(DataError, match="over the limit"):
        load_image(Image.new("RGB", (2000, 1000)), max_image_pixels=1_000_000)
    assert load_image(big, max_image_pixels=10_000_000).size == (3000, 3000)


def test_prepare_image_reports_original_size_and_refuses_extreme_aspect():
    img, original = prepare_image(Image.new("RGB", (200, 100)))
    assert original == (200, 100) and img.size == (196, 112)
    with pytest.raises(DataError, match="aspect ratio"):
        prepare_image(Image.new("RGB", (5000, 10)))
