"""DALI and torchvision give the same batches: same samples in the same order, same crop windows and
flips, pixels within 1 level of 255 (mean within 0.25 level) — measured on natural-looking images.

Every op and option of the spec is run on ``dali-cpu`` and ``torchvision`` through
:func:`dali_bridge.tools.compare.compare` (the library behind ``dali-bridge compare``) over a folder that
holds every kind of tests/helpers/corpus.py (grayscale, CMYK, YCCK, progressive, PNG variants, EXIF 1-8,
1x1 and other images smaller than the crop, odd sizes, portrait, landscape, 4000x3000) plus
generated photo-like JPEGs. The resize methods the DALI backend uses to reproduce torchvision's
F.resize are also checked on their own over random crops and scales (0.05x to 3x), and the
sampler's crop-window and flip statistics against torchvision's own RandomResizedCrop and
RandomHorizontalFlip. GPU comparisons (nvJPEG) are written here and skip without CUDA.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.helpers.backends import CPU_BACKENDS, MEAN, STD, torch_vector_kernels
from tests.helpers.paths import TRAIN, VAL
from dali_bridge.tools.compare import compare, compare_batches
from dali_bridge.tools.compare_bounds import CPU_BOUNDS, NVJPEG_BOUNDS
from dali_bridge.backends.dali.plan import resize_methods
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.spec.pipeline import spec_from_dict
from tests.helpers.equivalence import assert_within_bounds, pipeline, run_compare

pytestmark = [pytest.mark.slow,  # whole epochs of the corpus on both CPU backends
              pytest.mark.skipif(CPU_BACKENDS != ["dali-cpu", "torchvision"],
                                  reason=f"needs dali-cpu and torchvision; this host has {CPU_BACKENDS}")]

NORMALIZE = {"normalize": {"mean": MEAN, "std": STD, "dtype": "float32", "layout": "CHW"}}
UINT8 = {"normalize": {"dtype": "uint8"}}


# ---------------------------------------------------------------------------------------------
# The shipped pipelines on the generated sample set

def test_shipped_val_pipeline_matches_torchvision_within_one_level(sample_root):
    result = run_compare(VAL, {"source": {"type": "folder", "root": str(sample_root)}, "batch_size": 16,
                               "loader.workers": 1})
    assert_within_bounds(result, samples=37)
    image = result.output("image")
    # after normalisation: the level bound divided by 255 * std, per channel
    for value, std in zip(image.normalized_max_abs, STD):
        assert value <= (1.0 + 1e-3) / (255.0 * std)
    # rounding differences exist: the comparison really ran on pixels (torch's default kernels round
    # its resize almost as DALI does, see conftest.torch_vector_kernels)
    assert (0.05 if torch_vector_kernels() else 0.0) < image.mean_abs


def test_shipped_train_pipeline_gives_the_same_crops_flips_and_pixels(sample_root):
    result = run_compare(TRAIN, {"source": {"type": "folder", "root": str(sample_root)}, "batch_size": 16,
                                 "loader.workers": 1})
    assert_within_bounds(result, samples=37)
    for value, std in zip(result.output("image").normalized_max_abs, STD):
        assert value <= (1.0 + 1e-3) / (255.0 * std)


def test_the_comparison_sees_a_one_pixel_change_of_geometry(sample_root):
    """The bound has teeth: resizing to 257 instead of 256 (same 224 crop) is far outside it."""
    from dali_bridge.loader.loader import build_loader
    from dali_bridge.spec.pipeline import coerce_spec

    base = {"source": {"type": "folder", "root": str(sample_root)}, "batch_size": 16, "loader.workers": 1,
            "outputs": ["image", "label", "index"]}
    spec = coerce_spec(VAL, base)
    shifted = coerce_spec(VAL, {**base, "ops.0.resize.size": 257})
    loaders = [build_loader(spec, "dali-cpu"), build_loader(shifted, "torchvision")]
    try:
        result = compare_batches(loaders[0], loaders[1], spec.outputs, build_plan(spec).finish,
                                 loaders[0].listing.paths, max_batches=1)
    finally:
        for loader in loaders:
            loader.close()
    assert not result.passed
    assert result.output("image").max_abs > 20 and result.output("image").mean_abs > 1.0
    assert result.output("index").mismatches == 0


def test_a_flip_on_one_side_only_fails_the_comparison(sample_root):
    from dali_bridge.loader.loader import build_loader
    from dali_bridge.spec.pipeline import coerce_spec

    base = {"source": {"type": "folder", "root": str(sample_root)}, "batch_size": 8, "loader.workers": 1,
            "outputs": ["image", "label", "index"], "ops.1.horizontal_flip.probability": 0.0}
    plain, flipped = coerce_spec(TRAIN, base), coerce_spec(TRAIN, {**base, "ops.1.horizontal_flip.probability": 1.0})
    loaders = [build_loader(plain, "dali-cpu"), build_loader(flipped, "torchvision")]
    try:
        result = compare_batches(loaders[0], loaders[1], plain.outputs, build_plan(plain).finish,
                                 loaders[0].listing.paths, max_batches=1)
    finally:
        for loader in loaders:
            loader.close()
    assert not result.passed and result.output("image").max_abs > 50


# ---------------------------------------------------------------------------------------------
# Every op and option, over every corpus kind and natural images

MEAN_STD = {"mean": MEAN, "std": STD}
CASES: dict[str, list] = {
    "val: resize 256 bilinear + center crop 224, float32 CHW": [{"resize": 256}, {"center_crop": 224}, NORMALIZE],
    "train: random resized crop + flip, float32 CHW": [{"random_resized_crop": 224}, {"horizontal_flip": 0.5},
                                                        NORMALIZE],
    "random resized crop, bilinear without antialias": [
        {"random_resized_crop": {"size": 224, "antialias": False}}, {"horizontal_flip": 0.5}, UINT8],
    "random resized crop, nearest": [{"random_resized_crop": {"size": 224, "interpolation": "nearest"}}, UINT8],
    "random resized crop, nearest, upscaling": [
        {"random_resized_crop": {"size": [300, 341], "interpolation": "nearest", "scale": [0.05, 0.3]}}, UINT8],
    "random resized crop, bicubic with antialias": [
        {"random_resized_crop": {"size": 224, "interpolation": "bicubic"}}, UINT8],
    "random resized crop, crops at the border (scale 0.9-1)": [
        {"random_resized_crop": {"size": [160, 208], "scale": [0.9, 1.0]}}, UINT8],
    "random resized crop + flip, float16 HWC (border lines patched in torch)": [
        {"random_resized_crop": [200, 224]}, {"horizontal_flip": 0.5},
        {"normalize": {**MEAN_STD, "dtype": "float16", "layout": "HWC"}}],
    "resize [h, w] bilinear as the last step, up- and downscaling, uint8 HWC": [
        {"resize": [500, 420]}, {"normalize": {"dtype": "uint8", "layout": "HWC"}}],
    "resize [h, w] bicubic, float16 HWC": [
        {"resize": {"size": [181, 243], "interpolation": "bicubic"}},
        {"normalize": {**MEAN_STD, "dtype": "float16", "layout": "HWC"}}],
    "resize nearest + odd center crop, uint8 HWC": [
        {"resize": {"size": 200, "interpolation": "nearest"}}, {"center_crop": [180, 190]},
        {"normalize": {"dtype": "uint8", "layout": "HWC"}}],
    "resize with max_size, bilinear without antialias, float16": [
        {"resize": {"size": 300, "max_size": 320, "antialias": False}}, {"center_crop": 150},
        {"normalize": {**MEAN_STD, "dtype": "float16"}}],
    "resize 240 + crop 238 (border kept: exact renormalisation)": [
        {"resize": 240}, {"center_crop": 238}, {"normalize": {"dtype": "float32", "layout": "HWC"}}],
    "center crop only: images smaller than the crop padded": [{"center_crop": 224}, UINT8],
    "crop_mirror_normalize after resize, float32": [
        {"resize": 256}, {"crop_mirror_normalize": {"crop": 224, "mirror": 0.5, "mean": [0.5] * 3, "std": [0.25] * 3}}],
    "crop_mirror_normalize after a random resized crop, default mean/std, float16 HWC": [
        {"random_resized_crop": 240},
        {"crop_mirror_normalize": {"crop": [224, 200], "mirror": 0.5, "dtype": "float16", "layout": "HWC"}}],
}


@pytest.mark.parametrize("name", list(CASES))
def test_every_op_and_option_matches_torchvision_on_unusual_and_natural_images(corpus_root, name):
    from tests.helpers.corpus import KINDS

    result = run_compare(pipeline(corpus_root, CASES[name]))
    assert_within_bounds(result, samples=len(KINDS) + 10, float16="float16" in name)


def test_nearest_is_pixel_exact(corpus_root):
    """Nearest picks source pixels, so matching torchvision's float32 index exactly means no difference at all."""
    result = run_compare(pipeline(corpus_root, CASES["random resized crop, nearest"]))
    assert result.output("image").max_abs == 0.0


