"""Decoding only a crop's window (dali_bridge.pipeline.region_decode) gives the pixels of full decode then crop.

libjpeg-turbo skips rows outside the window (``jpeg_skip_scanlines``) and crops columns
(``jpeg_crop_scanline``) independently of each other, so every row span with the full width and
every column span with the full height covers each way a window can fall across the blocks; a
tiny image also gets every window there is. Larger real photos (scikit-image's, at two
qualities and chroma subsamplings, baseline and progressive) get windows at every edge, odd
offsets and the random resized crop windows the bridge draws. The whole pipeline's pixels, with
the crop step made the identity over the decoded window, equal those of the full decode.
"""
from __future__ import annotations

import io
import multiprocessing

import numpy as np
import pytest
import torch
from tests.helpers.backends import plan_of
from tests.helpers.paths import TRAIN, VAL
from PIL import Image
from tests.helpers.real_photos import write_real_photos
from tests.helpers.exif import with_exif_orientation

from dali_bridge.pipeline import region_decode
from dali_bridge.backends.torchvision import apply_steps
from dali_bridge.cli.main import main
from dali_bridge.data.sources.formats import inspect_image
from dali_bridge.errors import ImageError
from dali_bridge.data.sources.images import decode_rgb
from dali_bridge.ops.geometry import Crop, rrc_window
from dali_bridge.pipeline.region_decode import decode_region, decode_steps, decoded_window, region_decoder
from dali_bridge.pipeline.sampling import draws, sample_steps, uniforms

needs_region_decoder = pytest.mark.skipif(not region_decode.region_decode_available(),
                                          reason="nvImageCodec (installed with nvidia-dali-cuda120) does not load "
                                                 "here: only the full-decode fallback can be tested")


