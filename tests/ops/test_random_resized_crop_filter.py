"""random_resized_crop's ``interpolation: random``: bilinear or bicubic drawn per sample from the bridge's
stream (timm's RandomResizedCropAndInterpolation default), the same draw and pixels on every backend.

The DALI graph resizes every sample with the two-pass renormalised method and takes its filter per
sample; dali-cpu is compared with torchvision over whole epochs of generated images, the corpus of
unusual ones and real photos; the GPU graph (the CPU graph on another device) where CUDA is.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dali_bridge.backends.dali.plan import dali_plan, resize_method
from dali_bridge.loader.select import unavailable_reason
from dali_bridge.ops.geometry import RANDOM_FILTERS
from dali_bridge.pipeline.sampling import draw_count, draws
from dali_bridge.spec.problems import SpecError
from tests.helpers.backends import needs_cpu_backends, plan_of

RANDOM = {"random_resized_crop": {"size": [48, 40], "interpolation": "random"}}
UINT8 = {"normalize": {"dtype": "uint8"}}


def _concrete(ops: list, count: int, height: int = 300, width: int = 400) -> list[tuple]:
    plan = plan_of(ops)
    rows = draws(plan, seed=5, epoch=2, indices=np.arange(count))[0]
    return [plan.steps[0].op.sample(plan.steps[0].params, row, height, width) for row in rows]


def test_random_draws_one_more_uniform_per_sample_and_leaves_the_window_draws_unchanged():
    random, fixed = plan_of([RANDOM]), plan_of([{"random_resized_crop": [48, 40]}])
    assert draw_count(random.steps[0]) == draw_count(fixed.steps[0]) + 1 == 23
    ours, bilinear = _concrete([RANDOM], 500), _concrete([{"random_resized_crop": [48, 40]}], 500)
    assert [crop for crop, _ in ours] == [crop for crop, _ in bilinear]  # the 22 window uniforms as before
    assert {resize.interpolation for _, resize in ours} == set(RANDOM_FILTERS)


def test_each_filter_is_drawn_half_the_time_within_four_sigma():
    count = 20_000
    bicubic = sum(resize.interpolation == "bicubic" for _, resize in _concrete([RANDOM], count))
    assert abs(bicubic - count / 2) <= 4 * math.sqrt(count / 4), bicubic


def test_the_torchvision_kernel_resizes_each_sample_with_its_drawn_filter():
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as F

    plan = plan_of([RANDOM])
    step = plan.steps[0]
    image = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (3, 90, 120), dtype=np.uint8))
    seen = set()
    for crop, resize in _concrete([RANDOM], 12, 90, 120):
        mode = {"bilinear": InterpolationMode.BILINEAR, "bicubic": InterpolationMode.BICUBIC}[resize.interpolation]
        want = F.resized_crop(image, crop.top, crop.left, crop.height, crop.width, [48, 40], interpolation=mode,
                              antialias=True)
        assert torch.equal(step.op.torchvision_kernel(image, (crop, resize), step.params), want)
        seen.add(resize.interpolation)
    assert seen == set(RANDOM_FILTERS)


def test_its_transforms_v2_counterpart_chooses_between_the_two_crops():
    from torchvision.transforms import v2

    step = plan_of([RANDOM]).steps[0]
    (choice,) = step.op.torchvision_transforms(step.params)
    assert isinstance(choice, v2.RandomChoice) and choice.p == [0.5, 0.5]
    assert [t.interpolation.value for t in choice.transforms] == list(RANDOM_FILTERS)


def test_the_dali_graph_resizes_random_with_the_two_pass_method_and_a_filter_column():
    assert resize_method("random", True) == "filter_2pass"
    for parity, method in (("exact", "filter_2pass"), ("fast", "antialias")):
        planned = dali_plan(plan_of([RANDOM, {"horizontal_flip": 0.5}], parity=parity))
        assert dict(planned.resize_methods) == {0: method}
        ctx = planned.context("cpu")
        step = planned.steps[0]
        names = [column.name for column in step.op.dali_columns(step, ctx)]
        assert "resize.bicubic" in names
        stages = [stage for stage, _, _ in planned.stages(gpu=False)]
        assert "random_resized_crop.resize.filter" in stages
    fixed = dali_plan(plan_of([{"random_resized_crop": [48, 40]}, {"horizontal_flip": 0.5}]))
    step = fixed.steps[0]
    assert "resize.bicubic" not in [c.name for c in step.op.dali_columns(step, fixed.context("cpu"))]


def test_random_without_antialias_runs_on_torchvision_only_saying_why():
    from dali_bridge import build_loader

    spec = {"version": 1, "source": {"type": "folder", "root": "/nonexistent"}, "batch_size": 2,
            "ops": [{"random_resized_crop": {"size": 32, "interpolation": "random", "antialias": False}}]}
    with pytest.raises(Exception, match="interpolation random with antialias false"):
        build_loader(spec, backend="dali-cpu")


def test_an_unknown_filter_is_refused_naming_the_choices():
    with pytest.raises(SpecError, match=r"random_resized_crop.interpolation: expected one of nearest, bilinear, "
                                        r"bicubic, random"):
        plan_of([{"random_resized_crop": {"size": 32, "interpolation": "randm"}}])


# ---------------------------------------------------------------------------------------------
# dali-cpu against torchvision on whole epochs: the same draws, pixels within the compare bounds

@pytest.fixture(scope="module")
def photos_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("skimage", reason="the real photos are scikit-image's: pip install dali-bridge[test]")
    from tests.helpers.real_photos import write_real_photos

    return write_real_photos(tmp_path_factory.mktemp("photos"))


def _filters_drawn(result_spec: dict) -> set[str]:
    from dali_bridge.pipeline.plan import build_plan
    from dali_bridge.spec.pipeline import spec_from_dict

    plan = build_plan(spec_from_dict(result_spec))
    count = len(list(Path(result_spec["source"]["root"]).rglob("*.*")))
    rows = draws(plan, seed=result_spec["seed"], epoch=0, indices=np.arange(count))[0]
    return {plan.steps[0].op.sample(plan.steps[0].params, row, 64, 64)[1].interpolation for row in rows}


@pytest.mark.slow
@needs_cpu_backends
@pytest.mark.parametrize("kind", ["photos", "corpus"])
@pytest.mark.parametrize("ops", [
    [RANDOM, {"horizontal_flip": 0.5}, UINT8],  # the last geometry step (where bilinear alone patches borders)
    [{"random_resized_crop": {"size": 200, "interpolation": "random", "scale": [0.05, 1.0]}},
     {"center_crop": 180}, {"normalize": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}}],
], ids=["last-step-uint8", "crop-after-float32"])
def test_dali_cpu_gives_torchvision_s_pixels_with_the_same_filter_drawn_per_sample(request, kind, ops):
    from tests.helpers.equivalence import assert_within_bounds, pipeline, run_compare

    root = request.getfixturevalue("photos_root" if kind == "photos" else "corpus_root")
    spec = pipeline(root, ops)
    assert _filters_drawn(spec) == set(RANDOM_FILTERS)
    result = run_compare(spec)
    assert_within_bounds(result, samples=result.samples)
    assert result.samples >= 26


needs_gpu_dali = pytest.mark.skipif(
    unavailable_reason("dali") is not None,
    reason=f"the GPU graph needs CUDA and DALI's GPU build: {unavailable_reason('dali')}")


@needs_gpu_dali
@pytest.mark.gpu
def test_the_gpu_graph_gives_dali_cpu_s_pixels_with_the_same_filters(corpus_root):
    """decode.device cpu: the same decode, so only GPU resampling rounding remains."""
    from dali_bridge.spec.pipeline import coerce_spec
    from dali_bridge.tools.compare import compare
    from dali_bridge.tools.compare_bounds import CPU_BOUNDS
    from tests.helpers.equivalence import pipeline

    spec = coerce_spec(pipeline(corpus_root, [RANDOM, {"horizontal_flip": 0.5}, UINT8]), {"decode.device": "cpu"})
    result = compare(spec, ("dali", "dali-cpu"), batches=None)
    assert result.bounds == CPU_BOUNDS
    assert result.passed, result.format()


@needs_cpu_backends
def test_the_plain_dali_baseline_draws_its_filter_per_sample_with_dali_s_own_coin():
    from nvidia.dali import fn, pipeline_def, types

    from dali_bridge.backends.dali.plan import graph_context

    plan = plan_of([{"random_resized_crop": {"size": [24, 36], "interpolation": "random", "scale": [1.0, 1.0],
                                             "ratio": [1.5, 1.5]}}])  # the whole image: only the filter varies
    step, ctx = plan.steps[0], graph_context(plan, "cpu")
    images = [np.random.default_rng(n).integers(0, 256, (40, 60, 3), dtype=np.uint8) for n in range(32)]

    @pipeline_def(batch_size=len(images), num_threads=1, device_id=None, seed=3)
    def graph():
        image = fn.external_source(source=[images], batch=True, cycle=True, layout="HWC")
        fixed = {name: fn.resize(image, size=[24, 36], interp_type=interp, antialias=True)
                 for name, interp in (("bilinear", types.INTERP_LINEAR), ("bicubic", types.INTERP_CUBIC))}
        return step.op.dali_baseline(step, image, ctx), fixed["bilinear"], fixed["bicubic"]

    pipe = graph()
    pipe.build()
    out, bilinear, bicubic = pipe.run()
    chosen = []
    for n in range(len(images)):
        got = np.array(out[n])
        distance = {name: np.abs(got.astype(int) - np.array(fixed[n]).astype(int)).max()
                    for name, fixed in (("bilinear", bilinear), ("bicubic", bicubic))}
        chosen.append(min(distance, key=distance.get) if min(distance.values()) <= 1 else f"neither {distance}")
    assert set(chosen) == {"bilinear", "bicubic"}, chosen
