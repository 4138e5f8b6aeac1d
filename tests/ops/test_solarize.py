"""solarize: torchvision's RandomSolarize on uint8 images — every level as F.solarize gives it, the
same pixels on dali-cpu, and the sampler's rate is torchvision's."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tests.helpers.backends import MEAN, STD, gpu_graph_ops, needs_cpu_backends, plan_of

from dali_bridge.loader.placement import placement
from dali_bridge.ops.solarize import Solarize, solarized_levels
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.spec.pipeline import spec_from_dict
from dali_bridge.spec.problems import SpecError

DRAWS = 10_000
THRESHOLDS = [0, 0.5, 1, 100.5, 128, 254.9, 255]


def test_solarize_shorthand_sets_the_threshold_with_torchvisions_probability_and_keeps_the_size():
    plan = plan_of([{"center_crop": 8}, {"solarize": 100}])
    step = plan.steps[1]
    assert step.name == "solarize" and step.random and step.op.discontinuous
    assert step.params == {"threshold": 100, "probability": 0.5}
    assert plan_of([{"center_crop": 8}, "solarize"]).steps[1].params == {"threshold": 128, "probability": 0.5}
    assert plan.output_size == (8, 8)
    assert [s.stage for s in placement(plan, "torchvision")][3] == "solarize"
    assert ("solarize", "gpu") in [(s.stage, s.device) for s in placement(plan, "dali")]


@pytest.mark.parametrize("params, expected", [
    ({"threshold": 256}, "a level in [0, 255]"),
    ({"threshold": -1}, "a level in [0, 255]"),
    ({"threshold": "128"}, "found a string '128'"),
    ({"threshold": True}, "found a boolean"),
    ({"probability": 1.5}, "probability in [0, 1]"),
])
def test_solarize_refuses_bad_parameters_naming_the_key(params, expected):
    with pytest.raises(SpecError) as caught:
        plan_of([{"center_crop": 8}, {"solarize": params}])
    key = next(iter(params))
    assert f"ops[1].solarize.{key}" in str(caught.value) and expected in str(caught.value)


@pytest.mark.parametrize("threshold", THRESHOLDS)
def test_every_level_solarizes_as_torchvision_does(threshold):
    from torchvision.transforms.v2 import functional as F

    levels = torch.arange(256, dtype=torch.uint8).reshape(1, 16, 16).expand(3, 16, 16).contiguous()
    want = F.solarize(levels, threshold)
    assert torch.equal(torch.from_numpy(solarized_levels(threshold)).reshape(1, 16, 16).expand(3, 16, 16), want)
    step = plan_of([{"center_crop": 16}, {"solarize": threshold}]).steps[1]
    assert torch.equal(step.op.torchvision_kernel(levels, (Solarize(True),), step.params), want)
    assert torch.equal(step.op.torchvision_kernel(levels, (Solarize(False),), step.params), levels)
    inverted = int((want != levels).sum()) // 3
    assert inverted == sum(1 for v in range(256) if v >= threshold and v != 255 - v)


def test_the_batched_kernel_solarizes_the_chosen_images_as_the_per_sample_kernel():
    step = plan_of([{"center_crop": 8}, {"solarize": 100.5}]).steps[1]
    batch = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (5, 3, 9, 7), dtype=np.uint8))
    concrete = [(Solarize(apply),) for apply in (True, False, True, True, False)]
    got = step.op.batch_kernel(batch, concrete, step.params)
    for image, ours, chosen in zip(batch, got, concrete):
        assert torch.equal(ours, step.op.torchvision_kernel(image, chosen, step.params))


def _solarize_on_dali_cpu(step, images: list[np.ndarray], chosen: list[bool]) -> list[np.ndarray]:
    """The op's own DALI fragment on dali-cpu, given which HWC uint8 images are solarized."""
    from nvidia.dali import fn, pipeline_def

    from dali_bridge.backends.dali.plan import graph_context

    plan = plan_of([{"center_crop": 8}, {"solarize": step.params}])
    ctx = graph_context(plan, "cpu")
    ctx.position = 1
    concrete = [(Solarize(apply),) for apply in chosen]
    arguments = step.op.dali_arguments(step, concrete, [image.shape[:2] for image in images], ctx)

    @pipeline_def(batch_size=len(images), num_threads=1, device_id=None)
    def graph():
        image = fn.external_source(source=[images], batch=True, cycle=True, layout="HWC")
        columns = {c.name: fn.external_source(source=[arguments[c.name]], batch=True, cycle=True)
                   for c in step.op.dali_columns(step, ctx)}
        return step.op.dali_graph(step, image, columns, ctx)

    pipe = graph()
    pipe.build()
    (out,) = pipe.run()
    return [np.array(out[i]) for i in range(len(images))]


