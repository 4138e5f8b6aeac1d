"""Structural checks of encoded JPEG, PNG and WebP bytes, in pure Python, before any decoder sees them.

Both backends hand each file to a native decoder, and a file one decoder accepts must not be
refused by the other, nor decoded differently. :func:`inspect_image` reads a file's structure
and either returns what both backends will decode (:class:`ImageInfo`: format, stored size, the
EXIF orientation both apply) or raises :class:`ImageError` with the reason. The rules:

* **Pixel cap.** The stored width × height, read from the header, must not exceed the caller's
  ``max_pixels`` (``source.max_pixels``): a few hundred bytes can claim 30000×30000 pixels and
  make a decoder allocate gigabytes. Checked before anything is decompressed.
* **PNG** is decoded by libpng in torchvision, whose error path crashes the process (a
  segmentation fault, not an exception) on *any* libpng error. So a PNG reaches a decoder only
  if libpng has nothing to complain about: the signature, ``IHDR`` first and valid (size ≤ libpng's
  1,000,000 pixels per side, a legal bit depth / colour type pair, methods 0, interlace 0 or 1),
  every chunk's CRC right, chunk types made of letters and no unknown critical chunk, one
  ``PLTE`` before the image data (required for palette images), the ``IDAT`` chunks consecutive
  and holding one complete zlib stream that inflates to exactly the size the header implies, with
  a valid filter type (0-4) at the start of every row, and ``IEND`` at the end. The stream is
  inflated in bounded steps and not kept: memory stays at a few megabytes whatever the file says.
* **JPEG**: libjpeg-turbo (both backends) reports damage as errors, never crashes (a fuzz test
  pins this); the walk refuses what the two decoders' parsers would treat differently: markers
  libjpeg does not know (in the header or between the image data and the end-of-image marker,
  where libjpeg fails at the end of its decode and DALI keeps the pixels), a second SOI or frame
  header, coding processes other than baseline, extended and progressive Huffman (SOF0-2), a frame
  without a height, and a missing end-of-image marker (a region-of-interest decode would stop
  early and accept a cut file). A fuzz test found each of these decoder disagreements.
* **EXIF orientation.** torchvision (libjpeg markers) reads the orientation of a JPEG's *first*
  APP1 segment, and only if that segment is Exif; DALI reads the *last* Exif segment. Where these
  disagree — two Exif segments with different orientations, or an XMP/other APP1 segment before
  an Exif one with an orientation — the file is refused as ambiguous. Otherwise that orientation is
  applied on both backends (values outside 1-8 mean none, on both). A PNG's orientation comes from
  its one ``eXIf`` chunk before the image data (both apply it); more than one, or one after the
  image data, is refused as ambiguous. A WebP's EXIF orientation is **ignored on both backends**
  (torchvision's libwebp decoder never applies it; DALI is given the file without its EXIF chunk,
  see :func:`without_webp_exif`).
* **Animated images** are refused on both backends: an animated WebP (torchvision refuses it,
  DALI would decode its first frame) and an animated PNG (a PNG with ``acTL``/``fcTL`` chunks:
  torchvision's libpng ignores them and decodes the default image, DALI's decoder reads them and
  can return other pixels or refuse the file).
"""
from __future__ import annotations

from ...errors import ImageError  # noqa: F401
from ...spec.model import DEFAULT_MAX_PIXELS  # noqa: F401

import zlib
from dataclasses import dataclass


_EXIF_ORIENTATION = 0x0112
_TRANSPOSING = {5, 6, 7, 8}  # orientations that swap the stored width and height


