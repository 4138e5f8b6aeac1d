"""`dali-bridge compare` and dali_bridge.tools.compare: what they measure, report, save and return.

The library's arithmetic (levels from normalised floats, exact outputs, order checks, worst
samples) is pinned on hand-made batches; the CLI runs on the shipped pipelines over the small
generated sample set (dali-cpu vs torchvision).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from tests.helpers.backends import needs_cpu_backends
from tests.helpers.paths import TRAIN, VAL
from dali_bridge.cli.main import main
from dali_bridge.cli.options import EXIT_FAILED, EXIT_UNAVAILABLE
from dali_bridge.tools.compare import compare_batches, to_levels
from dali_bridge.tools.compare_bounds import CPU_BOUNDS, NVJPEG_BOUNDS, Bounds, default_bounds, float16_step
from dali_bridge.ops.finish import Finish
from dali_bridge.spec.pipeline import spec_from_dict

OUTPUTS = ["image", "label", "index"]
PATHS = [f"/data/img_{i}.jpg" for i in range(8)]


def batches(images: list[torch.Tensor], start: int = 0) -> list[tuple[torch.Tensor, ...]]:
    """Batches of the given image tensors with labels = index % 3 and consecutive indices."""
    out, index = [], start
    for image in images:
        count = image.shape[0]
        indices = torch.arange(index, index + count)
        out.append((image, indices % 3, indices))
        index += count
    return out


def uint8_images(seed: int, count: int = 4, size: int = 6) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (count, 3, size, size), dtype=np.uint8))


# ---------------------------------------------------------------------------------------------
# The library on hand-made batches

def test_identical_batches_pass_with_zero_difference():
    images = [uint8_images(0), uint8_images(1)]
    result = compare_batches(batches(images), batches(images), OUTPUTS, Finish(), PATHS)
    assert result.passed and result.batches == 2 and result.samples == 8
    assert result.output("image").max_abs == 0 and result.output("image").mean_abs == 0
    assert [o.name for o in result.outputs] == OUTPUTS


def test_one_level_everywhere_passes_max_but_fails_the_mean_bound():
    a = uint8_images(0).clamp(max=200)
    result = compare_batches(batches([a]), batches([a + 1]), OUTPUTS, Finish(), PATHS)
    image = result.output("image")
    assert image.max_abs == 1.0 and image.mean_abs == 1.0
    assert not image.passed and not result.passed  # mean bound 0.25


def test_two_levels_on_one_pixel_fails_the_max_bound_and_names_the_sample():
    a = uint8_images(0).clamp(max=200)
    b = a.clone()
    b[2, 1, 3, 4] += 2
    result = compare_batches(batches([a]), batches([b]), OUTPUTS, Finish(), PATHS)
    assert result.output("image").max_abs == 2.0 and not result.passed
    worst = result.worst[0]
    assert (worst.index, worst.path, worst.batch, worst.row, worst.max_abs) == (2, "/data/img_2.jpg", 0, 2, 2.0)
    assert worst.mean_abs == pytest.approx(2 / (3 * 6 * 6))


def test_float_outputs_are_compared_in_levels_through_mean_and_std():
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    finish = Finish(mean, std, "float32", "HWC")
    levels = uint8_images(3).clamp(max=250).to(torch.float32)

    def normalised(x: torch.Tensor) -> torch.Tensor:  # NCHW levels → NHWC normalised, as a backend yields
        m, s = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
        return ((x / 255.0 - m) / s).permute(0, 2, 3, 1).contiguous()

    np.testing.assert_allclose(to_levels(normalised(levels), finish), levels.numpy(), atol=1e-3)
    result = compare_batches(batches([normalised(levels)]), batches([normalised(levels + 1)]), OUTPUTS, finish, PATHS)
    image = result.output("image")
    assert image.max_abs == pytest.approx(1.0, abs=1e-3) and image.mean_abs == pytest.approx(1.0, abs=1e-3)
    for value, s in zip(image.normalized_max_abs, std):  # the same difference in normalised units
        assert value == pytest.approx(1 / (255 * s), rel=1e-3)


def test_float16_outputs_get_one_float16_step_of_tolerance():
    assert float16_step(Finish(dtype="float32")) == 0.0
    # values up to (1 - 0.406) / 0.225 = 2.64: float16 spacing 2^-9, times std 0.229 and 255 levels
    assert float16_step(Finish((0.485, 0.456, 0.406), (0.229, 0.224, 0.225), "float16")) == \
        pytest.approx(2 ** -9 * 0.229 * 255)
    assert float16_step(Finish(dtype="float16")) == pytest.approx(2 ** -11 * 255)  # values in [0, 1]


def test_labels_must_be_identical():
    images = [uint8_images(0)]
    a, b = batches(images), batches(images)
    b[0] = (b[0][0], b[0][1].clone(), b[0][2])
    b[0][1][1] += 1
    result = compare_batches(a, b, OUTPUTS, Finish(), PATHS)
    assert result.output("label").mismatches == 1 and not result.output("label").passed and not result.passed
    assert result.output("image").passed


def test_a_different_sample_order_stops_the_comparison_with_the_indices():
    images = [uint8_images(0)]
    a, b = batches(images), batches(images)
    b[0] = (b[0][0], b[0][1], b[0][2].flip(0))
    result = compare_batches(a, b, OUTPUTS, Finish(), PATHS)
    assert not result.passed and result.batches == 0
    assert "different samples" in result.problems[0] and "[0, 1, 2, 3]" in result.problems[0]


def test_a_backend_that_ends_early_fails():
    a = batches([uint8_images(0), uint8_images(1)])
    result = compare_batches(a, a[:1], OUTPUTS, Finish(), PATHS, backends=("dali-cpu", "torchvision"))
    assert not result.passed
    assert result.problems == ["torchvision ended after 1 batch while dali-cpu yielded more"]


def test_the_index_output_is_required():
    with pytest.raises(ValueError, match="'index' output"):
        compare_batches([], [], ["image", "label"], Finish(), PATHS)


def test_bounds_default_to_nvjpeg_only_when_gpu_dali_decodes_with_nvjpeg():
    def spec(decode: str):
        return spec_from_dict({"version": 1, "source": {"type": "folder", "root": "/x"}, "batch_size": 2,
                               "decode": {"device": decode}, "ops": [{"center_crop": 8}]})

    assert default_bounds(spec("mixed"), ["dali", "torchvision"]) == NVJPEG_BOUNDS
    assert default_bounds(spec("cpu"), ["dali", "torchvision"]) == CPU_BOUNDS
    assert default_bounds(spec("mixed"), ["dali-cpu", "torchvision"]) == CPU_BOUNDS
    assert (CPU_BOUNDS.max_abs, CPU_BOUNDS.mean_abs) == (1.0, 0.25)
    assert (NVJPEG_BOUNDS.max_abs, NVJPEG_BOUNDS.mean_abs) == (4.0, 0.5)


def test_saved_pictures_show_both_backends_and_the_difference(tmp_path):
    a = uint8_images(0, count=3, size=20).clamp(max=200)
    b = a.clone()
    b[1, :, 5:9, 5:9] += 3
    result = compare_batches(batches([a]), batches([b]), OUTPUTS, Finish(), PATHS, save_dir=tmp_path,
                             worst_to_save=2, backends=("dali-cpu", "torchvision"))
    names = sorted(p.name for p in result.saved)
    assert names == ["mean_delta.png", "worst_1_sample_1.png", "worst_2_sample_0.png"]
    with Image.open(tmp_path / "worst_1_sample_1.png") as picture:
        pixels = np.asarray(picture.convert("RGB"))
    scale, gap, header = 2, 8, 34  # small images are doubled
    assert picture.size == (3 * 20 * scale + 2 * gap, 20 * scale + header)
    panel = lambda n: pixels[header:, n * (20 * scale + gap):n * (20 * scale + gap) + 20 * scale]  # noqa: E731
    left = a[1].permute(1, 2, 0).numpy().repeat(2, 0).repeat(2, 1)
    np.testing.assert_array_equal(panel(0), left)
    heat = panel(2)
    # 3 levels on a 0..4 scale: yellow (red and green saturated); no difference: black
    assert heat[5 * scale:9 * scale, 5 * scale:9 * scale, :2].min() == 255
    assert heat[:5 * scale].max() == 0 and heat[9 * scale:].max() == 0


# ---------------------------------------------------------------------------------------------
# The command line

def test_compare_help_has_an_example_and_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as done:
        main(["compare", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "dali-bridge compare pipelines/imagenet_val.yaml --data data/sample" in text
    assert "exit status: 0 PASS, 1 FAIL" in text and "--save DIR" in text and "--backends A,B" in text


@needs_cpu_backends
def test_compare_on_the_shipped_val_pipeline_passes_and_reports_every_output(sample_root, capsys, tmp_path):
    code = main(["compare", str(VAL), "--data", str(sample_root), "--backends", "dali-cpu,torchvision",
                 "--batches", "2", "--set", "batch_size=8", "--set", "loader.workers=1",
                 "--json", str(tmp_path / "out.json")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "compare imagenet-val: dali-cpu vs torchvision, 2 batches, 16 samples" in out
    assert "image  PASS  max |Δ| 1.000" in out and "label  PASS  0 mismatching" in out
    assert "index  PASS  0 mismatching" in out and "normalised units" in out
    assert "worst samples" in out and str(sample_root) in out and out.rstrip().endswith("PASS")
    data = json.loads((tmp_path / "out.json").read_text())
    assert data["passed"] is True and data["samples"] == 16 and data["outputs"][0]["max_abs"] <= 1.001


@needs_cpu_backends
@pytest.mark.slow
def test_compare_save_writes_the_worst_samples_and_a_mean_heat_map(sample_root, capsys, tmp_path):
    save = tmp_path / "pictures"
    code = main(["compare", str(TRAIN), "--data", str(sample_root), "--backends", "dali-cpu,torchvision",
                 "--batches", "1", "--set", "batch_size=6", "--set", "loader.workers=1", "--save", str(save)])
    assert code == 0
    files = sorted(p.name for p in save.iterdir())
    # the five worst samples listed (--worst's default) are the five saved, plus the mean map
    assert len(files) == 6 and files[0] == "mean_delta.png" and all(f.startswith("worst_") for f in files[1:])
    with Image.open(save / files[1]) as picture:
        assert picture.size == (3 * 224 * 2 + 16, 224 * 2 + 34)
    out = capsys.readouterr().out
    assert f"saved {save / files[1]}" in out
    listed = [int(line.split()[0]) for line in out.split("worst samples")[1].splitlines()[1:]
              if line.startswith("  ")]
    saved = [int(name.rsplit("_", 1)[1].removesuffix(".png")) for name in files[1:]]
    assert len(listed) == 5 and sorted(listed) == sorted(saved)


@needs_cpu_backends
def test_compare_exits_non_zero_on_fail(sample_root, capsys):
    code = main(["compare", str(VAL), "--data", str(sample_root), "--backends", "dali-cpu,torchvision",
                 "--batches", "1", "--set", "batch_size=4", "--set", "loader.workers=1", "--max-delta", "0"])
    out = capsys.readouterr().out
    assert code == EXIT_FAILED
    assert "image  FAIL" in out and "(set on the command line)" in out and out.rstrip().endswith("FAIL")


@needs_cpu_backends
def test_compare_refuses_a_pipeline_dali_cannot_reproduce(sample_root, capsys):
    code = main(["compare", str(VAL), "--data", str(sample_root), "--backends", "dali-cpu,torchvision",
                 "--set", "ops.0.resize.interpolation=bicubic", "--set", "ops.0.resize.antialias=false"])
    assert code == EXIT_UNAVAILABLE
    assert "bicubic with antialias false" in capsys.readouterr().err


def test_compare_rejects_anything_but_two_known_backends():
    for value in ("torchvision", "dali-cpu,torchvision,dali", "dali-cpu,pil"):
        with pytest.raises(SystemExit, match="--backends takes two of dali, dali-cpu, torchvision"):
            main(["compare", str(VAL), "--backends", value])


def test_custom_bounds_replace_the_defaults():
    bounds = Bounds(max_abs=2.0, mean_abs=0.5, reason="test")
    a = uint8_images(0).clamp(max=200)
    b = a.clone()
    b[0, 0, 0, 0] += 2
    assert compare_batches(batches([a]), batches([b]), OUTPUTS, Finish(), PATHS, bounds=bounds).passed
    assert not compare_batches(batches([a]), batches([b]), OUTPUTS, Finish(), PATHS).passed