def test_center_crop_padding_is_zero_and_identical(corpus_root):
    """Images smaller than the crop (1x1, 7x5, 100x80, 150x230) come out padded with zeros on both backends."""
    result = run_compare(pipeline(corpus_root, CASES["center crop only: images smaller than the crop padded"]))
    assert result.output("image").max_abs == 0.0


def test_bicubic_without_antialias_is_refused_on_dali_naming_op_option_and_backends(corpus_root):
    from dali_bridge.loader.select import BackendUnavailable
    from dali_bridge.loader.loader import build_loader

    spec = pipeline(corpus_root, [{"resize": {"size": [100, 120], "interpolation": "bicubic", "antialias": False}},
                                 UINT8])
    with pytest.raises(BackendUnavailable) as caught:
        build_loader(spec, "dali-cpu")
    message = str(caught.value)
    assert "ops[0] 'resize with interpolation bicubic with antialias false" in message
    assert "runs only on torchvision" in message and "a=-0.75" in message
    build_loader(spec, "torchvision").close()  # the reference backend runs it


def test_a_1x1_bilinear_resize_is_refused_on_torchvision_naming_the_reason(corpus_root):
    from dali_bridge.loader.select import BackendUnavailable
    from dali_bridge.loader.loader import build_loader

    for op in ({"resize": {"size": [1, 1]}}, {"random_resized_crop": 1}, {"resize": 1}):
        spec = pipeline(corpus_root, [op, UINT8] if "random" in str(op) else [op, {"center_crop": 1}, UINT8])
        with pytest.raises(BackendUnavailable) as caught:
            build_loader(spec, "torchvision")
        assert "cannot make a 1x1 image" in str(caught.value)
        with build_loader(spec, "dali-cpu") as loader:  # DALI makes 1x1 images (resize 1: after the crop)
            assert tuple(next(iter(loader))[0].shape[-2:]) == (1, 1)
    build_loader(pipeline(corpus_root, [{"random_resized_crop": {"size": 1, "interpolation": "nearest"}}, UINT8]),
                 "torchvision").close()


