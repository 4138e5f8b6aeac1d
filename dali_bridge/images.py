"""Reading and decoding one image file: the pieces both backends share.

``probe`` reads only the header (size after EXIF orientation) — the DALI feeder needs it to
draw crop windows before DALI decodes. ``decode_rgb`` is the torchvision decoder (libjpeg-turbo,
bit-identical to DALI's CPU decoder): RGB for grayscale/CMYK/PNG inputs, EXIF orientation applied.
"""
from __future__ import annotations

import io

import numpy as np

# EXIF orientations 5-8 transpose the image: stored width becomes displayed height.
_TRANSPOSING = {5, 6, 7, 8}
_EXIF_ORIENTATION = 0x0112


class ImageError(ValueError):
    """The bytes are not a readable image; the message is the reason users see."""


class SampleError(RuntimeError):
    """A sample could not be read or decoded (``on_error: raise``): names its index, file and reason."""

    def __init__(self, index: int, path: str, reason: str):
        self.index, self.path, self.reason = index, path, reason
        super().__init__(f"sample {index} ({path}): {reason}")


def read_bytes(path: str) -> bytes:
    """The file's bytes; OSError reasons (missing, permission) become :class:`ImageError`."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ImageError(f"cannot read file: {exc.strerror or exc}") from None
    if not data:
        raise ImageError("empty file (0 bytes)")
    return data


def probe(data: bytes) -> tuple[int, int]:
    """(height, width) in pixels as decoded with EXIF orientation applied; reads the header only."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            orientation = 1
            if image.format in ("JPEG", "MPO", "WEBP", "PNG", "TIFF") and "exif" in image.info:
                orientation = image.getexif().get(_EXIF_ORIENTATION, 1)
    except UnidentifiedImageError:
        raise ImageError("not a decodable image (unknown format)") from None
    except Exception as exc:  # PIL raises assorted errors on damaged headers
        raise ImageError(f"damaged image header: {exc}") from None
    if width <= 0 or height <= 0:
        raise ImageError(f"image has no pixels ({width}x{height})")
    return (width, height) if orientation in _TRANSPOSING else (height, width)


def decode_rgb(data: bytes):
    """uint8 CHW RGB tensor via torchvision.io, EXIF orientation applied."""
    import torch
    from torchvision.io import ImageReadMode, decode_image

    try:
        return decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB,
                            apply_exif_orientation=True)
    except RuntimeError as exc:
        raise ImageError(f"decode failed: {str(exc).splitlines()[0]}") from None


def as_uint8_array(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)
