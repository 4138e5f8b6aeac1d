"""Hostile inputs for the reliability tests: broken files, awkward sources, and the unusual-but-valid
images ``tests/helpers/corpus.py`` does not cover (very large, names with spaces and non-ASCII characters).

Every broken kind comes with the reason both backends report for it (:data:`BROKEN_REASONS`),
so a test can pin the exact behaviour: the reason is produced by the shared reader
(:func:`dali_bridge.data.sources.images.read_bytes`,
:func:`~dali_bridge.data.sources.images.check_encoded`) or, for damage only a decoder sees, by the
reference decoder both backends consult.
"""
from __future__ import annotations

import errno
import io
import os
import struct
import zlib
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image, PngImagePlugin


def tiny_jpeg(seed: int, height: int = 40, width: int = 56, **save: object) -> bytes:
    """A small baseline JPEG (quality 90) of smooth colour ramps plus noise; ``save`` goes to PIL."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = rng.uniform(0, 255, 3)[None, None, :] + 80 * np.stack(
        [np.sin(x / width * 3 + rng.uniform(0, 6)), np.cos(y / height * 3), np.sin((x + y) / (width + height) * 5)], -1)
    pixels = np.clip(base + rng.normal(0, 12, (height, width, 3)), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", **{"quality": 90, **save})
    return buffer.getvalue()


def write_image_folder(root: Path, classes: int = 2, per_class: int = 6, seed: int = 0) -> list[Path]:
    """An ImageFolder of tiny JPEGs of varied sizes; returns the files in listing order (index order)."""
    files = []
    for label in range(classes):
        folder = root / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        for number in range(per_class):
            seed_here = seed * 1000 + label * 100 + number
            path = folder / f"img_{number:03d}.jpg"
            path.write_bytes(tiny_jpeg(seed_here, 36 + 5 * (seed_here % 7), 44 + 3 * (seed_here % 11)))
            files.append(path)
    return files


# ---------------------------------------------------------------------------------------------
# Broken files: each kind turns a valid JPEG's bytes into damaged content.

def _scan_start(data: bytes) -> int:
    """Offset just past the first start-of-scan segment header (where entropy-coded data begins)."""
    sos = data.find(b"\xff\xda")
    return sos + 2 + int.from_bytes(data[sos + 2:sos + 4], "big")


def _bad_huffman(data: bytes) -> bytes:
    # Every header check passes (size, markers, end marker); libjpeg-turbo rejects the table at decode
    # time, on both backends — on DALI this fails the whole batch, which exercises its culprit search.
    dht = data.find(b"\xff\xc4")
    counts = dht + 5  # marker(2) length(2) class/id(1), then 16 code-length counts
    return data[:counts] + b"\xff" * 16 + data[counts + 16:]


def _gif(_: bytes) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(buffer, "GIF")
    return buffer.getvalue()


def _png_without_end(_: bytes) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (30, 200, 30)).save(buffer, "PNG")
    return buffer.getvalue()[:-12]  # the IEND chunk is the last 12 bytes


def _random(_: bytes) -> bytes:
    noise = np.random.default_rng(7).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    return b"\x00" + noise  # never a JPEG/PNG/WebP signature


BROKEN_CONTENT: dict[str, Callable[[bytes], bytes]] = {
    "zero_bytes": lambda data: b"",
    "cut_in_header": lambda data: data[:20],
    "cut_before_scan": lambda data: data[:data.find(b"\xff\xda")],
    "cut_just_after_scan_header": lambda data: data[:_scan_start(data) + 16],
    "cut_halfway": lambda data: data[:len(data) // 2],
    "cut_before_end_marker": lambda data: data[:-2],
    "random_bytes": _random,
    "bad_huffman_table": _bad_huffman,
    "gif_named_jpg": _gif,
    "png_cut_before_iend": _png_without_end,
}

# Kinds that are not file content: what stands at the file's name in the listing.
BROKEN_ENTRIES = ("fifo", "dangling_symlink", "deleted_after_listing", "unreadable")

BROKEN_REASONS: dict[str, str] = {
    "zero_bytes": "empty file (0 bytes)",
    "cut_in_header": "truncated JPEG: the file ends (20 bytes) before its image data starts",
    "cut_before_scan": "truncated JPEG: the file ends",
    "cut_just_after_scan_header": "truncated JPEG: no end-of-image marker after the image data",
    "cut_halfway": "truncated JPEG: no end-of-image marker after the image data",
    "cut_before_end_marker": "truncated JPEG: no end-of-image marker after the image data",
    "random_bytes": "not a JPEG, PNG or WebP image (starts with 00 ",
    "bad_huffman_table": "decode failed: Bogus Huffman table definition",
    "gif_named_jpg": "not a JPEG, PNG or WebP image (starts with 47 49 46 38",
    "png_cut_before_iend": "truncated PNG: no IEND chunk",
    "fifo": "cannot read file: not a regular file (a FIFO)",
    "dangling_symlink": "cannot read file: No such file or directory",
    "deleted_after_listing": "cannot read file: No such file or directory",
    "unreadable": "cannot read file: Permission denied",
}
BROKEN_KINDS = tuple(BROKEN_CONTENT) + BROKEN_ENTRIES


def break_file(path: Path, kind: str) -> None:
    """Replace the valid JPEG at ``path`` by broken kind ``kind`` (before the loader lists the folder).

    ``deleted_after_listing`` and ``unreadable`` leave the file as it is: the test removes it after
    building the loader, or makes it unreadable with :func:`make_unreadable`.
    """
    if kind in BROKEN_CONTENT:
        path.write_bytes(BROKEN_CONTENT[kind](path.read_bytes()))
    elif kind == "fifo":
        path.unlink()
        os.mkfifo(path)
    elif kind == "dangling_symlink":
        path.unlink()
        path.symlink_to(path.with_name("no-such-target.jpg"))
    elif kind not in ("deleted_after_listing", "unreadable"):
        raise ValueError(f"unknown broken kind {kind!r}; expected one of {BROKEN_KINDS}")


def make_unreadable(path: Path, monkeypatch) -> str:
    """Make ``path`` unreadable; returns how. ``chmod 000`` when not root; root ignores permission
    bits, so there ``os.open`` is patched to fail on this path with EACCES exactly as the kernel
    would (forked DataLoader workers inherit the patch)."""
    if os.geteuid() != 0:
        path.chmod(0)
        return "chmod 000"
    target = os.fspath(path)
    real_open = os.open

    def open_denied(file, flags, *args, **kwargs):
        if os.fspath(file) == target:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), target)
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_denied)
    return "os.open patched to raise EACCES (running as root)"


# ---------------------------------------------------------------------------------------------
# Valid but unusual: what tests/helpers/corpus.py leaves out.

def write_awkward_names(folder: Path, seed: int = 0) -> list[Path]:
    """Valid JPEGs whose names have spaces, non-ASCII letters, an emoji and an upper-case extension."""
    folder.mkdir(parents=True, exist_ok=True)
    names = ["with space.jpg", "  leading and trailing  .jpg", "Ünïcødé-ñame.jpg", "日本語の画像.jpg",
             "emoji-📷.jpeg", "UPPER.JPG"]
    paths = []
    for number, name in enumerate(names):
        path = folder / name
        path.write_bytes(tiny_jpeg(seed + number, 40 + number, 52))
        paths.append(path)
    return paths


def write_large_jpeg(path: Path, height: int = 6000, width: int = 8000) -> Path:
    """A ``width`` x ``height`` JPEG (default 8000x6000, 48 MPixel) of smooth ramps: compresses to ~1 MB."""
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :]
    pixels = np.empty((height, width, 3), dtype=np.uint8)
    pixels[..., 0] = x.astype(np.uint8)
    pixels[..., 1] = y.astype(np.uint8)
    pixels[..., 2] = ((x + y) / 2).astype(np.uint8)
    Image.fromarray(pixels).save(path, "JPEG", quality=85)
    return path


# ---------------------------------------------------------------------------------------------
# Mutated images for the decode fuzz test: valid small JPEGs, PNGs and WebPs, then damaged the
# ways real files are (bit flips, cuts, overwritten bytes) and the ways only a crafted file is
# (chunk and segment lengths edited, chunk data changed with its CRC recomputed, image data
# changed and recompressed) — the last two reach a decoder past every checksum.

FUZZ_FORMATS = ("jpeg", "png", "webp")


def _small_image(format: str, rng: np.random.Generator, variant: int) -> bytes:
    """One valid small image of ``format``; ``variant`` picks its flavour (mode, progressive, lossless)."""
    height, width = int(rng.integers(6, 33)), int(rng.integers(6, 33))
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    image = Image.fromarray(pixels)
    buffer = io.BytesIO()
    if format == "jpeg":
        image = image.convert("L") if variant % 3 == 2 else image
        image.save(buffer, "JPEG", quality=85, progressive=variant % 3 == 1)
    elif format == "png":
        image = [image, image.convert("RGBA"), image.convert("L"), image.quantize(colors=16),
                 Image.fromarray(pixels[..., 0].astype(np.uint16) * 257)][variant % 5]
        text = PngImagePlugin.PngInfo()
        text.add_text("Comment", "fuzz")
        text.add_text("Title", "compressed " * 8, zip=True)
        extras = {"pnginfo": text, "dpi": (72, 72)} if variant % 2 else {}  # tEXt, zTXt, pHYs: ancillary chunks
        image.save(buffer, "PNG", **extras)
    else:
        image.save(buffer, "WEBP", quality=80, lossless=variant % 2 == 1)
    return buffer.getvalue()


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")


def png_chunks(data: bytes) -> list[tuple[int, int, bytes]]:
    """(offset, data length, type) of each chunk of a valid PNG."""
    chunks, position = [], 8
    while position + 8 <= len(data):
        length = int.from_bytes(data[position:position + 4], "big")
        chunks.append((position, length, data[position + 4:position + 8]))
        position += 12 + length
    return chunks


def _flip_bits(data: bytes, rng: np.random.Generator) -> bytes:
    out = bytearray(data)
    for _ in range(int(rng.integers(1, 5))):
        out[int(rng.integers(0, len(out)))] ^= 1 << int(rng.integers(0, 8))
    return bytes(out)


def _overwrite(data: bytes, rng: np.random.Generator) -> bytes:
    out = bytearray(data)
    for _ in range(int(rng.integers(1, 4))):
        out[int(rng.integers(0, len(out)))] = int(rng.integers(0, 256))
    return bytes(out)


def _edit_length(format: str, data: bytes, rng: np.random.Generator) -> bytes:
    """Change one chunk's (PNG, WebP) or segment's (JPEG) length field to a nearby or wild value."""
    out = bytearray(data)
    if format == "png":
        fields = [(offset, 4, "big") for offset, _, _ in png_chunks(data)]
    elif format == "webp":
        fields = [(4, 4, "little"), (16, 4, "little")]  # RIFF size, first chunk's size
    else:
        fields, position = [], 2
        while position + 4 <= len(data) and data[position] == 0xFF and data[position + 1] != 0xDA:
            fields.append((position + 2, 2, "big"))
            position += 2 + int.from_bytes(data[position + 2:position + 4], "big")
    offset, width, order = fields[int(rng.integers(0, len(fields)))]
    value = int.from_bytes(out[offset:offset + width], order)
    value = [value + 1, value - 1, value * 2, 0, 2 ** (8 * width) - 1][int(rng.integers(0, 5))] % 2 ** (8 * width)
    out[offset:offset + width] = value.to_bytes(width, order)
    return bytes(out)


def _png_recrc(data: bytes, rng: np.random.Generator) -> bytes:
    """Overwrite bytes in one chunk's data and recompute its CRC: damage no checksum reveals."""
    chunks = [c for c in png_chunks(data) if c[1] > 0]
    offset, length, kind = chunks[int(rng.integers(0, len(chunks)))]
    body = bytearray(data[offset + 8:offset + 8 + length])
    for _ in range(int(rng.integers(1, 3))):
        body[int(rng.integers(0, length))] = int(rng.integers(0, 256))
    return data[:offset] + _png_chunk(kind, bytes(body)) + data[offset + 12 + length:]