@dataclass(frozen=True)
class ImageInfo:
    """What both backends decode from a file: ``format`` (jpeg, png, webp), the stored ``height`` and
    ``width`` in pixels, and the EXIF ``orientation`` (1-8) both apply."""
    format: str
    height: int
    width: int
    orientation: int = 1

    @property
    def size(self) -> tuple[int, int]:
        """(height, width) in pixels as decoded, EXIF orientation applied."""
        return (self.width, self.height) if self.orientation in _TRANSPOSING else (self.height, self.width)


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def inspect_image(data: bytes, *, max_pixels: int | None = None) -> ImageInfo:
    """The :class:`ImageInfo` of complete encoded bytes, or :class:`ImageError` saying why no backend
    may decode them (see the module's rules). ``max_pixels`` None means no pixel cap."""
    if not data:
        raise ImageError("empty file (0 bytes)")
    if data[:3] == b"\xff\xd8\xff":
        info = _jpeg(data)
        _check_pixels(info, max_pixels)
        return info
    if data[:8] == _PNG_SIGNATURE:
        return _png(data, max_pixels)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        info = _webp(data)
        _check_pixels(info, max_pixels)
        return info
    raise ImageError(f"not a JPEG, PNG or WebP image (starts with {data[:8].hex(' ')})")


def _check_pixels(info: ImageInfo, max_pixels: int | None) -> None:
    if info.height <= 0 or info.width <= 0:
        raise ImageError(f"image has no pixels ({info.width}x{info.height})")
    if max_pixels is not None and info.height * info.width > max_pixels:
        raise ImageError(f"image too large: {info.width}x{info.height} = {info.width * info.height:,} pixels, "
                         f"over source.max_pixels = {max_pixels:,} (raise it if such images are expected)")


def exif_orientation(data: bytes, start: int, end: int) -> int:
    """Orientation tag (0x0112) of the TIFF structure in ``data[start:end]``; 1 if absent or outside 1-8."""
    order = data[start:start + 2]
    if order not in (b"II", b"MM") or end - start < 8:
        return 1
    endian = "little" if order == b"II" else "big"
    ifd = start + int.from_bytes(data[start + 4:start + 8], endian)
    if ifd + 2 > end:
        return 1
    for entry in range(ifd + 2, min(ifd + 2 + 12 * int.from_bytes(data[ifd:ifd + 2], endian), end - 11), 12):
        if int.from_bytes(data[entry:entry + 2], endian) == _EXIF_ORIENTATION:
            value = int.from_bytes(data[entry + 8:entry + 10], endian)
            return value if 1 <= value <= 8 else 1
    return 1


# ---------------------------------------------------------------------------------------------
# JPEG

_SUPPORTED_FRAMES = {0xC0: "baseline", 0xC1: "extended", 0xC2: "progressive"}
_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # start-of-frame: C4/C8/CC are DHT/JPG/DAC
# Markers libjpeg's header reader accepts with a length field (others end the read with an error).
_HEADER_SEGMENTS = frozenset({0xC4, 0xCC, 0xDB, 0xDC, 0xDD, 0xFE} | set(range(0xE0, 0xF0)))


def jpeg_header(data: bytes) -> tuple[int, tuple[int, int] | None, list[int | None]]:
    """Walk a JPEG's header segments: (offset of the start-of-scan marker or -1 if the data ends first,
    the frame's (height, width) or None, the APP1 segments in order: an Exif segment's orientation,
    None for a non-Exif APP1 such as XMP).

    Walking segment lengths (not searching bytes) skips EXIF thumbnails, which hold their own scan
    and end markers. Raises :class:`ImageError` for a structure the decoders would read differently.
    """
    position, size = 2, len(data)
    frame: tuple[int, int] | None = None
    app1: list[int | None] = []
    while position + 4 <= size:
        if data[position] != 0xFF:
            raise ImageError(f"malformed JPEG header: no marker at byte {position} (found {data[position]:02x})")
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte before a marker
            position += 1
        elif marker == 0xDA:
            return position, frame, app1
        elif marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length field
            position += 2
        elif marker in _FRAMES:
            if frame is not None:
                raise ImageError("malformed JPEG: two frame headers (SOF markers)")
            if marker not in _SUPPORTED_FRAMES:
                raise ImageError(f"unsupported JPEG coding process (SOF{marker - 0xC0}); baseline, extended and "
                                 f"progressive Huffman JPEGs are supported")
            if position + 9 > size:
                break
            frame = (int.from_bytes(data[position + 5:position + 7], "big"),
                     int.from_bytes(data[position + 7:position + 9], "big"))
            position += 2 + int.from_bytes(data[position + 2:position + 4], "big")
        elif marker in _HEADER_SEGMENTS:
            length = int.from_bytes(data[position + 2:position + 4], "big")
            if length < 2:
                raise ImageError(f"malformed JPEG header: segment length {length} at byte {position}")
            if marker == 0xE1:
                exif = data[position + 4:position + 10] == b"Exif\x00\x00"
                end = min(position + 2 + length, size)
                app1.append(exif_orientation(data, position + 10, end) if exif else None)
            position += 2 + length
        else:
            raise ImageError(f"malformed JPEG header: marker ff{marker:02x} at byte {position} is not allowed "
                             f"before the image data")
    return -1, frame, app1