# ---------------------------------------------------------------------------------------------
# The DALI resize arrangements on their own, against F.resize, over random crops and scales

def _random_cases(images: list[torch.Tensor], seed: int) -> list[tuple[np.ndarray, tuple[int, int]]]:
    rng = np.random.default_rng(seed)
    cases = []
    for image in images:
        height, width = image.shape[-2:]
        crop_h, crop_w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        top, left = int(rng.integers(0, height - crop_h + 1)), int(rng.integers(0, width - crop_w + 1))
        crop = image[:, top:top + crop_h, left:left + crop_w]
        factor = np.exp(rng.uniform(math.log(0.05), math.log(3.0), size=2))
        out = (min(max(1, int(crop_h * factor[0])), 600), min(max(1, int(crop_w * factor[1])), 600))
        cases.append((np.ascontiguousarray(crop.permute(1, 2, 0).numpy()), out))
    return cases


@pytest.mark.parametrize("interpolation, antialias, method, max_delta", [
    ("bilinear", True, "filter_1pass", 1), ("bilinear", True, "border_patch", 1), ("bicubic", True, "filter_2pass", 1),
    ("bilinear", False, "linear", 1), ("nearest", False, "nearest", 0), ("nearest", True, "nearest", 0)])
def test_dali_resize_reproduces_torchvision_resize_at_any_scale(corpus_root, interpolation, antialias, method,
                                                                 max_delta):
    from nvidia.dali import fn, pipeline_def
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as F

    from dali_bridge.backends.dali.outputs import write_border
    from dali_bridge.ops.exact_resize import METHODS
    from dali_bridge.data.sources.images import decode_rgb, read_bytes
    from dali_bridge.backends.dali.plan import resize_method

    assert resize_method(interpolation, antialias) == ("filter_1pass" if method == "border_patch" else method)
    files = sorted(p for p in corpus_root.rglob("*") if p.is_file() and "large" not in p.name)
    cases = _random_cases([decode_rgb(read_bytes(str(p))) for p in files], seed=len(method) + int(antialias))
    if method == "border_patch":  # chosen only for a fixed output size of at least 3 x 3 (resize_methods)
        cases = [(crop, (max(3, out[0]), max(3, out[1]))) for crop, out in cases]
    resize = METHODS[method]
    names = [column.name for column in resize.columns()]
    # each case's arguments as a batch of one, by the names the method declares
    inputs = [(crop,) + tuple(resize.arguments([crop.shape[:2]], [out])[name][0] for name in names)
              for crop, out in cases]

    @pipeline_def(batch_size=len(inputs), num_threads=1, device_id=None)
    def graph():
        columns = [fn.external_source(source=[[sample[k] for sample in inputs]], batch=True, cycle=True)
                   for k in range(len(inputs[0]))]
        resized, border_lines = resize.graph(columns[0], dict(zip(names, columns[1:])), interpolation, "cpu")
        return (resized, *border_lines)

    pipe = graph()
    pipe.build()
    outputs, *border = pipe.run()
    mode = {"nearest": InterpolationMode.NEAREST, "bilinear": InterpolationMode.BILINEAR,
            "bicubic": InterpolationMode.BICUBIC}[interpolation]
    worst, means = 0, []
    for k, (crop, out) in enumerate(cases):
        want = F.resize(torch.from_numpy(crop).permute(2, 0, 1), list(out), interpolation=mode, antialias=antialias)
        got = torch.from_numpy(np.array(outputs[k]))
        if border:  # the exact outermost lines written over the plain resize, as the DALI backend does
            plain = got.clone()
            write_border(got[None], *(torch.from_numpy(np.array(lines[k]))[None] for lines in border), "HWC")
            assert not torch.equal(plain, got) or out[0] > crop.shape[0]  # the plain border differs when downscaling
        got = got.permute(2, 0, 1)
        assert got.shape == want.shape
        delta = (got.int() - want.int()).abs()
        worst = max(worst, int(delta.max()))
        means.append(float(delta.float().mean()))
    assert worst <= max_delta
    assert float(np.mean(means)) <= (0.25 if max_delta else 0.0)