def _png_recompress(data: bytes, rng: np.random.Generator) -> bytes:
    """Change the inflated image data (row filter bytes included), cut or extend it, recompress it: a
    complete zlib stream with right checksums that libpng would still reject."""
    chunks = png_chunks(data)
    idat = [c for c in chunks if c[2] == b"IDAT"]
    raw = bytearray(zlib.decompress(b"".join(data[o + 8:o + 8 + n] for o, n, _ in idat)))
    how = int(rng.integers(0, 3))
    if how == 0:
        raw[int(rng.integers(0, len(raw)))] = int(rng.integers(0, 256))
    elif how == 1:
        raw = raw[:int(rng.integers(0, len(raw)))]
    else:
        raw += bytes(int(rng.integers(1, 64)))
    start, end = idat[0][0], idat[-1][0] + 12 + idat[-1][1]
    return data[:start] + _png_chunk(b"IDAT", zlib.compress(bytes(raw))) + data[end:]


def mutated_images(count: int, seed: int = 0) -> list[tuple[str, str, bytes]]:
    """``count`` mutated images, cycling through formats: (format, mutation name, bytes)."""
    rng = np.random.default_rng(seed)
    generic = {"bit_flips": _flip_bits, "truncated": lambda d, r: d[:int(r.integers(1, len(d)))],
               "overwritten": _overwrite}
    out = []
    for number in range(count):
        format = FUZZ_FORMATS[number % len(FUZZ_FORMATS)]
        data = _small_image(format, rng, number // len(FUZZ_FORMATS))
        names = list(generic) + ["length_edited"] + (["recrc", "recompressed"] if format == "png" else [])
        name = names[int(rng.integers(0, len(names)))]
        if name in generic:
            mutated = generic[name](data, rng)
        elif name == "length_edited":
            mutated = _edit_length(format, data, rng)
        else:
            mutated = (_png_recrc if name == "recrc" else _png_recompress)(data, rng)
        out.append((format, name, mutated))
    return out


# ---------------------------------------------------------------------------------------------
# Hand-built PNGs: every chunk under the test's control (PIL writes neither interlaced PNGs nor
# damaged ones).

_ADAM7 = ((0, 8, 0, 8), (0, 8, 4, 8), (4, 8, 0, 4), (0, 4, 2, 4), (2, 4, 0, 2), (0, 2, 1, 2), (1, 2, 0, 1))


def png_image_data(pixels: np.ndarray, *, interlaced: bool = False) -> bytes:
    """The uncompressed IDAT content of 8-bit ``pixels`` (HxW gray or HxWx3 RGB): filter 0 rows,
    in Adam7 pass order when ``interlaced``."""
    passes = _ADAM7 if interlaced else ((0, 1, 0, 1),)
    rows = []
    for top, row_step, left, column_step in passes:
        sub = pixels[top::row_step, left::column_step]
        if sub.size:
            rows.extend(b"\x00" + row.tobytes() for row in sub)
    return b"".join(rows)


def build_png(pixels: np.ndarray, *, interlaced: bool = False, before_data: tuple[bytes, ...] = (),
              after_data: tuple[bytes, ...] = (), image_data: bytes | None = None,
              compressed: bytes | None = None, idat_parts: int = 1) -> bytes:
    """A PNG of 8-bit ``pixels``; ``before_data``/``after_data`` are whole chunks (see :func:`png_chunk`)
    placed around the IDAT chunks; ``image_data`` replaces the uncompressed IDAT content and
    ``compressed`` the compressed stream; the stream is split over ``idat_parts`` IDAT chunks."""
    height, width = pixels.shape[:2]
    colour = 2 if pixels.ndim == 3 else 0
    header = png_chunk(b"IHDR", width.to_bytes(4, "big") + height.to_bytes(4, "big")
                       + bytes([8, colour, 0, 0, int(interlaced)]))
    if compressed is None:
        compressed = zlib.compress(png_image_data(pixels, interlaced=interlaced) if image_data is None else image_data)
    step = -(-len(compressed) // idat_parts)
    idat = b"".join(png_chunk(b"IDAT", compressed[n:n + step]) for n in range(0, len(compressed), step))
    return (b"\x89PNG\r\n\x1a\n" + header + b"".join(before_data) + idat + b"".join(after_data)
            + png_chunk(b"IEND", b""))


def png_chunk(kind: bytes, data: bytes) -> bytes:
    """One PNG chunk with its length and a correct CRC."""
    return _png_chunk(kind, data)


def exif_payload(orientation: int, byte_order: str = "MM") -> bytes:
    """A TIFF structure holding only the orientation tag (an Exif segment's content after ``Exif\\0\\0``)."""
    e = "<" if byte_order == "II" else ">"
    return (byte_order.encode() + struct.pack(e + "HI", 42, 8) + struct.pack(e + "H", 1)
            + struct.pack(e + "HHIHH", 0x0112, 3, 1, orientation, 0) + struct.pack(e + "I", 0))
