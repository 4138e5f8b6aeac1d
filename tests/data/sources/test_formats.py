"""The structural check every file passes before a decoder sees it (:mod:`dali_bridge.data.sources.formats`).

Each damaged PNG here would crash the process inside torchvision's libpng decoder (a segmentation
fault on any libpng error); each malformed JPEG or WebP would be read differently by the two
backends' decoders. All must be refused with a reason, and valid files — interlaced PNGs, image
data split over many chunks, ancillary chunks — must still pass and decode alike on both.
"""
from __future__ import annotations

import io
import json
import subprocess
import sys
import tracemalloc
import zlib

import numpy as np
import pytest
from PIL import Image

from tests.helpers.backends import CPU_BACKENDS
from tests.helpers.paths import REPO
from tests.helpers.hostile import png_chunks, build_png, exif_payload, png_chunk, png_image_data, tiny_jpeg

from dali_bridge.data.sources.formats import ImageInfo, inspect_image, without_webp_exif
from dali_bridge.errors import ImageError
from dali_bridge.data.sources.images import decode_rgb

PIXELS = np.random.default_rng(4).integers(0, 256, (12, 10, 3), dtype=np.uint8)
RAW = png_image_data(PIXELS)


def _with_bad_crc(chunk: bytes) -> bytes:
    return chunk[:-4] + bytes(b ^ 0xFF for b in chunk[-4:])


def _pil_png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


def _reorder(data: bytes, order) -> bytes:
    """A PNG's chunks re-assembled as ``order(list of whole chunks as (type, bytes))`` returns them."""
    chunks = [(kind, data[offset:offset + 12 + length]) for offset, length, kind in png_chunks(data)]
    return data[:8] + b"".join(chunk for _, chunk in order(chunks))


def _ihdr(width: int, height: int, depth: int = 8, colour: int = 2, interlace: int = 0) -> bytes:
    return png_chunk(b"IHDR", width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([depth, colour, 0, 0,
                                                                                              interlace]))


def _replace_header(data: bytes, header: bytes) -> bytes:
    return data[:8] + header + data[8 + 25:]


def _bad_filter_in_last_pass() -> bytes:
    raw = bytearray(png_image_data(PIXELS, interlaced=True))
    last_row = len(raw) - (1 + PIXELS.shape[1] * 3)  # pass 7 holds whole rows: its last row's filter byte
    raw[last_row] = 9
    return build_png(PIXELS, interlaced=True, image_data=bytes(raw))


_PALETTE_PNG = _pil_png(Image.fromarray(PIXELS).quantize(colors=8))