def test_image_weight_is_dalis_own_filter_weight_on_the_image():
    """The closed form the border patch divides by equals fn.resize of a 0/1 mask (ones on the
    image, zeros on a margin wider than the filter) at random up- and downscales."""
    from nvidia.dali import fn, pipeline_def, types

    from dali_bridge.ops.exact_resize import filter_margin, image_weight

    rng = np.random.default_rng(0)
    in_sizes, out_size = rng.integers(1, 900, 48), 223
    margins = [filter_margin("bilinear", int(n), out_size) for n in in_sizes]
    masks = [np.pad(np.ones((1, n, 1), np.float32), ((0, 0), (m, m), (0, 0))) for n, m in zip(in_sizes, margins)]
    starts = [np.array([0, m], np.float32) for m in margins]
    ends = [np.array([1, m + n], np.float32) for n, m in zip(in_sizes, margins)]

    @pipeline_def(batch_size=len(masks), num_threads=1, device_id=None)
    def graph():
        mask, start, end = (fn.external_source(source=[column], batch=True, cycle=True)
                            for column in (masks, starts, ends))
        return fn.resize(mask, size=[1, out_size], roi_start=start, roi_end=end, roi_relative=False,
                         antialias=True, dtype=types.FLOAT)

    pipe = graph()
    pipe.build()
    (resized,) = pipe.run()
    dali = np.stack([np.asarray(resized[k]).reshape(-1) for k in range(len(masks))])
    ours = image_weight(in_sizes, out_size)
    assert np.abs(dali - ours).max() < 1e-4
    assert (ours[:, 0] < 1).all() and np.allclose(ours[:, 1:-1][in_sizes >= out_size], 1.0)  # edges only, downscaling