def _encode(image: Image.Image, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", **options)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> dict[str, bytes]:
    """The real photos as written (baseline), and progressive at both settings for one colour and one
    grey photo, named by file."""
    root = write_real_photos(tmp_path_factory.mktemp("photos"))
    found = {path.name: path.read_bytes() for path in sorted(root.rglob("*.jpg"))}
    for name in ("colour/chelsea", "grey/camera"):
        image = Image.open(root / f"{name}_q95.jpg")
        found[f"{name}_q75_progressive.jpg"] = _encode(image, quality=75, subsampling=2, progressive=True)
        found[f"{name}_q95_progressive.jpg"] = _encode(image, quality=95, subsampling=0, progressive=True)
    return found


def _small(height: int, width: int, **options) -> bytes:
    """A noisy photo-like JPEG of an odd size: partial blocks at the right and bottom edges."""
    rng = np.random.default_rng(height * 1000 + width)
    ramp = np.linspace(0, 200, height * width * 3).reshape(height, width, 3)
    pixels = np.clip(ramp + rng.normal(0, 30, ramp.shape), 0, 255).astype(np.uint8)
    return _encode(Image.fromarray(pixels), **options)


SMALL_OPTIONS = {"420": {"quality": 75, "subsampling": 2}, "444": {"quality": 95, "subsampling": 0},
                 "422_progressive": {"quality": 85, "subsampling": 1, "progressive": True}}


def _spans(size: int) -> list[tuple[int, int]]:
    """(start, length) spans along one axis: the whole, single pixels at both ends, block edges
    (8 and 16 pixels) crossed by one, odd offsets and lengths, the far end."""
    spans = {(0, size), (0, 1), (size - 1, 1), (1, size - 1), (0, size - 1), (7, 2), (8, 8), (15, 3),
             (17, size - 34), (size // 2 + 1, size // 3), (size - 17, 17), (size - 9, 8), (3, 1)}
    return sorted((start, length) for start, length in spans if start >= 0 and length > 0 and start + length <= size)


def _assert_windows_match(data: bytes, windows, name: str) -> None:
    full = decode_rgb(data)
    for top, left, height, width in windows:
        got = decode_region(data, top, left, height, width)
        want = full[:, top:top + height, left:left + width]
        assert got.dtype == torch.uint8 and got.shape == want.shape, (name, top, left, height, width)
        assert torch.equal(got, want), (name, top, left, height, width,
                                        int((got.int() - want.int()).abs().max()))


@pytest.mark.parametrize("kind", sorted(SMALL_OPTIONS))
def test_every_row_span_and_every_column_span_decodes_as_full_decode_then_crop(kind):
    height, width = 41, 50
    data = _small(height, width, **SMALL_OPTIONS[kind])
    rows = [(top, 0, length, width) for top in range(height) for length in range(1, height - top + 1)]
    columns = [(0, left, height, length) for left in range(width) for length in range(1, width - left + 1)]
    _assert_windows_match(data, rows + columns, kind)


@pytest.mark.slow
def test_every_window_of_a_tiny_image_decodes_as_full_decode_then_crop():
    height, width = 18, 19  # two blocks of 4:2:0 each way, the second one partial
    data = _small(height, width, quality=80, subsampling=2)
    windows = [(top, left, h, w) for top in range(height) for h in range(1, height - top + 1)
               for left in range(width) for w in range(1, width - left + 1)]
    _assert_windows_match(data, windows, "tiny")


@pytest.mark.slow
def test_real_and_progressive_photos_decode_every_edge_window_and_drawn_crop_as_full_decode_then_crop(photos):
    for name, data in photos.items():
        height, width = inspect_image(data).size
        windows = [(top, left, h, w) for top, h in _spans(height)[::2] for left, w in _spans(width)[::2]]
        u = uniforms(seed=7, epoch=0, indices=np.arange(12), stream=1, count=22)
        windows += [rrc_window(height, width, row, (0.08, 1.0), (3 / 4, 4 / 3)) for row in u]
        _assert_windows_match(data, windows, name)


@pytest.mark.slow
def test_grey_cmyk_oriented_png_and_webp_images_decode_as_full_decode_then_crop(photos):
    colour = Image.open(io.BytesIO(photos["chelsea_q95.jpg"]))
    images = {"grey": _encode(colour.convert("L"), quality=90),
              "cmyk": _encode(colour.convert("CMYK"), quality=90),
              "cmyk_progressive": _encode(colour.convert("CMYK"), quality=90, progressive=True),
              "orientation 6": with_exif_orientation(photos["chelsea_q75.jpg"], 6, "II"),
              "orientation 3": with_exif_orientation(photos["chelsea_q75.jpg"], 3, "MM")}
    for name, form in (("png", "PNG"), ("webp", "WEBP")):
        buffer = io.BytesIO()
        colour.save(buffer, form, **({"lossless": True} if form == "WEBP" else {}))
        images[name] = buffer.getvalue()
    for name, data in images.items():
        height, width = inspect_image(data).size
        windows = [(top, left, h, w) for top, h in _spans(height)[::3] for left, w in _spans(width)[::3]]
        _assert_windows_match(data, windows, name)


@needs_region_decoder
def test_a_jpeg_window_is_decoded_alone_without_the_full_decoder(photos, monkeypatch):
    def no_full_decode(data):
        raise AssertionError("the full decoder ran for a window the region decoder takes")

    full = decode_rgb(photos["astronaut_q75.jpg"])
    monkeypatch.setattr(region_decode, "decode_checked", no_full_decode)
    got = decode_region(photos["astronaut_q75.jpg"], 33, 65, 101, 77)
    assert torch.equal(got, full[:, 33:134, 65:142])
    assert got.permute(1, 2, 0).is_contiguous() and full.permute(1, 2, 0).is_contiguous()  # torchvision's layout
    assert region_decoder().startswith("nvImageCodec ")


def test_without_nvimgcodec_the_window_comes_from_full_decode_and_show_says_so(photos, monkeypatch):
    monkeypatch.setattr(region_decode, "_unavailable", ["ImportError: No module named 'nvidia.nvimgcodec'"])
    data = photos["coffee_q95.jpg"]
    assert torch.equal(decode_region(data, 5, 9, 40, 61), decode_rgb(data)[:, 5:45, 9:70])
    assert not region_decode.region_decode_available()
    assert region_decoder().startswith("torchvision.io full decode, then crop (nvImageCodec")
    assert "No module named" in region_decoder()


def test_a_jpeg_cut_below_the_window_is_refused_as_the_full_decode_refuses_it(photos):
    data = photos["rocket_q75.jpg"]
    cut = data[:len(data) // 2]
    with pytest.raises(ImageError, match="truncated JPEG"):
        decode_rgb(cut)
    with pytest.raises(ImageError, match="truncated JPEG"):
        decode_region(cut, 0, 0, 8, 8)


def test_a_window_outside_the_image_is_refused_with_both_sizes(photos):
    data = photos["coins_q75.jpg"]
    height, width = inspect_image(data).size
    with pytest.raises(ValueError, match=f"window 10x10 at \\({height - 5}, 0\\) is not inside the {height}x{width}"):
        decode_region(data, height - 5, 0, 10, 10)
    with pytest.raises(ValueError, match="not inside"):
        decode_region(data, 0, -1, 10, 10)


def _decode_in_child(data: bytes) -> torch.Tensor:
    return decode_region(data, 3, 4, 50, 60)


def test_a_forked_worker_decodes_windows_after_its_parent_did(photos):
    data = photos["hubble_deep_field_q95.jpg"]
    in_parent = _decode_in_child(data)  # the parent's decoder exists before the fork
    with multiprocessing.get_context("fork").Pool(1) as pool:
        in_child = pool.apply(_decode_in_child, (data,))
    assert torch.equal(in_child, in_parent)


CROP_FIRST = [{"random_resized_crop": {"size": 96}}, {"horizontal_flip": {"probability": 0.5}},
         {"color_jitter": {"brightness": 0.4, "contrast": 0.4, "saturation": 0.4}}]


@pytest.mark.slow
def test_pipeline_pixels_with_the_window_decoded_alone_equal_those_of_the_full_decode(photos):
    plan = plan_of(CROP_FIRST)
    names = sorted(photos)
    sample_draws = draws(plan, 3, 1, np.arange(len(names)))
    for row, name in enumerate(names):
        data = photos[name]
        info = inspect_image(data)
        per_step = sample_steps(plan, *info.size, {k: v[row] for k, v in sample_draws.items()})
        image, adjusted = decode_steps(data, info=info, plan=plan, per_step=per_step)
        window = per_step[0][0][0]
        assert image.shape[-2:] == (window.height, window.width), name
        assert adjusted[0][0][0] == Crop(0, 0, window.height, window.width) and adjusted[1:] == per_step[1:]
        assert torch.equal(apply_steps(image, plan, adjusted), apply_steps(decode_rgb(data), plan, per_step)), name


def test_only_a_first_window_inside_the_image_is_decoded_alone():
    crop_first = plan_of(CROP_FIRST)
    steps = sample_steps(crop_first, 300, 200, {k: v[0] for k, v in draws(crop_first, 0, 0, np.arange(1)).items()})
    assert decoded_window(crop_first, steps) == steps[0][0][0]
    resize_first = plan_of([{"resize": 128}, {"center_crop": 112}])
    assert decoded_window(resize_first, sample_steps(resize_first, 300, 200, {})) is None
    centre_first = plan_of([{"center_crop": 224}, {"resize": [112, 112]}])
    assert decoded_window(centre_first, sample_steps(centre_first, 300, 400, {})) is None  # not decodes_window


def test_show_names_the_decoder_the_torchvision_backend_runs(capsys, no_cuda, monkeypatch):
    assert main(["show", str(TRAIN)]) == 0
    assert f"  decoder here: {region_decoder()}\n" in capsys.readouterr().out.split("## torchvision (")[1]
    assert main(["show", str(VAL)]) == 0
    out = capsys.readouterr().out
    assert "  decoder here: torchvision.io full decode (the first step needs the whole image)" in out
    monkeypatch.setattr(region_decode, "_unavailable", ["ImportError: no nvimgcodec"])
    assert main(["show", str(TRAIN)]) == 0
    assert "  decoder here: torchvision.io full decode, then crop (nvImageCodec, which decodes only the window, " \
           "does not load: ImportError: no nvimgcodec" in capsys.readouterr().out


@pytest.mark.slow
@needs_region_decoder
def test_the_torchvision_loader_decodes_a_first_crops_window_alone_with_the_same_batch(sample_root, monkeypatch):
    from dali_bridge.loader.loader import build_loader

    overrides = {"source": {"type": "folder", "root": str(sample_root)}, "batch_size": 6,
                 "loader": {"workers": 0}, "outputs": ["image", "index"]}

    def first_batch():
        loader = build_loader(TRAIN, "torchvision", overrides=overrides)
        try:
            return next(iter(loader))
        finally:
            loader.close()

    region, full_decode = region_decode._region, region_decode.decode_checked
    monkeypatch.setattr(region_decode, "_region", lambda data, window: None)  # every window decoded whole
    whole, indices = first_batch()
    calls = []
    monkeypatch.setattr(region_decode, "_region", lambda data, window: calls.append("window") or region(data, window))
    monkeypatch.setattr(region_decode, "decode_checked", lambda data: calls.append("whole") or full_decode(data))
    alone, same_indices = first_batch()
    assert calls == ["window"] * 6  # each sample of the batch decoded as its window alone
    assert torch.equal(same_indices, indices) and torch.equal(alone, whole)