def _jpeg(data: bytes) -> ImageInfo:
    scan, frame, app1 = jpeg_header(data)
    if scan < 0:
        raise ImageError(f"truncated JPEG: the file ends ({len(data)} bytes) before its image data starts")
    if frame is None:
        raise ImageError("malformed JPEG: no frame header (SOF marker) before the image data")
    if data.rfind(b"\xff\xd9") < scan:
        raise ImageError(f"truncated JPEG: no end-of-image marker after the image data ({len(data)} bytes)")
    _check_scan_markers(data, scan)
    first = app1[0] if app1 and app1[0] is not None else 1  # libjpeg-based decoders: the first APP1 only
    exif = [orientation for orientation in app1 if orientation is not None]
    last = exif[-1] if exif else 1  # DALI: the last Exif segment
    if first != last:
        raise ImageError(f"ambiguous EXIF orientation: {len(app1)} APP1 segments ({len(exif)} Exif) give "
                         f"orientation {first} (the first) or {last} (the last Exif one); decoders disagree "
                         f"on such files — keep one Exif segment, first")
    return ImageInfo("jpeg", frame[0], frame[1], first)


def _check_scan_markers(data: bytes, scan: int) -> None:
    """Walk the markers from the first start-of-scan to the end-of-image marker.

    Inside entropy-coded data a 0xFF byte is followed by 0x00 (stuffing), a restart marker or more
    0xFF; anything else is a marker. libjpeg (torchvision) refuses an unknown marker or a second
    frame header there, at the end of the decode; DALI's decoder stops early and keeps the pixels.
    Segments between scans (tables, comments: progressive JPEGs) are skipped by their length.
    """
    position, size = scan, len(data)
    while True:  # ``position`` is at a segment marker: SOS, or a table/comment segment between scans
        if position + 4 > size:
            raise ImageError(f"truncated JPEG: no end-of-image marker after the image data ({size} bytes)")
        end = position + 2 + int.from_bytes(data[position + 2:position + 4], "big")
        if data[position + 1] == 0xDA:
            end = _next_marker(data, end)
            if end < 0:
                raise ImageError(f"truncated JPEG: no end-of-image marker after the image data ({size} bytes)")
        position = end
        while position + 1 < size and data[position] == 0xFF and data[position + 1] == 0xFF:
            position += 1  # fill bytes
        if position + 2 > size:
            raise ImageError(f"truncated JPEG: no end-of-image marker after the image data ({size} bytes)")
        marker = data[position + 1] if data[position] == 0xFF else None
        if marker == 0xD9:
            return
        if marker is None or marker != 0xDA and marker not in _HEADER_SEGMENTS:
            raise ImageError(f"malformed JPEG: {'no marker' if marker is None else f'marker ff{marker:02x}'} at "
                             f"byte {position}, after the start of the image data")


# Bytes after 0xFF in entropy-coded data that do not make a marker: stuffing, restart markers, fill.
_NOT_MARKERS = frozenset({0x00, 0xFF} | set(range(0xD0, 0xD8)))


def _next_marker(data: bytes, start: int) -> int:
    """Offset of the next marker's 0xFF in entropy-coded data from ``start``; -1 if none.

    ``bytes.find`` hops between 0xFF bytes (about one in 200 bytes of image data): several times
    faster than a regular expression over the whole scan, which matters on the DALI feeder thread.
    """
    position, last = data.find(b"\xff", start), len(data) - 1
    while 0 <= position < last:
        if data[position + 1] not in _NOT_MARKERS:
            return position
        position = data.find(b"\xff", position + 1)
    return -1


