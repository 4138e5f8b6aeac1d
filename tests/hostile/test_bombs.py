"""Decompression bombs: a few hundred bytes whose header claims 30000x30000 pixels.

``source.max_pixels`` (default PIL's ``Image.MAX_IMAGE_PIXELS``) is checked from the header before
anything is decoded or inflated, on every backend: over it is a sample error naming the size, and
the process's memory stays near where it was (a decode would need 2.7 GB per image).
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
from PIL import Image

from tests.helpers.backends import CPU_BACKENDS, backend_params
from tests.helpers.paths import REPO
from tests.helpers.hostile import png_chunk, tiny_jpeg, write_image_folder
from tests.helpers.fuzz import crashed, run_worker

from dali_bridge import build_loader
from dali_bridge.data.sources.formats import inspect_image
from dali_bridge.spec.model import DEFAULT_MAX_PIXELS
from dali_bridge.errors import ImageError, SampleError
from dali_bridge.spec.model import DEFAULT_MAX_BYTES
from dali_bridge.spec.pipeline import spec_from_dict
from dali_bridge.spec.problems import SpecError

# Child processes import this checkout's package.
_ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def jpeg_claiming(width: int, height: int, **save) -> bytes:
    """A small valid JPEG whose frame header claims ``width`` x ``height``."""
    data = tiny_jpeg(3, **save)
    sof = data.index(b"\xff\xc2" if save.get("progressive") else b"\xff\xc0")
    return data[:sof + 5] + height.to_bytes(2, "big") + width.to_bytes(2, "big") + data[sof + 9:]


def png_claiming(width: int, height: int, colour: int = 2) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` with a tiny (incomplete) image data stream."""
    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, colour, 0, 0, 0])
    data = zlib.compress(b"\x00" * 4096)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", data) + png_chunk(b"IEND", b"")


def webp_claiming(width: int, height: int) -> bytes:
    """A lossless WebP whose VP8L header claims ``width`` x ``height`` (at most 16384 each)."""
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(buffer, "WEBP", lossless=True)
    data = bytearray(buffer.getvalue())
    bits = int.from_bytes(data[21:25], "little")
    bits = (bits & ~((1 << 28) - 1)) | (width - 1) | ((height - 1) << 14)
    data[21:25] = bits.to_bytes(4, "little")
    return bytes(data)


BOMBS = {
    "jpeg_30000x30000": (jpeg_claiming(30000, 30000), "30000x30000 = 900,000,000 pixels"),
    "jpeg_progressive_65535x65535": (jpeg_claiming(65535, 65535, progressive=True), "65535x65535"),
    "jpeg_9460x9460": (jpeg_claiming(9460, 9460), "9460x9460 = 89,491,600 pixels"),  # just over the cap
    "png_30000x30000": (png_claiming(30000, 30000), "30000x30000 = 900,000,000 pixels"),
    "png_gray_100000x1000": (png_claiming(100000, 1000, colour=0), "100000x1000"),
    "webp_16384x16384": (webp_claiming(16384, 16384), "16384x16384 = 268,435,456 pixels"),
}


def test_default_pixel_cap_is_pils():
    assert DEFAULT_MAX_PIXELS == Image.MAX_IMAGE_PIXELS


@pytest.mark.parametrize("name", BOMBS)
def test_header_over_the_pixel_cap_is_refused_naming_the_size(name):
    data, size = BOMBS[name]
    assert len(data) < 2000  # a few hundred bytes on disk
    with pytest.raises(ImageError, match=f"image too large: {size}.*over source.max_pixels = 89,478,485"):
        inspect_image(data, max_pixels=DEFAULT_MAX_PIXELS)


def test_header_just_under_the_cap_is_not_refused_for_its_size():
    # 9459 x 9459 = 89,473,681 pixels: within the cap (the truncated stream is what refuses this PNG).
    with pytest.raises(ImageError, match="corrupt PNG"):
        inspect_image(png_claiming(9459, 9459, colour=0), max_pixels=DEFAULT_MAX_PIXELS)
    assert inspect_image(jpeg_claiming(9459, 9459), max_pixels=DEFAULT_MAX_PIXELS).size == (9459, 9459)


def _bomb_folder(root):
    files = write_image_folder(root, classes=2, per_class=4)
    for number, (name, (data, _)) in enumerate(BOMBS.items()):
        extension = name.split("_")[0].replace("jpeg", "jpg")
        (root / f"class_{number % 2}" / f"bomb_{name}.{extension}").write_bytes(data)
    return files


