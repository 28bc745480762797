"""Load dataset images from whatever a row holds, and size them the way Qwen-VL models expect.

Accepted image values (``load_image``): a PIL image; raw bytes; a Hugging Face ``Image`` feature value
``{"bytes": ..., "path": ...}`` (bytes win when both are set); a path string (relative paths are resolved
against ``base_dir``, usually the dataset's folder; ``file://`` prefixes are accepted); a base64 data URL
(``data:image/png;base64,...``) or raw base64 text of a PNG/JPEG/GIF/WebP/BMP file; a dict with ``url`` /
``image`` / ``image_url`` (OpenAI content parts); an ``HxWxC`` uint8 numpy array. Everything comes back as RGB; transparent
images are composited on white (as qwen-vl-utils does) rather than having their alpha dropped to black.

Sizing (``smart_resize``) follows qwen-vl-utils' rule so that the number of visual tokens is under control:
both sides become multiples of ``factor`` (28 = patch 14 x merge 2 for Qwen2/2.5-VL; Qwen3-VL uses 32),
rounded to the nearest multiple, and the area is scaled into [min_pixels, max_pixels] keeping the aspect
ratio (floor when shrinking, ceil when growing). We implement the formula here instead of importing
``qwen_vl_utils`` because that package imports torchvision at module top (absent on CPU installs) and would pull in
transformers through our compat shim just to do arithmetic; tests check our function against
qwen-vl-utils' own through ``mmrlvr.models.compat.import_qwen_vl_utils`` when that is importable.

Safety: an image whose header claims more than ``max_image_pixels`` pixels is refused before it is
decoded (decompression-bomb protection). URLs (http/https) are refused: nothing is downloaded at run time.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
import warnings
from pathlib import Path
from typing import Any

from PIL import Image

from mmrlvr.errors import DataError

IMAGE_FACTOR = 28  # Qwen2-VL / Qwen2.5-VL: 14-px patches merged 2x2; Qwen3-VL: 32
DEFAULT_MIN_PIXELS = 4 * 28 * 28  # qwen-vl-utils' default
DEFAULT_MAX_PIXELS = 1280 * 28 * 28  # 1,003,520: at most 1280 visual tokens at factor 28 (a common RL setting)
DEFAULT_MAX_IMAGE_PIXELS = 50_000_000  # refuse anything bigger than ~7000x7000 before decoding
MAX_ASPECT_RATIO = 200  # as qwen-vl-utils: beyond this one side would round to nothing


def _round_by(x: float, factor: int) -> int:
    return round(x / factor) * factor


def _floor_by(x: float, factor: int) -> int:
    return math.floor(x / factor) * factor


def _ceil_by(x: float, factor: int) -> int:
    return math.ceil(x / factor) * factor


def smart_resize(height: int, width: int, factor: int = IMAGE_FACTOR, min_pixels: int = DEFAULT_MIN_PIXELS,
                 max_pixels: int = DEFAULT_MAX_PIXELS) -> tuple[int, int]:
    """(new_height, new_width): multiples of ``factor``, area within [min_pixels, max_pixels], aspect kept.

    >>> smart_resize(112, 112)           # already a multiple of 28: unchanged
    (112, 112)
    >>> smart_resize(112, 112, factor=32)  # 112/32 = 3.5 rounds to 4 -> 128
    (128, 128)
    >>> smart_resize(2000, 1000, max_pixels=200_000)  # shrink: sqrt(2e6/2e5) = 3.16 -> 632x316, floored to 28s
    (616, 308)
    """
    if height <= 0 or width <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise ValueError(f"aspect ratio must be at most {MAX_ASPECT_RATIO}, got {width}x{height}")
    if min_pixels > max_pixels:
        raise ValueError(f"min_pixels {min_pixels} is larger than max_pixels {max_pixels}")
    h = max(factor, _round_by(height, factor))
    w = max(factor, _round_by(width, factor))
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, _floor_by(height / beta, factor))
        w = max(factor, _floor_by(width / beta, factor))
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = _ceil_by(height * beta, factor)
        w = _ceil_by(width * beta, factor)
    return h, w


def resize_image(image: Image.Image, factor: int = IMAGE_FACTOR, min_pixels: int = DEFAULT_MIN_PIXELS,
                 max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """``image`` resized to ``smart_resize`` of its size (bicubic); the same object if already that size."""
    h, w = smart_resize(image.height, image.width, factor, min_pixels, max_pixels)
    if (w, h) == image.size:
        return image
    return image.resize((w, h), Image.Resampling.BICUBIC)


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB, with any transparency composited on a white background."""
    if image.mode == "RGB":
        return image
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.split()[3])
        return background
    return image.convert("RGB")


def _check_pixels(width: int, height: int, limit: int, what: str) -> None:
    if width * height > limit:
        raise DataError(f"{what} is {width}x{height} = {width * height:,} pixels, over the limit of "
                        f"{limit:,} (max_image_pixels); refusing to decode it")