# ---------------------------------------------------------------------------------------------
# PNG

# Colour type → (channels, legal bit depths).
_PNG_COLOUR = {0: (1, (1, 2, 4, 8, 16)), 2: (3, (8, 16)), 3: (1, (1, 2, 4, 8)), 4: (2, (8, 16)), 6: (4, (8, 16))}
_PNG_CRITICAL = (b"IHDR", b"PLTE", b"IDAT", b"IEND")
_PNG_MAX_SIDE = 1_000_000  # libpng's default user limit on width and height: beyond it, an error
# Adam7 passes: (first row, row step, first column, column step).
_ADAM7 = ((0, 8, 0, 8), (0, 8, 4, 8), (4, 8, 0, 4), (0, 4, 2, 4), (2, 4, 0, 2), (0, 2, 1, 2), (1, 2, 0, 1))
_INFLATE_STEP = 1 << 20  # bytes inflated at a time while checking the image data


def _png_chunks(data: bytes) -> list[tuple[bytes, int, int]]:
    """Every chunk up to IEND as (type, data start, data length), CRCs and types checked."""
    chunks, position, size = [], 8, len(data)
    while True:
        if position + 12 > size:
            raise ImageError(f"truncated PNG: no IEND chunk (the file ends at {size} bytes)")
        length = int.from_bytes(data[position:position + 4], "big")
        kind = data[position + 4:position + 8]
        if not kind.isalpha():
            raise ImageError(f"malformed PNG: invalid chunk type {kind!r} at byte {position}")
        if length > 0x7FFFFFFF or position + 12 + length > size:
            raise ImageError(f"truncated PNG: chunk {kind.decode()} at byte {position} claims {length} bytes, "
                             f"the file ends at {size}")
        end = position + 8 + length
        if zlib.crc32(data[position + 4:end]) != int.from_bytes(data[end:end + 4], "big"):
            raise ImageError(f"corrupt PNG: CRC mismatch in chunk {kind.decode()} at byte {position}")
        chunks.append((kind, position + 8, length))
        if kind == b"IEND":
            return chunks
        position = end + 4


def _png(data: bytes, max_pixels: int | None) -> ImageInfo:
    chunks = _png_chunks(data)
    kind, start, length = chunks[0]
    if kind != b"IHDR" or length != 13:
        raise ImageError("malformed PNG: the first chunk is not a 13-byte IHDR")
    width, height = int.from_bytes(data[start:start + 4], "big"), int.from_bytes(data[start + 4:start + 8], "big")
    depth, colour, compression, filtering, interlace = data[start + 8:start + 13]
    if colour not in _PNG_COLOUR or depth not in _PNG_COLOUR[colour][1]:
        raise ImageError(f"malformed PNG: bit depth {depth} with colour type {colour} is not a legal combination")
    if compression or filtering or interlace > 1:
        raise ImageError(f"malformed PNG: compression {compression}, filter {filtering}, interlace {interlace} "
                         f"(expected 0, 0, 0 or 1)")
    if max(width, height) > _PNG_MAX_SIDE:
        raise ImageError(f"PNG too large: {width}x{height}, over the decoder's {_PNG_MAX_SIDE:,} pixels per side")
    info = ImageInfo("png", height, width, _png_layout(data, chunks, colour))
    _check_pixels(info, max_pixels)
    _png_check_pixels(data, chunks, width=width, height=height, bits=depth * _PNG_COLOUR[colour][0],
                      interlaced=bool(interlace))
    return info


