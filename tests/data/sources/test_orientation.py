"""One EXIF orientation rule and one animation rule, applied alike by both backends.

torchvision's JPEG decoder reads the orientation of the first APP1 segment (when it is Exif), DALI's
the last Exif segment; torchvision ignores a WebP's EXIF orientation where DALI applies it; DALI
decodes an animated WebP's first frame where torchvision refuses the file, and reads a PNG's
animation chunks where torchvision's libpng ignores them. The bridge's rules
(:mod:`dali_bridge.data.sources.formats`): a JPEG whose two readings differ is refused as ambiguous, otherwise
that orientation is applied on both; a PNG's single ``eXIf`` before its image data is applied on
both; a WebP's EXIF orientation is ignored on both; animated WebPs and PNGs are refused on both.
"""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.helpers.backends import CPU_BACKENDS
from tests.helpers.hostile import build_png, exif_payload, png_chunk

from dali_bridge import build_loader
from dali_bridge.data.sources.formats import inspect_image
from dali_bridge.data.sources.images import decode_rgb
from dali_bridge.data.sources.local import list_folder

HEIGHT, WIDTH = 20, 32
PIXELS = np.random.default_rng(8).integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)
AMBIGUOUS = "ambiguous EXIF orientation"
ANIMATED = "animated WebP (2 frames): only still images are supported"


def _jpeg() -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(PIXELS).save(buffer, "JPEG", quality=92)
    return buffer.getvalue()


def _app1(payload: bytes) -> bytes:
    return b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload


def _exif(orientation: int, byte_order: str = "MM") -> bytes:
    return _app1(b"Exif\x00\x00" + exif_payload(orientation, byte_order))


XMP = _app1(b"http://ns.adobe.com/xap/1.0/\x00<x:xmpmeta xmlns:x='adobe:ns:meta/'/>")
OTHER = _app1(b"FLIR\x00\x01 vendor data")


def jpeg_with(*segments: bytes) -> bytes:
    """The test JPEG with ``segments`` right after its start-of-image marker."""
    data = _jpeg()
    return data[:2] + b"".join(segments) + data[2:]


def _webp(orientation: int, **save) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = orientation
    buffer = io.BytesIO()
    Image.fromarray(PIXELS).save(buffer, "WEBP", exif=exif.tobytes(), **save)
    return buffer.getvalue()


def _animated(format: str) -> bytes:
    frames = [Image.fromarray(PIXELS), Image.fromarray(255 - PIXELS)]
    buffer = io.BytesIO()
    frames[0].save(buffer, format, save_all=True, append_images=frames[1:], **({"lossless": True}
                                                                              if format == "WEBP" else {}))
    return buffer.getvalue()


def _png_with_bad_animation_control() -> bytes:
    """An APNG control chunk claiming 2^32-1 frames: DALI's decoder returns other pixels than libpng's."""
    return build_png(PIXELS, before_data=(png_chunk(b"acTL", b"\xff" * 8),))


# name → (file extension, bytes, expected: decoded (height, width) or the refusal reason's start)
CASES = {
    "jpeg_exif_1_then_exif_6": (".jpg", jpeg_with(_exif(1), _exif(6)), AMBIGUOUS),
    "jpeg_exif_6_then_exif_1": (".jpg", jpeg_with(_exif(6), _exif(1)), AMBIGUOUS),
    "jpeg_xmp_then_exif_6": (".jpg", jpeg_with(XMP, _exif(6)), AMBIGUOUS),
    "jpeg_vendor_app1_then_exif_3": (".jpg", jpeg_with(OTHER, _exif(3)), AMBIGUOUS),
    "jpeg_xmp_then_exif_1": (".jpg", jpeg_with(XMP, _exif(1)), (HEIGHT, WIDTH)),
    "jpeg_exif_6_then_xmp": (".jpg", jpeg_with(_exif(6), XMP), (WIDTH, HEIGHT)),
    "jpeg_exif_6_twice": (".jpg", jpeg_with(_exif(6), _exif(6, "II")), (WIDTH, HEIGHT)),
    "jpeg_exif_3_then_exif_9": (".jpg", jpeg_with(_exif(3), _exif(9)), AMBIGUOUS),  # 9: no orientation
    "jpeg_exif_7": (".jpg", jpeg_with(_exif(7)), (WIDTH, HEIGHT)),
    "webp_lossy_exif_6": (".webp", _webp(6, quality=90), (HEIGHT, WIDTH)),
    "webp_lossless_exif_6": (".webp", _webp(6, lossless=True), (HEIGHT, WIDTH)),
    "webp_lossy_exif_3": (".webp", _webp(3, quality=90), (HEIGHT, WIDTH)),
    "webp_animated_named_jpg": (".jpg", _animated("WEBP"), ANIMATED),
    "webp_animated": (".webp", _animated("WEBP"), ANIMATED),
    "png_animated": (".png", _animated("PNG"), "animated PNG (2 frames)"),
    "png_animated_named_jpg": (".jpg", _animated("PNG"), "animated PNG (2 frames)"),
    "png_animation_control_damaged": (".png", _png_with_bad_animation_control(), "animated PNG (0 frames)"),
    "png_exif_6": (".png", build_png(PIXELS, before_data=(png_chunk(b"eXIf", exif_payload(6)),)), (WIDTH, HEIGHT)),
    "png_exif_6_twice": (".png", build_png(PIXELS, before_data=(png_chunk(b"eXIf", exif_payload(6)),) * 2),
                         AMBIGUOUS),
}


