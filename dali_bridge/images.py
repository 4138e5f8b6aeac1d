"""Reading and decoding one image file: the pieces both backends share.

``probe`` reads only the header (size after EXIF orientation) — the DALI feeder needs it to
draw crop windows before DALI decodes. ``decode_rgb`` is the torchvision decoder (libjpeg-turbo,
bit-identical to DALI's CPU decoder): RGB for grayscale/CMYK/PNG inputs, EXIF orientation applied.
"""
from __future__ import annotations

import io
import os
import re
import stat


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
    """The file's bytes, checked by :func:`check_encoded`; every failure is an :class:`ImageError`."""
    data = read_file(path)
    check_encoded(data)
    return data


def read_file(path: str) -> bytes:
    """The file's bytes, unchecked; OSError reasons (missing, permission, dangling link) become
    :class:`ImageError` messages.

    Opens without blocking and refuses anything but a regular file: a FIFO or device named
    ``*.jpg`` would otherwise hang the reader or never end.
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
        # os.read into bytes sized from fstat, not a buffered reader: this runs once per sample.
        chunks, request = [], status.st_size + 1
        while chunk := os.read(descriptor, request):  # until end of file, should the file have grown
            chunks.append(chunk)
            request = 1 << 20
    except OSError as exc:
        raise ImageError(f"cannot read file: {exc.strerror or exc}") from None
    finally:
        os.close(descriptor)
    return b"".join(chunks)  # the one chunk itself, uncopied, in the usual case


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def check_encoded(data: bytes) -> str:
    """The format (``jpeg``, ``png`` or ``webp``) of complete encoded image bytes, else :class:`ImageError`.

    Both backends accept exactly these formats, judged by content, not file name: DALI also
    decodes BMP/TIFF and torchvision also GIF, so those are refused everywhere to keep the
    backends alike. A JPEG must have its end-of-image marker after the image data and a PNG its
    IEND chunk: libjpeg-turbo's full decode rejects such truncated files on both backends, but
    DALI's region-of-interest decode stops early and would accept a file cut below the crop.
    """
    return inspect_encoded(data)[0]


def inspect_encoded(data: bytes) -> tuple[str, tuple[int, int] | None]:
    """:func:`check_encoded`'s format and, for a JPEG whose header tells it, the decoded (height,
    width) with EXIF orientation applied (else None) — both from one walk of the header."""
    if not data:
        raise ImageError("empty file (0 bytes)")
    if data[:3] == b"\xff\xd8\xff":
        scan, frame, orientation = _jpeg_header(data)
        if scan < 0:
            raise ImageError(f"truncated JPEG: the file ends ({len(data)} bytes) before its image data starts")
        if data.rfind(b"\xff\xd9") < scan:
            raise ImageError(f"truncated JPEG: no end-of-image marker after the image data ({len(data)} bytes)")
        return "jpeg", _oriented(frame, orientation)
    if data[:8] == _PNG_SIGNATURE:
        if data.rfind(b"IEND") < 8:
            raise ImageError(f"truncated PNG: no IEND chunk ({len(data)} bytes)")
        return "png", None
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp", None
    raise ImageError(f"not a JPEG, PNG or WebP image (starts with {data[:8].hex(' ')})")


_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start-of-frame: C4/C8/CC are DHT/JPG/DAC


def _exif_orientation(data: bytes, start: int, end: int) -> int:
    """Orientation tag (0x0112) of the TIFF structure in an APP1 Exif segment's [start, end); 1 if absent."""
    order = data[start:start + 2]
    if order not in (b"II", b"MM") or end - start < 8:
        return 1
    endian = "little" if order == b"II" else "big"
    ifd = start + int.from_bytes(data[start + 4:start + 8], endian)
    if ifd + 2 > end:
        return 1
    for entry in range(ifd + 2, min(ifd + 2 + 12 * int.from_bytes(data[ifd:ifd + 2], endian), end - 11), 12):
        if int.from_bytes(data[entry:entry + 2], endian) == _EXIF_ORIENTATION:
            return int.from_bytes(data[entry + 8:entry + 10], endian)
    return 1


def _jpeg_header(data: bytes) -> tuple[int, tuple[int, int] | None, int]:
    """Walk the JPEG header segments: (offset of the first start-of-scan marker or -1 if the data
    ends first, (height, width) of the frame or None, EXIF orientation).

    Walking segment lengths (not searching bytes) skips EXIF thumbnails, which hold their own
    scan and end markers.
    """
    position, size = 2, len(data)
    orientation, frame = 1, None
    while position + 4 <= size:
        if data[position] != 0xFF:
            return -1, frame, orientation
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte before a marker
            position += 1
            continue
        if marker == 0xDA:
            return position, frame, orientation
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length field
            position += 2
            continue
        length = int.from_bytes(data[position + 2:position + 4], "big")
        if marker in _SOF_MARKERS and frame is None and position + 9 <= size:
            frame = (int.from_bytes(data[position + 5:position + 7], "big"),
                     int.from_bytes(data[position + 7:position + 9], "big"))
        elif marker == 0xE1 and orientation == 1 and data[position + 4:position + 10] == b"Exif\x00\x00":
            orientation = _exif_orientation(data, position + 10, min(position + 2 + length, size))
        position += 2 + length
    return -1, frame, orientation


def _oriented(frame: tuple[int, int] | None, orientation: int) -> tuple[int, int] | None:
    """A JPEG frame's (height, width) after EXIF orientation, None when the header has no usable frame."""
    if frame is None or min(frame) <= 0:
        return None
    return (frame[1], frame[0]) if orientation in _TRANSPOSING else frame


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(height, width) after EXIF orientation from the JPEG header, or None to ask PIL.

    About ten times faster than opening the image with PIL: the DALI feeder probes every sample
    on the Python thread that feeds the pipeline.
    """
    scan, frame, orientation = _jpeg_header(data)
    return None if scan < 0 else _oriented(frame, orientation)


def probe(data: bytes) -> tuple[int, int]:
    """(height, width) in pixels as decoded with EXIF orientation applied; reads the header only.

    When PIL cannot read the header, the reference decoder (:func:`decode_rgb`) decides: its
    error is raised — the same reason the torchvision backend reports — or, if it decodes the
    image after all, the decoded size is returned.
    """
    if data[:3] == b"\xff\xd8\xff":
        size = _jpeg_size(data)
        if size is not None:
            return size
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            orientation = 1
            if image.format in ("JPEG", "MPO", "WEBP", "PNG", "TIFF") and "exif" in image.info:
                orientation = image.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # PIL raises assorted errors on damaged headers
        decoded = decode_rgb(data)
        return int(decoded.shape[-2]), int(decoded.shape[-1])
    if width <= 0 or height <= 0:
        raise ImageError(f"image has no pixels ({width}x{height})")
    return (width, height) if orientation in _TRANSPOSING else (height, width)


def decode_rgb(data: bytes):
    """uint8 CHW RGB tensor via torchvision.io, EXIF orientation applied."""
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
