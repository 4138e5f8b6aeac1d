"""Reading and decoding one image file: the pieces both backends share.

``probe`` reads only the header (size after EXIF orientation) — the DALI feeder needs it to
draw crop windows before DALI decodes. ``decode_rgb`` is the torchvision decoder (libjpeg-turbo,
bit-identical to DALI's CPU decoder): RGB for grayscale/CMYK/PNG inputs, EXIF orientation applied.
Every byte string is checked by :func:`dali_bridge.data.sources.formats.inspect_image` before a decoder sees it.
"""
from __future__ import annotations

from ...errors import SampleError  # noqa: F401

import os
import re
import stat

from ...errors import ImageError
from .formats import inspect_image

__all__ = ["check_encoded", "decode_checked", "decode_rgb", "inspect_encoded", "probe", "read_bytes", "read_file",
           "too_many_bytes"]


def read_bytes(path: str) -> bytes:
    """The file's bytes, checked by :func:`check_encoded`; every failure is an :class:`ImageError`."""
    data = read_file(path)
    check_encoded(data)
    return data


def too_many_bytes(size: int, max_bytes: int) -> str:
    """The reason a sample's encoded image is refused for its size (``source.max_bytes``)."""
    return (f"file too large: {size:,} bytes, over source.max_bytes = {max_bytes:,} (raise it if such files "
            f"are expected)")


def read_file(path: str, *, max_bytes: int | None = None) -> bytes:
    """The file's bytes, unchecked; OSError reasons (missing, permission, dangling link) become
    :class:`ImageError` messages.

    Opens without blocking and refuses anything but a regular file: a FIFO or device named
    ``*.jpg`` would otherwise hang the reader or never end. A file over ``max_bytes`` (None: no
    cap) is refused from its size before a byte is read, and one that grows past it while read
    is refused as soon as it does.
    """
    try:
        descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise ImageError(f"cannot read file: {exc.strerror or exc}") from None
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):
            mode = status.st_mode
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else "a device or socket"
            raise ImageError(f"cannot read file: not a regular file ({kind})")
        if max_bytes is not None and status.st_size > max_bytes:
            raise ImageError(too_many_bytes(status.st_size, max_bytes))
        # os.read into bytes sized from fstat, not a buffered reader: this runs once per sample.
        chunks, request, total = [], status.st_size + 1, 0
        while chunk := os.read(descriptor, request):  # until end of file, should the file have grown
            chunks.append(chunk)
            total += len(chunk)
            if max_bytes is not None and total > max_bytes:
                raise ImageError(too_many_bytes(total, max_bytes))
            request = 1 << 20
    except OSError as exc:
        raise ImageError(f"cannot read file: {exc.strerror or exc}") from None
    finally:
        os.close(descriptor)
    return b"".join(chunks)  # the one chunk itself, uncopied, in the usual case


def check_encoded(data: bytes, *, max_pixels: int | None = None) -> str:
    """The format (``jpeg``, ``png`` or ``webp``) of complete encoded image bytes, else :class:`ImageError`.

    Both backends accept exactly these formats, judged by content, not file name: DALI also
    decodes BMP/TIFF and torchvision also GIF, so those are refused everywhere to keep the
    backends alike. The bytes pass :func:`~dali_bridge.data.sources.formats.inspect_image`'s structural checks
    (which keep a PNG from crashing torchvision's decoder, refuse animated WebPs and ambiguous
    EXIF orientations, and cap the pixel count at ``max_pixels``) or are refused. A JPEG must have
    its end-of-image marker after the image data and a PNG its IEND chunk: libjpeg-turbo's full
    decode rejects such truncated files on both backends, but DALI's region-of-interest decode
    stops early and would accept a file cut below the crop.
    """
    return inspect_image(data, max_pixels=max_pixels).format


def inspect_encoded(data: bytes, *, max_pixels: int | None = None) -> tuple[str, tuple[int, int]]:
    """:func:`check_encoded`'s format and the decoded (height, width) with EXIF orientation applied,
    both from one walk of the header."""
    info = inspect_image(data, max_pixels=max_pixels)
    return info.format, info.size


def probe(data: bytes) -> tuple[int, int]:
    """(height, width) in pixels as decoded with EXIF orientation applied; reads the header only.

    About ten times faster than opening the image with PIL: the DALI feeder probes every sample
    on the Python thread that feeds the pipeline. Raises :class:`ImageError` for bytes no backend
    decodes (:func:`~dali_bridge.data.sources.formats.inspect_image`); no pixel cap (see :func:`inspect_encoded`).
    """
    return inspect_image(data).size


def decode_rgb(data: bytes, *, max_pixels: int | None = None):
    """uint8 CHW RGB tensor via torchvision.io, EXIF orientation applied (as
    :func:`~dali_bridge.data.sources.formats.inspect_image` rules: a WebP's is ignored).

    The bytes are checked first (:func:`check_encoded`, pixel cap ``max_pixels``, None for none):
    torchvision's PNG decoder crashes the process on damage it reports, so nothing unchecked
    reaches it.
    """
    check_encoded(data, max_pixels=max_pixels)
    return decode_checked(data)


def decode_checked(data: bytes):
    """:func:`decode_rgb` of bytes that already passed :func:`check_encoded` (or
    :func:`~dali_bridge.data.sources.formats.inspect_image`): the caller that walked the header once to size the
    sample does not walk it again."""
    import torch
    from torchvision.io import ImageReadMode, decode_image

    try:
        image = decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB,
                             apply_exif_orientation=True)
    except RuntimeError as exc:
        raise ImageError(f"decode failed: {_SOURCE_LOCATION.sub('', str(exc).splitlines()[0])}") from None
    if image.dtype == torch.uint16:
        # 16-bit PNGs decode to uint16; scale to 0-255 rounding to nearest (v/257), as DALI's decoder
        # does — bit-identical to it, where torchvision's to_dtype(scale=True) (v >> 8) differs by 1.
        image = ((image.to(torch.int32) * 255 + 32767) // 65535).to(torch.uint8)
    return image


# torchvision prefixes its messages with "decode_jpeg, /path/to/decode_jpeg.cpp:171, ".
_SOURCE_LOCATION = re.compile(r"^\w+, \S+:\d+, ")