def _png_layout(data: bytes, chunks: list[tuple[bytes, int, int]], colour: int) -> int:
    """Check the chunk order (PLTE, IDAT run, eXIf, unknown critical chunks); the EXIF orientation."""
    kinds = [kind for kind, _, _ in chunks]
    for kind in kinds[1:]:
        if kind[:1].isupper() and kind not in _PNG_CRITICAL or kind == b"IHDR":
            raise ImageError(f"malformed PNG: unexpected critical chunk {kind.decode()}")
    if b"IDAT" not in kinds:
        raise ImageError("malformed PNG: no IDAT chunk (no image data)")
    first_data = kinds.index(b"IDAT")
    run_end = first_data
    while kinds[run_end] == b"IDAT":
        run_end += 1
    if b"IDAT" in kinds[run_end:]:
        raise ImageError("malformed PNG: the IDAT chunks are not consecutive")
    palettes = [n for n, kind in enumerate(kinds) if kind == b"PLTE"]
    if len(palettes) > 1 or palettes and (palettes[0] > first_data or colour in (0, 4)):
        raise ImageError("malformed PNG: PLTE repeated, after the image data, or in a grayscale image")
    if palettes:
        length = chunks[palettes[0]][2]
        if length % 3 or not 3 <= length <= 768:
            raise ImageError(f"malformed PNG: palette of {length} bytes (expected 1-256 RGB entries)")
    elif colour == 3:
        raise ImageError("malformed PNG: palette image without a PLTE chunk")
    if b"acTL" in kinds or b"fcTL" in kinds:
        frames = kinds.count(b"fcTL")
        raise ImageError(f"animated PNG ({frames} frames): only still images are supported (decoders disagree on "
                         f"animations: one may show another frame than the default image)")
    exifs = [n for n, kind in enumerate(kinds) if kind == b"eXIf"]
    if len(exifs) > 1 or exifs and exifs[0] > first_data:
        raise ImageError("ambiguous EXIF orientation: the PNG has more than one eXIf chunk or one after its "
                         "image data; decoders disagree on such files")
    if not exifs:
        return 1
    _, start, length = chunks[exifs[0]]
    return exif_orientation(data, start, start + length)