BROKEN_PNGS = {
    "crc_of_the_image_data": (_reorder(build_png(PIXELS), lambda cs: [(k, _with_bad_crc(c) if k == b"IDAT" else c)
                                                                       for k, c in cs]), "CRC mismatch in chunk IDAT"),
    "crc_of_an_ancillary_chunk": (build_png(PIXELS, before_data=(_with_bad_crc(png_chunk(b"tEXt", b"a\x00b")),)),
                                  "CRC mismatch in chunk tEXt"),
    "image_data_short": (build_png(PIXELS, image_data=RAW[:-5]), f"holds {len(RAW) - 5} bytes; the 10x12 header "
                                                                  f"implies {len(RAW)}"),
    "image_data_long": (build_png(PIXELS, image_data=RAW + bytes(10)), "inflates to more than"),
    "compressed_stream_cut": (build_png(PIXELS, compressed=zlib.compress(RAW)[:-6]), "compressed stream is cut short"),
    "compressed_stream_damaged": (build_png(PIXELS, compressed=zlib.compress(RAW)[:-4] + b"\0\0\0\0"),
                                  "does not inflate"),
    "data_after_the_stream": (build_png(PIXELS, compressed=zlib.compress(RAW) + b"junk"), "data after the end"),
    "bad_row_filter": (build_png(PIXELS, image_data=b"\x05" + RAW[1:]), "invalid row filter type 5 at byte 0"),
    "bad_row_filter_in_the_last_interlace_pass": (_bad_filter_in_last_pass(), "invalid row filter type 9"),
    "palette_image_without_palette": (_reorder(_PALETTE_PNG, lambda cs: [x for x in cs if x[0] != b"PLTE"]),
                                      "palette image without a PLTE chunk"),
    "palette_after_the_image_data": (_reorder(_PALETTE_PNG, lambda cs: [x for x in cs if x[0] not in (b"PLTE", b"IEND")]
                                              + [x for x in cs if x[0] == b"PLTE"] + [cs[-1]]), "PLTE repeated, after"),
    "unknown_critical_chunk": (build_png(PIXELS, before_data=(png_chunk(b"ABCD", b"x"),)),
                               "unexpected critical chunk ABCD"),
    "image_data_chunks_apart": (_reorder(build_png(PIXELS, idat_parts=2), lambda cs: cs[:2] + [
        (b"tEXt", png_chunk(b"tEXt", b"a\x00b"))] + cs[2:]), "IDAT chunks are not consecutive"),
    "no_image_data": (_reorder(build_png(PIXELS), lambda cs: [x for x in cs if x[0] != b"IDAT"]), "no IDAT chunk"),
    "illegal_bit_depth": (_replace_header(build_png(PIXELS), _ihdr(10, 12, depth=7)), "bit depth 7 with colour type 2"),
    "interlace_method_2": (_replace_header(build_png(PIXELS), _ihdr(10, 12, interlace=2)), "interlace 2"),
    "wider_than_libpng_allows": (_replace_header(build_png(PIXELS), _ihdr(1_000_001, 1)),
                                 "over the decoder's 1,000,000"),
    "zero_width": (_replace_header(build_png(PIXELS), _ihdr(0, 12)), "image has no pixels (0x12)"),
    "chunk_length_past_the_end": (build_png(PIXELS)[:33] + (2 ** 20).to_bytes(4, "big") + build_png(PIXELS)[37:],
                                  "chunk IDAT at byte 33 claims 1048576 bytes"),
    "chunk_type_not_letters": (build_png(PIXELS, before_data=(png_chunk(b"tE1t", b"x"),)), "invalid chunk type"),
    "two_exif_chunks": (build_png(PIXELS, before_data=(png_chunk(b"eXIf", exif_payload(1)),
                                                       png_chunk(b"eXIf", exif_payload(6)))),
                        "ambiguous EXIF orientation"),
    "exif_after_the_image_data": (build_png(PIXELS, after_data=(png_chunk(b"eXIf", exif_payload(6)),)),
                                  "ambiguous EXIF orientation"),
    "no_end_chunk": (build_png(PIXELS)[:-12], "truncated PNG: no IEND chunk"),
}