@pytest.mark.parametrize("threshold", THRESHOLDS)
def test_dali_fragment_equals_torchvision_solarize_on_every_level(threshold):
    from torchvision.transforms.v2 import functional as F

    step = plan_of([{"center_crop": 8}, {"solarize": {"threshold": threshold, "probability": 0.5}}]).steps[1]
    every_level = np.repeat(np.arange(256, dtype=np.uint8).reshape(16, 16, 1), 3, axis=2)
    noise = np.random.default_rng(1).integers(0, 256, (37, 52, 3), dtype=np.uint8)
    images, chosen = [every_level, noise, every_level, noise[:1, :1]], [True, True, False, True]
    got = _solarize_on_dali_cpu(step, images, chosen)
    for image, ours, apply in zip(images, got, chosen):
        want = F.solarize(torch.from_numpy(image).permute(2, 0, 1), threshold).permute(1, 2, 0).numpy()
        assert ours.dtype == np.uint8 and np.array_equal(ours, want if apply else image)


@pytest.mark.parametrize("probability", [0.2, 0.5])
def test_solarize_rate_matches_torchvision_random_solarize_within_three_sigma(probability):
    from torchvision.transforms import v2

    from dali_bridge.pipeline.sampling import draws, sample_steps

    plan = plan_of([{"center_crop": 8}, {"solarize": {"threshold": 128, "probability": probability}}])
    sample_draws = draws(plan, seed=0, epoch=0, indices=np.arange(DRAWS))
    ours = float(np.mean([sample_steps(plan, 10, 10, {1: sample_draws[1][i]})[1][0][0].apply for i in range(DRAWS)]))
    torch.manual_seed(0)
    solarize, probe = v2.RandomSolarize(128, p=probability), torch.full((3, 1, 1), 200, dtype=torch.uint8)
    theirs = float(np.mean([int(solarize(probe)[0, 0, 0]) == 55 for _ in range(DRAWS)]))
    sigma = math.sqrt(probability * (1 - probability) / DRAWS)
    assert abs(ours - probability) <= 3 * sigma
    assert abs(ours - theirs) <= 3 * math.sqrt(2) * sigma  # two independent estimates


def test_the_transforms_v2_counterpart_is_random_solarize_with_the_threshold_and_probability():
    from torchvision.transforms import v2

    step = plan_of([{"center_crop": 8}, {"solarize": {"threshold": 64.5, "probability": 0.2}}]).steps[1]
    (transform,) = step.op.torchvision_transforms(step.params)
    assert type(transform) is v2.RandomSolarize and transform.threshold == 64.5 and transform.p == 0.2


def test_under_exact_parity_solarize_after_a_resize_runs_in_torch_from_the_resize():
    from dali_bridge.backends.dali.plan import dali_plan

    after_resize = [{"center_crop": 300}, {"random_resized_crop": 224}, {"horizontal_flip": 0.5},
                    {"solarize": 128}, {"normalize": {}}]
    plan = dali_plan(plan_of(after_resize))
    # DALI's resize is a level off torchvision's here and there; the threshold makes that level 255
    assert [s.name for s in plan.steps] == ["center_crop"]
    assert [s.name for s in plan.torch_tail] == ["random_resized_crop", "horizontal_flip", "solarize"]
    fast = dali_plan(plan_of(after_resize, parity="fast"))
    assert [s.name for s in fast.steps] == ["center_crop", "random_resized_crop", "horizontal_flip", "solarize"]
    no_resize = dali_plan(plan_of([{"center_crop": 300}, {"horizontal_flip": 0.5}, {"solarize": 128},
                                   {"normalize": {}}]))
    assert [s.name for s in no_resize.steps] == ["center_crop", "horizontal_flip", "solarize"]
    assert no_resize.torch_tail == ()