def test_border_renormalisation_is_skipped_only_where_a_crop_hides_the_border():
    def methods(ops: list) -> dict[int, str]:
        spec = spec_from_dict({"version": 1, "source": {"type": "folder", "root": "/x"}, "batch_size": 2, "ops": ops})
        return resize_methods(build_plan(spec))

    assert methods([{"resize": 256}, {"center_crop": 224}, {"normalize": {}}]) == {0: "antialias"}
    assert methods([{"resize": 240}, {"center_crop": 238}, {"normalize": {}}]) == {0: "filter_1pass"}
    assert methods([{"resize": {"size": 256, "max_size": 300}}, {"center_crop": 224}]) == {0: "filter_1pass"}
    assert methods([{"resize": [256, 256]}, {"center_crop": 224}]) == {0: "filter_1pass"}
    # A fixed-size resize that ends the geometry: only its outermost lines are computed the exact way.
    assert methods([{"random_resized_crop": 224}, {"normalize": {}}]) == {0: "border_patch"}
    assert methods([{"random_resized_crop": 224}, {"horizontal_flip": 0.5}, {"normalize": {}}]) == {0: "border_patch"}
    assert methods([{"center_crop": 300}, {"resize": [224, 200]}]) == {1: "border_patch"}
    assert methods([{"random_resized_crop": 224}, {"center_crop": 200}]) == {0: "filter_1pass"}
    ops = [{"random_resized_crop": 224}, {"horizontal_flip": 0.5}, {"center_crop": 200}]
    assert methods(ops) == {0: "filter_1pass"}
    assert methods([{"random_resized_crop": [2, 224]}]) == {0: "filter_1pass"}  # no rows between first and last
    assert methods([{"resize": {"size": 256, "interpolation": "bicubic"}}, {"center_crop": 224}]) == {0: "filter_2pass"}
    assert methods([{"resize": {"size": 256, "interpolation": "nearest"}}, {"center_crop": 224}]) == {0: "nearest"}


# ---------------------------------------------------------------------------------------------
# Decoding: every corpus kind decodes to the same pixels (whole image and region of interest)