@pytest.mark.skipif(not CPU_BACKENDS, reason="no CPU backend")
@pytest.mark.slow
def test_bombs_are_skipped_alike_in_bounded_memory_on_each_cpu_backend(tmp_path):
    _bomb_folder(tmp_path / "data")
    pipeline = {"version": 1, "name": "bombs", "source": {"type": "folder", "root": str(tmp_path / "data")},
                "batch_size": 4, "seed": 1, "ops": [{"random_resized_crop": {"size": 16}},
                                                     {"normalize": {"dtype": "uint8"}}],
                "outputs": ["image", "index"], "loader": {"workers": 0, "on_error": "skip", "shuffle": False}}
    (tmp_path / "pipeline.json").write_text(json.dumps(pipeline))
    outcomes = {}
    for backend in CPU_BACKENDS:
        report = tmp_path / f"{backend}.npz"
        result = run_worker("loader", str(tmp_path / "pipeline.json"), backend, str(report))
        assert result.returncode == 0, crashed(result)
        with np.load(report) as epoch:
            outcomes[backend] = {key: epoch[key] for key in epoch.files}
    for backend, epoch in outcomes.items():
        reasons = epoch["skipped_reasons"].tolist()
        assert len(reasons) == len(BOMBS) and len(epoch["indices"]) == 8, backend
        assert all(reason.startswith("image too large: ") for reason in reasons), reasons
        # Generous bound: one decoded 30000x30000 RGB image alone is 2.7 GB.
        assert epoch["peak_growth_bytes"] < 512 * 2 ** 20, (backend, int(epoch["peak_growth_bytes"]))
    first = next(iter(outcomes.values()))
    for epoch in outcomes.values():
        assert epoch["skipped_reasons"].tolist() == first["skipped_reasons"].tolist()
        assert epoch["skipped_indices"].tolist() == first["skipped_indices"].tolist()


def _pipeline(root, **source) -> dict:
    return {"version": 1, "name": "cap", "source": {"type": "folder", "root": str(root), **source},
            "batch_size": 4, "seed": 2, "ops": [{"center_crop": {"size": 16}}, {"normalize": {"dtype": "uint8"}}],
            "outputs": ["image", "index"], "loader": {"workers": 0, "on_error": "skip", "shuffle": False}}