@needs_cpu_backends
@pytest.mark.parametrize("ops", [
    [{"random_resized_crop": [96, 80]}, {"solarize": {"threshold": 128, "probability": 0.5}},
     {"horizontal_flip": 0.5}, {"normalize": {"mean": MEAN, "std": STD}}],
    [{"resize": 128}, {"center_crop": [112, 100]}, {"solarize": {"threshold": 77.5, "probability": 0.5}},
     {"normalize": {"dtype": "uint8"}}],
    [{"center_crop": 96}, {"solarize": {"threshold": 128, "probability": 0.5}}, {"horizontal_flip": 0.5},
     {"normalize": {"mean": MEAN, "std": STD}}],
], ids=["between-a-random-resized-crop-and-a-flip", "last-uint8", "in-the-dali-graph"])
def test_solarize_matches_torchvision_on_dali_cpu(sample_root, ops):
    from tests.helpers.equivalence import assert_within_bounds, pipeline, run_compare

    from dali_bridge.pipeline.sampling import draws

    data = pipeline(sample_root, ops)
    plan = build_plan(spec_from_dict(data))
    result = run_compare(data)
    assert_within_bounds(result, samples=37)
    position = [s.name for s in plan.steps].index("solarize")
    chosen = draws(plan, seed=data["seed"], epoch=0, indices=np.arange(37))[position][:, 0] < 0.5
    assert 0 < chosen.sum() < 37  # both solarized and untouched images were compared


@needs_cpu_backends
def test_solarize_in_the_dali_graph_equals_torchvision_to_the_level(sample_root):
    from tests.helpers.equivalence import pipeline, run_compare

    from dali_bridge.backends.dali.plan import dali_plan

    ops = [{"center_crop": 96}, {"horizontal_flip": 0.5}, {"solarize": {"threshold": 100, "probability": 0.5}},
           {"normalize": {"dtype": "uint8"}}]
    data = pipeline(sample_root, ops)
    assert dali_plan(build_plan(spec_from_dict(data))).torch_tail == ()  # the lookup table runs in the graph
    result = run_compare(data)
    assert result.passed and result.output("image").max_abs == 0.0, result.format()


@needs_cpu_backends
def test_solarized_images_on_dali_cpu_are_the_torchvision_backends(sample_root):
    from dali_bridge.loader.loader import build_loader

    data = {"version": 1, "source": {"type": "folder", "root": str(sample_root)}, "batch_size": 8, "seed": 5,
            "loader": {"workers": 1, "shuffle": False},
            "ops": [{"center_crop": 64}, {"solarize": {"threshold": 128, "probability": 1.0}}]}
    plain = {**data, "ops": [{"center_crop": 64}]}
    with build_loader(data, "dali-cpu") as loader, build_loader(plain, "torchvision") as reference:
        (image, _), (original, _) = next(iter(loader)), next(iter(reference))
    assert image.dtype == torch.uint8 and image.shape == (8, 3, 64, 64)
    assert torch.equal(image, torch.where(original >= 128, 255 - original, original))
    assert (image != original).float().mean() > 0.05  # real pictures have bright levels to invert


def test_plain_dali_baseline_solarizes_with_dalis_own_coin_flip():
    from nvidia.dali import fn, pipeline_def

    from dali_bridge.backends.dali.plan import graph_context

    plan = plan_of([{"center_crop": 8}, {"solarize": {"threshold": 128, "probability": 0.5}}])
    step, ctx = plan.steps[1], graph_context(plan, "cpu")
    images = [np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)] * 32

    @pipeline_def(batch_size=len(images), num_threads=1, device_id=None, seed=1)
    def graph():
        image = fn.external_source(source=[images], batch=True, cycle=True, layout="HWC")
        return step.op.dali_baseline(step, image, ctx)

    pipe = graph()
    pipe.build()
    (out,) = pipe.run()
    solarized = np.where(images[0] >= 128, 255 - images[0], images[0])
    outputs = [np.array(out[n]) for n in range(len(images))]
    assert all(o.dtype == np.uint8 for o in outputs)
    chosen = [np.array_equal(o, solarized) for o in outputs]
    assert all(c or np.array_equal(o, images[0]) for c, o in zip(chosen, outputs))
    assert 0 < sum(chosen) < len(images)


def test_the_solarize_fragment_and_baseline_define_a_gpu_graph():
    """The GPU device's graph defines (not run: no CUDA needed here), its arithmetic reading GPU data."""
    defined = gpu_graph_ops([{"center_crop": 8}, {"solarize": {"threshold": 100, "probability": 0.5}}])
    assert defined.count("OpSpec for LookupTable:") == 2
