"""A corpus of valid but unusual image files, for equivalence and reliability tests.

:func:`write_unusual_images` writes one small ImageFolder: one class folder per kind of file
(``root/<kind>/<kind>.<ext>``), so a pipeline whose ``source.root`` is the folder reads every kind
once, with the sorted kind names as labels. Content comes from
:func:`dali_bridge.data.sources.synthetic_images.sample_image` (natural-looking scenes, never noise),
so resampling differences show as they would on photos.

Kinds (see :data:`KINDS`): grayscale / CMYK / YCCK / progressive JPEGs; PNG as RGB, RGBA,
palette, 16-bit grayscale and 16-bit RGB; a PNG saved under a ``.jpg`` name; JPEGs with EXIF
orientation 1-8; images of 1x1 and 7x5 pixels and others smaller than a 224 crop; odd sizes in
portrait and landscape; and one 4000x3000 JPEG. Generation takes about a second.
"""
from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

from dali_bridge.data.sources.synthetic_images import sample_image

_EXIF_ORIENTATION = 0x0112

# kind → (height, width) of the stored pixels (before any EXIF orientation).
_SIZES: dict[str, tuple[int, int]] = {
    "jpeg_gray": (301, 257),
    "jpeg_cmyk": (263, 350),
    "jpeg_ycck": (250, 333),
    "jpeg_progressive": (375, 500),
    "png_rgb": (281, 375),
    "png_rgba": (300, 240),
    "png_palette": (240, 320),
    "png_gray16": (257, 301),
    "png_rgb16": (229, 311),
    "png_named_jpg": (260, 270),
    **{f"exif_{k}": (240, 330) for k in range(1, 9)},
    "tiny_1x1": (1, 1),
    "tiny_7x5": (7, 5),
    "small_100x80": (100, 80),
    "small_150x230": (150, 230),
    "odd_portrait_501x333": (501, 333),
    "odd_landscape_333x501": (333, 501),
    "portrait_640x427": (640, 427),
    "landscape_427x640": (427, 640),
    "large_3000x4000": (3000, 4000),
}
KINDS: tuple[str, ...] = tuple(sorted(_SIZES))


def _scene(index: int, size: tuple[int, int]) -> np.ndarray:
    """A natural-looking RGB uint8 scene of (height, width); big ones are rendered small and upscaled."""
    h, w = size
    if h * w > 1_000_000:  # rendering is ~O(pixels); 4000x3000 directly would take seconds
        small = Image.fromarray(sample_image(index, seed=7, size=(h // 4, w // 4)))
        return np.asarray(small.resize((w, h), Image.BICUBIC))
    return sample_image(index, seed=7, size=(max(h, 2), max(w, 2)))[:h, :w]


def _jpeg(image: Image.Image, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90, **options)
    return buffer.getvalue()


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def _png_rgb16(rgb16: np.ndarray) -> bytes:
    """A 16-bit-per-channel RGB PNG (Pillow cannot write one): IHDR, one zlib IDAT, IEND."""
    h, w, _ = rgb16.shape

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data) & 0xFFFFFFFF)

    rows = rgb16.astype(">u2").reshape(h, w * 3)
    raw = b"".join(b"\x00" + row.tobytes() for row in rows)  # filter type 0 on every row
    header = struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)   # 16 bits, colour type 2 (RGB)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