@pytest.mark.parametrize("backend", backend_params(["dali-cpu", "torchvision"]))
def test_source_max_pixels_refuses_larger_images_naming_their_size(tmp_path, backend):
    files = write_image_folder(tmp_path / "data", classes=2, per_class=5)
    sizes = [Image.open(path).size for path in files]
    cap = sorted(w * h for w, h in sizes)[len(sizes) // 2]
    over = [n for n, (w, h) in enumerate(sizes) if w * h > cap]
    loader = build_loader(_pipeline(tmp_path / "data", max_pixels=cap), backend)
    yielded = [i for _, index in loader for i in index.tolist()]
    assert sorted(item.index for item in loader.skipped) == over and len(yielded) == len(files) - len(over)
    for item in loader.skipped:
        width, height = sizes[item.index]
        assert item.reason == (f"image too large: {width}x{height} = {width * height:,} pixels, over "
                               f"source.max_pixels = {cap:,} (raise it if such images are expected)")
    raising = build_loader(_pipeline(tmp_path / "data", max_pixels=cap) | {"loader": {"workers": 0,
                                                                                      "shuffle": False}}, backend)
    with pytest.raises(SampleError, match=f"sample {over[0]} .*image too large"):
        list(raising)
    raising.close()
    loader.close()


@pytest.mark.parametrize("value", [0, -5, "many", 1.5, True])
def test_source_max_pixels_must_be_a_positive_integer(tmp_path, value):
    with pytest.raises(SpecError, match=r"source\.max_pixels: expected an integer >= 1"):
        spec_from_dict(_pipeline(tmp_path, max_pixels=value))


def test_source_max_pixels_defaults_to_the_cap_and_survives_a_round_trip(tmp_path):
    assert spec_from_dict(_pipeline(tmp_path)).source.max_pixels == DEFAULT_MAX_PIXELS
    spec = spec_from_dict(_pipeline(tmp_path, max_pixels=250_000_000))
    assert spec.source.max_pixels == 250_000_000
    assert spec_from_dict(spec.to_dict()).source.max_pixels == 250_000_000


# ---- bytes per sample: source.max_bytes

def _skips_and_yield(pipeline: dict, backend: str) -> tuple[list, list[int]]:
    loader = build_loader(pipeline, backend)
    try:
        yielded = [i for _, index in loader for i in index.tolist()]
        return [(item.index, item.reason) for item in loader.skipped], yielded
    finally:
        loader.close()


@pytest.mark.parametrize("backend", backend_params(["dali-cpu", "torchvision"]))
def test_source_max_bytes_refuses_larger_files_as_sample_errors_naming_their_size(tmp_path, backend):
    files = write_image_folder(tmp_path / "data", classes=2, per_class=5)
    sizes = [path.stat().st_size for path in files]
    cap = sorted(sizes)[len(sizes) // 2]
    over = [n for n, size in enumerate(sizes) if size > cap]
    skipped, yielded = _skips_and_yield(_pipeline(tmp_path / "data", max_bytes=cap), backend)
    assert [index for index, _ in skipped] == over and len(yielded) == len(files) - len(over)
    assert [reason for _, reason in skipped] == [
        f"file too large: {sizes[n]:,} bytes, over source.max_bytes = {cap:,} (raise it if such files are expected)"
        for n in over]
    raising = build_loader(_pipeline(tmp_path / "data", max_bytes=cap) | {"loader": {"workers": 0, "shuffle": False}},
                           backend)
    with pytest.raises(SampleError, match=f"sample {over[0]} .*file too large: {sizes[over[0]]:,} bytes"):
        list(raising)
    raising.close()


@pytest.mark.parametrize("backend", backend_params(["dali-cpu", "torchvision"]))
def test_source_max_bytes_caps_shard_members_from_the_index(tmp_path, backend):
    from dali_bridge.tools.convert import convert

    files = write_image_folder(tmp_path / "data", classes=2, per_class=4)
    convert(tmp_path / "data", str(tmp_path / "shards" / "s-%06d.tar"), shard_size=4)
    sizes = [path.stat().st_size for path in files]
    cap = sorted(sizes)[len(sizes) // 2]
    pipeline = _pipeline(tmp_path / "data", max_bytes=cap)
    pipeline["source"] = {"type": "webdataset", "shards": str(tmp_path / "shards" / "s-{000000..000001}.tar"),
                          "max_bytes": cap}
    skipped, yielded = _skips_and_yield(pipeline, backend)
    assert sorted(index for index, _ in skipped) == [n for n, size in enumerate(sizes) if size > cap]
    assert all(reason.startswith("file too large: ") for _, reason in skipped)


@pytest.mark.slow
def test_an_over_size_file_is_refused_from_its_size_without_being_read(tmp_path):
    """A sparse 1 TiB file under a 1 GiB address-space cap: reading it would die of MemoryError."""
    files = write_image_folder(tmp_path / "data", classes=1, per_class=2)
    with open(files[0], "r+b") as handle:
        handle.truncate(1 << 40)
    code = ("import resource, sys; from dali_bridge.data.sources.local import list_folder;"
            "listing = list_folder(sys.argv[1], ('.jpg',));"
            "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
            "try:\n    listing.read(0)\nexcept Exception as exc:\n    print(type(exc).__name__, exc)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "data")], capture_output=True, text=True,
                          timeout=120, env=_ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == (f"ImageError file too large: {1 << 40:,} bytes, over source.max_bytes = "
                                   f"{DEFAULT_MAX_BYTES:,} (raise it if such files are expected)")


def test_a_file_that_grows_past_the_cap_while_read_is_refused(tmp_path, monkeypatch):
    from dali_bridge.data.sources import images

    path = tmp_path / "grows.jpg"
    path.write_bytes(b"\xff\xd8" + b"\x00" * 100)
    real_read = os.read
    monkeypatch.setattr(images.os, "read", lambda fd, n: real_read(fd, n) or b"\x00" * 4096)  # never ends
    with pytest.raises(images.ImageError, match="file too large: .* over source.max_bytes = 10,000"):
        images.read_file(str(path), max_bytes=10_000)


@pytest.mark.parametrize("value", [0, -5, "many", 1.5, True])
def test_source_max_bytes_must_be_a_positive_integer(tmp_path, value):
    with pytest.raises(SpecError, match=r"source\.max_bytes: expected an integer >= 1"):
        spec_from_dict(_pipeline(tmp_path, max_bytes=value))


def test_source_max_bytes_defaults_to_converts_cap_and_survives_a_round_trip(tmp_path):
    from dali_bridge.tools.convert import MAX_IMAGE_BYTES

    assert spec_from_dict(_pipeline(tmp_path)).source.max_bytes == DEFAULT_MAX_BYTES == MAX_IMAGE_BYTES
    spec = spec_from_dict(_pipeline(tmp_path, max_bytes=1 << 30))
    assert spec.source.max_bytes == 1 << 30 and spec_from_dict(spec.to_dict()).source.max_bytes == 1 << 30