def test_every_unusual_image_decodes_identically_on_dali_cpu_and_torchvision(corpus_root):
    from nvidia.dali import fn, pipeline_def, types

    from dali_bridge.data.sources.images import decode_rgb, probe, read_bytes

    files = sorted(p for p in corpus_root.rglob("*") if p.is_file() and p.parent.name != "natural")
    encoded = [np.frombuffer(read_bytes(str(p)), dtype=np.uint8) for p in files]
    sizes = [probe(read_bytes(str(p))) for p in files]
    rng = np.random.default_rng(0)
    windows = []
    for height, width in sizes:
        h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        windows.append((int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w))

    @pipeline_def(batch_size=len(files), num_threads=1, device_id=None)
    def graph():
        data = fn.external_source(source=[encoded], batch=True, cycle=True)
        anchor = fn.external_source(source=[[np.array(w[:2], dtype=np.int32) for w in windows]], batch=True, cycle=True)
        shape = fn.external_source(source=[[np.array(w[2:], dtype=np.int32) for w in windows]], batch=True, cycle=True)
        whole = fn.decoders.image(data, device="cpu", output_type=types.RGB)
        region = fn.decoders.image_slice(data, anchor, shape, axis_names="HW", device="cpu", output_type=types.RGB)
        return whole, region

    pipe = graph()
    pipe.build()
    wholes, regions = pipe.run()
    for k, path in enumerate(files):
        reference = decode_rgb(read_bytes(str(path))).permute(1, 2, 0).numpy()
        assert reference.dtype == np.uint8 and reference.shape[:2] == sizes[k], path.name
        assert np.array_equal(np.array(wholes[k]), reference), path.name
        top, left, h, w = windows[k]
        assert np.array_equal(np.array(regions[k]), reference[top:top + h, left:left + w]), path.name


def test_exif_orientations_5_to_8_swap_height_and_width(corpus_root):
    from tests.helpers.corpus import stored_size

    from dali_bridge.data.sources.images import decode_rgb, read_bytes

    for orientation in range(1, 9):
        path = next((corpus_root / f"exif_{orientation}").iterdir())
        height, width = stored_size(f"exif_{orientation}")
        expected = (width, height) if orientation >= 5 else (height, width)
        assert tuple(decode_rgb(read_bytes(str(path))).shape[-2:]) == expected


# ---------------------------------------------------------------------------------------------
# The sampler: owning the randomness keeps torchvision's augmentation distribution

DRAWS = 10_000


def _our_windows(height: int, width: int, scale: list[float], ratio: list[float]) -> np.ndarray:
    from dali_bridge.ops.geometry import RRC_ATTEMPTS, rrc_window
    from dali_bridge.pipeline.sampling import uniforms

    u = uniforms(seed=0, epoch=0, indices=np.arange(DRAWS), stream=1, count=2 * RRC_ATTEMPTS + 2)
    return np.array([rrc_window(height, width, row, scale, ratio) for row in u], dtype=np.float64)


def _torchvision_windows(height: int, width: int, scale: list[float], ratio: list[float]) -> np.ndarray:
    from torchvision.transforms import RandomResizedCrop

    torch.manual_seed(0)
    image = torch.zeros(3, height, width, dtype=torch.uint8)
    return np.array([RandomResizedCrop.get_params(image, scale, ratio) for _ in range(DRAWS)], dtype=np.float64)