def _ycck_jpeg(rgb: np.ndarray) -> bytes:
    """An Adobe YCCK JPEG (APP14 transform 2), as Photoshop writes CMYK.

    Pillow writes 4-channel JPEGs only as Adobe CMYK (transform 0) with inverted samples, so the
    YCCK components are written as such a file and the APP14 transform byte is set to 2. The
    stored (Y, Cb, Cr) are the YCbCr of the inverted stored C, M, Y samples, as libjpeg's YCCK
    colour conversion defines them; K is the stored black.
    """
    cmyk = np.asarray(Image.fromarray(rgb).convert("CMYK"))
    stored = 255 - cmyk  # what Pillow's inverted-CMYK encoder would store for this CMYK image
    ycc = np.asarray(Image.fromarray(np.ascontiguousarray(255 - stored[..., :3])).convert("YCbCr"))
    ycck_stored = np.concatenate([ycc, stored[..., 3:]], axis=-1)
    h, w = rgb.shape[:2]
    data = bytearray(_jpeg(Image.frombytes("CMYK", (w, h), np.ascontiguousarray(255 - ycck_stored).tobytes())))
    marker = data.find(b"\xff\xee\x00\x0eAdobe")
    if marker < 0:
        raise RuntimeError("Pillow wrote no Adobe APP14 marker for a CMYK JPEG; cannot make a YCCK file")
    # APP14: FF EE, length (2), 'Adobe' (5), version (2), flags0 (2), flags1 (2), transform (1)
    data[marker + 2 + 2 + 5 + 2 + 2 + 2] = 2
    return bytes(data)


def _exif_jpeg(rgb: np.ndarray, orientation: int) -> bytes:
    exif = Image.Exif()
    exif[_EXIF_ORIENTATION] = orientation
    return _jpeg(Image.fromarray(rgb), exif=exif.tobytes())


def _encode(kind: str, rgb: np.ndarray) -> tuple[str, bytes]:
    """(file extension, bytes) of one kind."""
    image = Image.fromarray(rgb)
    if kind == "jpeg_gray":
        return ".jpg", _jpeg(image.convert("L"))
    if kind == "jpeg_cmyk":
        return ".jpg", _jpeg(image.convert("CMYK"))
    if kind == "jpeg_ycck":
        return ".jpg", _ycck_jpeg(rgb)
    if kind == "jpeg_progressive":
        return ".jpg", _jpeg(image, progressive=True)
    if kind == "png_rgb":
        return ".png", _png(image)
    if kind == "png_rgba":
        alpha = np.linspace(40, 255, rgb.shape[1], dtype=np.uint8)[None, :].repeat(rgb.shape[0], 0)
        return ".png", _png(Image.fromarray(np.dstack([rgb, alpha])))  # RGBA
    if kind == "png_palette":
        return ".png", _png(image.quantize(colors=200))
    if kind == "png_gray16":
        gray = np.asarray(image.convert("L"), dtype=np.uint16) * 257 + np.arange(rgb.shape[1], dtype=np.uint16) % 97
        return ".png", _png(Image.fromarray(gray.astype(np.uint16)))  # 16-bit grayscale ("I;16")
    if kind == "png_rgb16":
        rgb16 = rgb.astype(np.uint16) * 257 + (np.arange(rgb.shape[0], dtype=np.uint16) % 131)[:, None, None]
        return ".png", _png_rgb16(rgb16)
    if kind == "png_named_jpg":
        return ".jpg", _png(image)
    if kind.startswith("exif_"):
        return ".jpg", _exif_jpeg(rgb, int(kind.split("_")[1]))
    return ".jpg", _jpeg(image)


def write_unusual_images(root: str | Path, kinds: tuple[str, ...] = KINDS) -> dict[str, Path]:
    """Write every kind (default :data:`KINDS`) as ``root/<kind>/<kind>.<ext>``; returns kind → file.

    The layout is an ImageFolder: each kind is a class holding one image, labels follow the sorted
    kind names. Deterministic: the same call writes byte-identical files.
    """
    root = Path(root)
    unknown = [kind for kind in kinds if kind not in _SIZES]
    if unknown:
        raise ValueError(f"unknown corpus kind(s) {unknown}; expected names from {KINDS}")
    written: dict[str, Path] = {}
    for kind in kinds:
        rgb = _scene(KINDS.index(kind), _SIZES[kind])
        extension, data = _encode(kind, rgb)
        folder = root / kind
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{kind}{extension}"
        path.write_bytes(data)
        written[kind] = path
    return written


def stored_size(kind: str) -> tuple[int, int]:
    """(height, width) of the stored pixels of ``kind`` (before EXIF orientation), in pixels."""
    return _SIZES[kind]