@pytest.mark.parametrize("name", BROKEN_PNGS)
def test_damaged_png_is_refused_with_the_reason(name):
    data, reason = BROKEN_PNGS[name]
    with pytest.raises(ImageError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        inspect_image(data)


@pytest.mark.slow
def test_decoding_every_damaged_png_raises_instead_of_crashing_the_process(tmp_path):
    # In a subprocess: without the check each of these kills the interpreter inside libpng.
    for name, (data, _) in BROKEN_PNGS.items():
        (tmp_path / f"{name}.png").write_bytes(data)
    code = ("import json, pathlib, sys\nfrom dali_bridge.errors import ImageError\n"
            "from dali_bridge.data.sources.images import decode_rgb\nout = {}\n"
            "for path in sorted(pathlib.Path(sys.argv[1]).iterdir()):\n"
            "    try:\n        decode_rgb(path.read_bytes()); out[path.stem] = 'decoded'\n"
            "    except ImageError as exc:\n        out[path.stem] = str(exc)\nprint(json.dumps(out))\n")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120,
                            cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    reasons = json.loads(result.stdout)
    assert set(reasons) == set(BROKEN_PNGS)
    for name, reason in reasons.items():
        assert BROKEN_PNGS[name][1] in reason, (name, reason)


VALID_PNGS = {
    "interlaced_1x1": build_png(PIXELS[:1, :1], interlaced=True),
    "interlaced_3x5": build_png(PIXELS[:3, :5], interlaced=True),
    "interlaced_12x10_gray": build_png(PIXELS[..., 0], interlaced=True),
    "image_data_in_seven_chunks": build_png(PIXELS, idat_parts=7),
    "ancillary_chunks": build_png(PIXELS, before_data=(png_chunk(b"gAMA", (45455).to_bytes(4, "big")),
                                                       png_chunk(b"tEXt", b"Comment\x00hello")),
                                  after_data=(png_chunk(b"tIME", bytes(7)),)),
    "data_after_the_end_chunk": build_png(PIXELS) + b"trailing",
    "palette": _PALETTE_PNG,
}


@pytest.mark.parametrize("name", VALID_PNGS)
def test_valid_png_passes_and_decodes_to_its_pixels(name):
    data = VALID_PNGS[name]
    info = inspect_image(data)
    decoded = decode_rgb(data).permute(1, 2, 0).numpy()
    assert (info.height, info.width) == decoded.shape[:2]
    if name != "palette":
        expected = {"interlaced_1x1": PIXELS[:1, :1], "interlaced_3x5": PIXELS[:3, :5],
                    "interlaced_12x10_gray": np.repeat(PIXELS[..., :1], 3, axis=2)}.get(name, PIXELS)
        assert np.array_equal(decoded, expected)


@pytest.mark.skipif("dali-cpu" not in CPU_BACKENDS, reason="needs DALI")
def test_valid_pngs_decode_alike_on_dali():
    from tests.helpers.fuzz_decode_worker import DaliDecoder

    dali = DaliDecoder()
    for name, data in VALID_PNGS.items():
        pixels = dali.decode(data)
        assert pixels is not None, name
        assert np.array_equal(pixels, decode_rgb(data).permute(1, 2, 0).numpy()), name


def test_png_check_inflates_in_bounded_steps():
    # 8000 x 10000 gray: 80 MB of image data in a ~80 KB file; checking it must not hold it.
    width, height = 10_000, 8_000
    deflater = zlib.compressobj()
    row = b"\x00" + bytes(width)
    stream = b"".join(deflater.compress(row * 100) for _ in range(height // 100)) + deflater.flush()
    header = _ihdr(width, height, colour=0)
    data = b"\x89PNG\r\n\x1a\n" + header + png_chunk(b"IDAT", stream) + png_chunk(b"IEND", b"")
    tracemalloc.start()
    try:
        info = inspect_image(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert info == ImageInfo("png", height, width, 1)
    assert peak < 8 * 2 ** 20, f"peak {peak / 2 ** 20:.1f} MiB while checking a {len(data)}-byte PNG"


# ---------------------------------------------------------------------------------------------
# JPEG and WebP structure

JPEG = tiny_jpeg(1)
_SOF = JPEG.index(b"\xff\xc0")
_SOF_SEGMENT = JPEG[_SOF:_SOF + 2 + int.from_bytes(JPEG[_SOF + 2:_SOF + 4], "big")]

BROKEN_JPEGS = {
    "marker_libjpeg_does_not_know": (JPEG[:2] + b"\xff\xbb\x00\x04ab" + JPEG[2:], "marker ffbb at byte 2"),
    "lossless_coding": (JPEG[:_SOF + 1] + b"\xc3" + JPEG[_SOF + 2:], r"unsupported JPEG coding process \(SOF3\)"),
    "arithmetic_coding": (JPEG[:_SOF + 1] + b"\xc9" + JPEG[_SOF + 2:], r"unsupported JPEG coding process \(SOF9\)"),
    "two_frame_headers": (JPEG[:_SOF] + _SOF_SEGMENT + JPEG[_SOF:], "two frame headers"),
    "no_frame_header": (JPEG.replace(_SOF_SEGMENT, b""), "no frame header"),
    "bytes_between_segments": (JPEG[:20] + b"\x00\x00" + JPEG[20:], "no marker at byte 20"),  # after APP0
    "segment_length_below_two": (JPEG[:2] + b"\xff\xfe\x00\x01" + JPEG[2:], "segment length 1 at byte 2"),
    "frame_without_height": (JPEG[:_SOF + 5] + b"\x00\x00" + JPEG[_SOF + 7:], r"image has no pixels \(56x0\)"),
    "second_start_of_image": (JPEG[:2] + b"\xff\xd8" + JPEG[2:], "marker ffd8 at byte 2"),
    # In the entropy-coded data: libjpeg refuses these at the end of its decode, DALI keeps the pixels.
    "unknown_marker_in_the_image_data": (JPEG[:-200] + b"\xff\x76" + JPEG[-198:],
                                         f"marker ff76 at byte {len(JPEG) - 200}, after the start of the image"),
    "frame_header_after_the_image_data": (JPEG[:-2] + _SOF_SEGMENT + JPEG[-2:], f"marker ffc0 at byte {len(JPEG) - 2}"),
    "table_segment_running_past_the_end": (JPEG[:-2] + b"\xff\xfe\x10\x00" + JPEG[-2:], "truncated JPEG"),
}


@pytest.mark.parametrize("name", BROKEN_JPEGS)
def test_malformed_jpeg_is_refused_with_the_reason(name):
    data, reason = BROKEN_JPEGS[name]
    with pytest.raises(ImageError, match=reason):
        inspect_image(data)


def _jpeg_with_restart_markers(**save) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.repeat(np.repeat(PIXELS, 4, axis=0), 4, axis=1)).save(buffer, "JPEG", restart_marker_rows=1,
                                                                              **save)
    return buffer.getvalue()


@pytest.mark.parametrize("save", [{}, {"progressive": True}], ids=["baseline", "progressive"])
def test_jpeg_with_restart_markers_and_fill_bytes_passes_and_decodes(save):
    data = _jpeg_with_restart_markers(**save)
    assert any(bytes([0xFF, marker]) in data for marker in range(0xD0, 0xD8))
    padded = data[:-2] + b"\xff\xff\xff" + data[-2:]  # fill bytes before the end-of-image marker
    for candidate in (data, padded):
        assert inspect_image(candidate) == ImageInfo("jpeg", 48, 40, 1)
        assert tuple(decode_rgb(candidate).shape) == (3, 48, 40)


def _webp(**save) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(PIXELS).save(buffer, "WEBP", **save)
    return buffer.getvalue()


def _animated_webp() -> bytes:
    frames = [Image.fromarray(np.full((12, 10, 3), value, dtype=np.uint8)) for value in (20, 200, 90)]
    buffer = io.BytesIO()
    frames[0].save(buffer, "WEBP", save_all=True, append_images=frames[1:], lossless=True)
    return buffer.getvalue()


def _replaced(data: bytes, offset: int, new: bytes) -> bytes:
    return data[:offset] + new + data[offset + len(new):]


_LOSSY, _LOSSLESS = _webp(quality=80), _webp(lossless=True)
BROKEN_WEBPS = {
    "animated": (_animated_webp(), r"animated WebP \(3 frames\)"),
    "riff_size_past_the_end": (_LOSSLESS[:-10], "the RIFF header declares"),
    "chunk_size_past_the_end": (_replaced(_LOSSY, 16, len(_LOSSY).to_bytes(4, "little")), "claims"),
    "vp8_without_start_code": (_replaced(_LOSSY, 23, b"\x00"), "no start code"),
    "vp8l_without_signature": (_replaced(_LOSSLESS, 20, b"\x00"), "no signature"),
}


@pytest.mark.parametrize("name", BROKEN_WEBPS)
def test_malformed_or_animated_webp_is_refused_with_the_reason(name):
    data, reason = BROKEN_WEBPS[name]
    with pytest.raises(ImageError, match=reason):
        inspect_image(data)


@pytest.mark.parametrize("save", [{"quality": 80}, {"lossless": True}], ids=["lossy", "lossless"])
def test_webp_header_gives_the_size_and_removing_exif_keeps_the_pixels(save):
    exif = Image.Exif()
    exif[0x0112] = 6
    data = _webp(exif=exif.tobytes(), **save)
    assert inspect_image(data) == ImageInfo("webp", 12, 10, 1)
    stripped = without_webp_exif(data)
    assert b"EXIF" not in stripped and len(stripped) < len(data)
    assert inspect_image(stripped) == ImageInfo("webp", 12, 10, 1)
    assert np.array_equal(decode_rgb(stripped).numpy(), decode_rgb(data).numpy())
    assert without_webp_exif(_webp(**save)) == _webp(**save)  # nothing to remove: the same bytes