def _png_rows(*, width: int, height: int, bits: int, interlaced: bool) -> list[tuple[int, int]]:
    """(bytes per row including its filter byte, rows) of each non-empty pass of the image data."""
    passes = _ADAM7 if interlaced else ((0, 1, 0, 1),)
    rows = []
    for top, row_step, left, column_step in passes:
        pass_width = (width - left + column_step - 1) // column_step
        pass_height = (height - top + row_step - 1) // row_step
        if pass_width > 0 and pass_height > 0:
            rows.append((1 + (pass_width * bits + 7) // 8, pass_height))
    return rows


def _png_check_pixels(data: bytes, chunks: list[tuple[bytes, int, int]], *, width: int, height: int, bits: int,
                      interlaced: bool) -> None:
    """Inflate the IDAT stream in bounded steps: complete, exactly the expected size, valid row filters."""
    rows = _png_rows(width=width, height=height, bits=bits, interlaced=interlaced)
    expected = sum(row_bytes * count for row_bytes, count in rows)
    row_starts = _row_starts(rows)
    next_row = next(row_starts)
    inflater = zlib.decompressobj()
    produced = 0
    try:
        for block in _inflated(inflater, [data[start:start + length] for kind, start, length in chunks
                                          if kind == b"IDAT"]):
            if produced + len(block) > expected:
                raise ImageError(f"corrupt PNG: the image data inflates to more than the {expected:,} bytes "
                                 f"its {width}x{height} header implies")
            while next_row < produced + len(block):
                if block[next_row - produced] > 4:
                    raise ImageError(f"corrupt PNG: invalid row filter type {block[next_row - produced]} "
                                     f"at byte {next_row} of the image data")
                next_row = next(row_starts)
            produced += len(block)
    except zlib.error as exc:
        raise ImageError(f"corrupt PNG: the image data does not inflate ({exc})") from None
    if not inflater.eof or produced != expected:
        raise ImageError(f"corrupt PNG: the image data holds {produced:,} bytes"
                         f"{'' if inflater.eof else ' and its compressed stream is cut short'}; the {width}x{height} "
                         f"header implies {expected:,}")


def _inflated(inflater, parts: list[bytes]):
    """The inflated blocks (at most :data:`_INFLATE_STEP` bytes each) of the stream split over ``parts``;
    :class:`ImageError` for compressed data after the stream's end."""
    for part in parts:
        while part and not inflater.eof:
            yield inflater.decompress(part, _INFLATE_STEP)
            part = inflater.unconsumed_tail
        if part or inflater.unused_data:
            raise ImageError("corrupt PNG: data after the end of the compressed image data")
    while not inflater.eof:  # output zlib holds back once every input byte is in (the end of a long match)
        block = inflater.decompress(b"", _INFLATE_STEP)
        if not block:
            return
        yield block


def _row_starts(rows: list[tuple[int, int]]):
    """Offsets of every row's filter byte in the inflated data, then an endless sentinel past the end."""
    offset = 0
    for row_bytes, count in rows:
        for _ in range(count):
            yield offset
            offset += row_bytes
    while True:
        yield 1 << 62


# ---------------------------------------------------------------------------------------------
# WebP

def _webp_chunks(data: bytes) -> list[tuple[bytes, int, int]]:
    """The RIFF chunks as (fourcc, data start, data length); sizes checked against the file."""
    declared = int.from_bytes(data[4:8], "little") + 8
    if declared > len(data):
        raise ImageError(f"truncated WebP: the RIFF header declares {declared} bytes, the file has {len(data)}")
    chunks, position = [], 12
    while position + 8 <= declared:
        length = int.from_bytes(data[position + 4:position + 8], "little")
        if position + 8 + length > declared:
            raise ImageError(f"truncated WebP: chunk {data[position:position + 4]!r} at byte {position} claims "
                             f"{length} bytes past the end of the file")
        chunks.append((data[position:position + 4], position + 8, length))
        position += 8 + length + (length & 1)
    if not chunks:
        raise ImageError("malformed WebP: no chunks")
    return chunks


def _webp(data: bytes) -> ImageInfo:
    chunks = _webp_chunks(data)
    kinds = [kind for kind, _, _ in chunks]
    kind, start, length = chunks[0]
    frames = kinds.count(b"ANMF")
    if kind == b"VP8X" and length >= 10:
        if data[start] & 0x02 or frames or b"ANIM" in kinds:
            raise ImageError(f"animated WebP ({frames} frames): only still images are supported "
                             f"(decoders disagree on animations: one takes the first frame, one refuses)")
        width = 1 + int.from_bytes(data[start + 4:start + 7], "little")
        height = 1 + int.from_bytes(data[start + 7:start + 10], "little")
        if b"VP8 " not in kinds and b"VP8L" not in kinds:
            raise ImageError("malformed WebP: no image data chunk (VP8 or VP8L)")
    elif kind == b"VP8 " and length >= 10:
        if data[start + 3:start + 6] != b"\x9d\x01\x2a":
            raise ImageError("malformed WebP: the VP8 frame has no start code")
        width = int.from_bytes(data[start + 6:start + 8], "little") & 0x3FFF
        height = int.from_bytes(data[start + 8:start + 10], "little") & 0x3FFF
    elif kind == b"VP8L" and length >= 5:
        if data[start] != 0x2F:
            raise ImageError("malformed WebP: the VP8L image has no signature")
        bits = int.from_bytes(data[start + 1:start + 5], "little")
        width, height = 1 + (bits & 0x3FFF), 1 + ((bits >> 14) & 0x3FFF)
    else:
        raise ImageError(f"malformed WebP: unexpected first chunk {kind!r} of {length} bytes")
    return ImageInfo("webp", height, width, 1)  # EXIF orientation ignored on both backends


def without_webp_exif(data: bytes) -> bytes:
    """The WebP ``data`` without its EXIF chunk (and the VP8X flag announcing it); ``data`` itself if
    it has none. DALI would apply the orientation torchvision ignores, and fails outright on a
    lossless WebP that carries EXIF; the pixels do not depend on the chunk."""
    chunks = _webp_chunks(data)
    exif = [(start, length) for kind, start, length in chunks if kind == b"EXIF"]
    if not exif:
        return data
    out = bytearray(data[:12])
    for kind, start, length in chunks:
        if kind != b"EXIF":
            out += data[start - 8:start + length + (length & 1)]
    first = chunks[0]
    if first[0] == b"VP8X":
        out[12 + 8] &= ~0x08 & 0xFF  # the VP8X flags byte: EXIF present
    out[4:8] = (len(out) - 8).to_bytes(4, "little")
    return bytes(out)