def _decode(data: bytes, what: str, max_image_pixels: int) -> Image.Image:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # we apply our own limit below
            image = Image.open(io.BytesIO(data))
            _check_pixels(image.width, image.height, max_image_pixels, what)
            image.load()
    except DataError:
        raise
    except Image.DecompressionBombError as exc:
        raise DataError(f"{what} is too large to decode safely ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError, ... for bad data
        raise DataError(f"{what} could not be decoded as an image ({type(exc).__name__}: {exc})") from None
    return image


def _from_data_url(url: str, max_image_pixels: int) -> Image.Image:
    head, _, payload = url.partition(",")
    if not head.endswith(";base64") or not payload:
        raise DataError(f"data URL {head[:40]!r} is not a base64 image (expected data:image/...;base64,...)")
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise DataError(f"data URL holds invalid base64 ({exc})") from None
    return _decode(data, "base64 image", max_image_pixels)


def _from_path(path_text: str, base_dir: str | Path | None, max_image_pixels: int) -> Image.Image:
    if path_text.startswith("file://"):
        path_text = path_text[len("file://"):]
    path = Path(path_text).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    if not path.is_file():
        raise DataError(f"image file not found: {path}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"image file {path} could not be read ({exc})") from None
    return _decode(data, f"image file {path}", max_image_pixels)


_BASE64_RE = re.compile(r"^[A-Za-z0-9+/\s]+={0,2}$")
# the first base64 characters of PNG, JPEG, GIF, WebP and BMP files
_BASE64_MAGIC = ("iVBORw0KGgo", "/9j/", "R0lGOD", "UklGR", "Qk")


def _looks_like_base64(text: str, base_dir: str | Path | None) -> bool:
    """Raw base64 image data (no ``data:`` prefix): long, base64 alphabet, an image magic number, not a file."""
    if len(text) < 64 or not _BASE64_RE.match(text[:4096]) or not text.startswith(_BASE64_MAGIC):
        return False
    path = Path(text if len(text) < 1024 else "/nonexistent")
    return not (path.is_file() or (base_dir is not None and len(text) < 1024 and (Path(base_dir) / text).is_file()))


def load_image(value: Any, base_dir: str | Path | None = None,
               max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> Image.Image:
    """One RGB image from a row value (see the module docstring for accepted forms).

    Raises ``DataError`` (without row/field; the loaders add them) for a missing file, undecodable bytes,
    invalid base64, an image over ``max_image_pixels``, a URL, or a value of another type.
    """
    if isinstance(value, Image.Image):
        _check_pixels(value.width, value.height, max_image_pixels, "image")
        return to_rgb(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return to_rgb(_decode(bytes(value), "image bytes", max_image_pixels))
    if isinstance(value, dict):
        data = value.get("bytes")
        if isinstance(data, str) and data:  # a JSON export of an Image feature: bytes as base64 text
            return load_image(data if data.startswith("data:") else "data:image/*;base64," + data, base_dir,
                              max_image_pixels)
        if data:
            return to_rgb(_decode(bytes(data), "image bytes", max_image_pixels))
        for key in ("path", "image", "url", "image_url"):
            inner = value.get(key)
            if isinstance(inner, dict):  # OpenAI: {"image_url": {"url": ...}}
                inner = inner.get("url")
            if inner:
                return load_image(inner, base_dir, max_image_pixels)
        raise DataError(f"image dict has neither 'bytes' nor 'path' (keys: {sorted(value)})")
    if isinstance(value, str):
        text = value.strip()
        if not text:
            raise DataError("image path is empty")
        if text.startswith("data:"):
            return to_rgb(_from_data_url(text, max_image_pixels))
        if text.startswith(("http://", "https://", "s3://", "gs://", "hf://")):
            raise DataError(f"image {text[:80]!r} is a URL; nothing is downloaded at run time: download the "
                            "images first and point the column at the local files")
        if _looks_like_base64(text, base_dir):
            return to_rgb(_from_data_url("data:image/*;base64," + "".join(text.split()), max_image_pixels))
        return to_rgb(_from_path(text, base_dir, max_image_pixels))
    if type(value).__module__ == "numpy" and getattr(value, "ndim", 0) in (2, 3):
        _check_pixels(value.shape[1], value.shape[0], max_image_pixels, "image array")
        try:
            return to_rgb(Image.fromarray(value))
        except Exception as exc:  # noqa: BLE001
            raise DataError(f"image array of shape {value.shape} and dtype {value.dtype} is not an image ({exc})") from None
    raise DataError(f"cannot read an image from a value of type {type(value).__name__}")


def prepare_image(value: Any, base_dir: str | Path | None = None, *, factor: int = IMAGE_FACTOR,
                  min_pixels: int = DEFAULT_MIN_PIXELS, max_pixels: int = DEFAULT_MAX_PIXELS,
                  max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS) -> tuple[Image.Image, tuple[int, int]]:
    """Load and resize one image; returns (image, original (width, height))."""
    image = load_image(value, base_dir, max_image_pixels)
    original = image.size
    try:
        resized = resize_image(image, factor, min_pixels, max_pixels)
    except ValueError as exc:
        raise DataError(f"image of size {original[0]}x{original[1]} cannot be resized: {exc}") from None
    return resized, original