def _area_and_log_ratio(windows: np.ndarray, height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    h, w = windows[:, 2], windows[:, 3]
    return h * w / (height * width), np.log(w / h)


@pytest.mark.parametrize("height, width, scale, ratio", [
    (375, 500, [0.08, 1.0], [3 / 4, 4 / 3]),    # ImageNet-like landscape, the shipped parameters
    (500, 333, [0.08, 1.0], [3 / 4, 4 / 3]),    # portrait
    (100, 240, [0.2, 1.0], [0.9, 1.1]),         # a strip: ~7 % of draws fall back to the centre crop
])
def test_crop_window_statistics_match_torchvision_random_resized_crop(height, width, scale, ratio):
    from scipy.stats import ks_2samp

    ours = _area_and_log_ratio(_our_windows(height, width, scale, ratio), height, width)
    theirs = _area_and_log_ratio(_torchvision_windows(height, width, scale, ratio), height, width)
    for mine, reference in zip(ours, theirs):
        assert ks_2samp(mine, reference).pvalue > 1e-3
    # top-left corners too: uniform over the valid positions in both
    windows = _our_windows(height, width, scale, ratio)
    assert (windows[:, 0] + windows[:, 2] <= height).all() and (windows[:, 1] + windows[:, 3] <= width).all()


def test_the_window_statistics_test_rejects_a_different_distribution():
    """The KS check has power: areas drawn from [0.08, 0.5] instead of [0.08, 1] are rejected."""
    from scipy.stats import ks_2samp

    area_ours, _ = _area_and_log_ratio(_our_windows(375, 500, [0.08, 0.5], [3 / 4, 4 / 3]), 375, 500)
    area_theirs, _ = _area_and_log_ratio(_torchvision_windows(375, 500, [0.08, 1.0], [3 / 4, 4 / 3]), 375, 500)
    assert ks_2samp(area_ours, area_theirs).pvalue < 1e-6


@pytest.mark.parametrize("probability", [0.5, 0.3])
def test_flip_rate_matches_torchvision_random_horizontal_flip_within_three_sigma(probability):
    from torchvision.transforms import RandomHorizontalFlip

    from dali_bridge.pipeline.sampling import draws

    spec = spec_from_dict({"version": 1, "source": {"type": "folder", "root": "/x"}, "batch_size": 2,
                           "ops": [{"center_crop": 8}, {"horizontal_flip": probability}]})
    plan = build_plan(spec)
    ours = float((draws(plan, seed=0, epoch=0, indices=np.arange(DRAWS))[1][:, 0] < probability).mean())
    torch.manual_seed(0)
    flip, probe = RandomHorizontalFlip(probability), torch.tensor([[[0, 1]]])
    theirs = float(np.mean([int(flip(probe)[0, 0, 0]) == 1 for _ in range(DRAWS)]))
    sigma = math.sqrt(probability * (1 - probability) / DRAWS)
    assert abs(ours - probability) <= 3 * sigma
    assert abs(ours - theirs) <= 3 * math.sqrt(2) * sigma  # two independent estimates


# ---------------------------------------------------------------------------------------------
# GPU: nvJPEG decode and GPU ops vs the CPU paths (bound: compare.NVJPEG_BOUNDS, justified there)

def _gpu_reason() -> str | None:
    from dali_bridge.loader.select import unavailable_reason

    return unavailable_reason("dali")


needs_gpu_dali = pytest.mark.skipif(_gpu_reason() is not None,
                                    reason=f"GPU comparisons need CUDA and DALI's GPU build: {_gpu_reason()}")


@needs_gpu_dali
@pytest.mark.gpu
@pytest.mark.parametrize("other", ["torchvision", "dali-cpu"])
@pytest.mark.parametrize("shipped", [VAL, TRAIN], ids=["val", "train"])
def test_gpu_dali_matches_the_cpu_backends_within_the_nvjpeg_bound(sample_root, shipped, other):
    from dali_bridge.spec.pipeline import coerce_spec

    spec = coerce_spec(shipped, {"source": {"type": "folder", "root": str(sample_root)}, "batch_size": 16})
    result = compare(spec, ("dali", other), batches=None)
    assert result.bounds == NVJPEG_BOUNDS
    assert result.output("index").mismatches == 0 and result.output("label").mismatches == 0
    assert result.output("image").max_abs <= NVJPEG_BOUNDS.max_abs, result.format()
    assert result.output("image").mean_abs <= NVJPEG_BOUNDS.mean_abs, result.format()


@needs_gpu_dali
@pytest.mark.gpu
def test_gpu_dali_with_cpu_decode_matches_dali_cpu_within_one_level(corpus_root):
    """decode.device cpu: the same libjpeg-turbo decode, so only GPU resampling rounding remains."""
    from dali_bridge.spec.pipeline import coerce_spec

    for name in ("train: random resized crop + flip, float32 CHW", "random resized crop, nearest",
                 "random resized crop, bicubic with antialias"):
        spec = coerce_spec(pipeline(corpus_root, CASES[name]), {"decode.device": "cpu"})
        result = compare(spec, ("dali", "dali-cpu"), batches=None)
        assert result.bounds == CPU_BOUNDS
        assert result.passed, result.format()