def _write_cases(root: Path) -> list[str]:
    """Each case as the one image of its own class folder; returns the case names in index order."""
    for name, (extension, data, _) in CASES.items():
        (root / name).mkdir(parents=True)
        (root / name / f"image{extension}").write_bytes(data)
    return sorted(CASES)


@pytest.mark.parametrize("name", CASES)
def test_the_check_and_the_reference_decoder_follow_the_rule(name):
    _, data, expected = CASES[name]
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
            inspect_image(data)
        return
    assert inspect_image(data).size == expected
    assert tuple(decode_rgb(data).shape[-2:]) == expected


@pytest.mark.skipif("dali-cpu" not in CPU_BACKENDS, reason="needs DALI")
def test_dali_decodes_every_accepted_case_to_the_reference_pixels(tmp_path):
    from tests.helpers.fuzz_decode_worker import DaliDecoder

    names = _write_cases(tmp_path)
    listing = list_folder(tmp_path, (".jpg", ".png", ".webp"))
    dali = DaliDecoder()
    for index, name in enumerate(names):
        if isinstance(CASES[name][2], str):
            continue
        data, size = listing.read_sized(index)  # the bytes the DALI feeder hands to DALI
        pixels = dali.decode(data)
        reference = decode_rgb(listing.read(index)).permute(1, 2, 0).numpy()
        assert pixels is not None and pixels.shape[:2] == size == reference.shape[:2], name
        assert np.abs(pixels.astype(np.int16) - reference).max() <= 1, name


@pytest.mark.skipif(len(CPU_BACKENDS) < 2, reason="needs both CPU backends (dali-cpu and torchvision)")
def test_random_resized_crop_epoch_under_skip_treats_every_case_alike_on_both_backends(tmp_path):
    names = _write_cases(tmp_path / "data")
    pipeline = {"version": 1, "name": "orientation", "source": {"type": "folder", "root": str(tmp_path / "data")},
                "batch_size": 4, "seed": 9, "ops": [{"random_resized_crop": {"size": 12}},
                                                     {"normalize": {"dtype": "uint8"}}],
                "outputs": ["image", "index"], "loader": {"workers": 0, "on_error": "skip", "shuffle": False}}
    epochs = {}
    for backend in ("torchvision", "dali-cpu"):
        with build_loader(pipeline, backend) as loader:
            batches = [(image.clone(), index.tolist()) for image, index in loader]
            skipped = {names[item.index]: item.reason for item in loader.skipped}
        epochs[backend] = (torch_cat([b[0] for b in batches]), [i for b in batches for i in b[1]], skipped)
    refused = {name for name, (_, _, expected) in CASES.items() if isinstance(expected, str)}
    (tv_images, tv_indices, tv_skipped), (dali_images, dali_indices, dali_skipped) = epochs.values()
    assert set(tv_skipped) == refused and tv_skipped == dali_skipped
    for name, reason in tv_skipped.items():
        assert reason.startswith(CASES[name][2]), (name, reason)
    assert tv_indices == dali_indices == [n for n, name in enumerate(names) if name not in refused]
    assert np.abs(tv_images.numpy().astype(np.int16) - dali_images.numpy()).max() <= 1


def torch_cat(images):
    import torch

    return torch.cat(images)
