"""vertical_flip: torchvision's RandomVerticalFlip — same flips and pixels on every backend, and
the sampler's flip rate is torchvision's."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tests.helpers.backends import MEAN, STD, needs_cpu_backends, plan_of

from dali_bridge.loader.placement import placement
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.spec.pipeline import spec_from_dict

DRAWS = 10_000



def test_vertical_flip_defaults_to_probability_one_half_and_keeps_the_size():
    plan = plan_of([{"center_crop": 8}, "vertical_flip"])
    step = plan.steps[1]
    assert step.name == "vertical_flip" and step.params == {"probability": 0.5} and step.random
    assert plan.output_size == (8, 8)
    assert [s.stage for s in placement(plan, "torchvision")][2:4] == ["center_crop", "vertical_flip"]
    assert ("vertical_flip", "fn.flip (vertical)") in [(s.stage, s.implementation) for s in placement(plan, "dali")]


@pytest.mark.parametrize("probability", [0.5, 0.2])
def test_flip_rate_matches_torchvision_random_vertical_flip_within_three_sigma(probability):
    from torchvision.transforms import RandomVerticalFlip

    from dali_bridge.pipeline.sampling import draws, sample_steps

    plan = plan_of([{"center_crop": 8}, {"vertical_flip": probability}])
    sample_draws = draws(plan, seed=0, epoch=0, indices=np.arange(DRAWS))
    ours = float(np.mean([sample_steps(plan, 10, 10, {1: sample_draws[1][i]})[1][0][0].apply for i in range(DRAWS)]))
    torch.manual_seed(0)
    flip, probe = RandomVerticalFlip(probability), torch.tensor([[[0], [1]]])
    theirs = float(np.mean([int(flip(probe)[0, 0, 0]) == 1 for _ in range(DRAWS)]))
    sigma = math.sqrt(probability * (1 - probability) / DRAWS)
    assert abs(ours - probability) <= 3 * sigma
    assert abs(ours - theirs) <= 3 * math.sqrt(2) * sigma  # two independent estimates


@needs_cpu_backends
@pytest.mark.parametrize("ops", [
    [{"random_resized_crop": [96, 80]}, {"vertical_flip": 0.5}, {"horizontal_flip": 0.5},
     {"normalize": {"mean": MEAN, "std": STD}}],
    [{"resize": 128}, {"vertical_flip": 0.5}, {"center_crop": [112, 100]},
     {"normalize": {"dtype": "float16", "layout": "HWC"}}],
], ids=["after-a-random-resized-crop", "between-resize-and-crop-float16-hwc"])
@pytest.mark.slow
def test_vertical_flip_matches_torchvision_on_dali_cpu(sample_root, ops):
    from tests.helpers.equivalence import assert_within_bounds, pipeline, run_compare

    data = pipeline(sample_root, ops)
    plan = build_plan(spec_from_dict(data))
    result = run_compare(data)
    assert_within_bounds(result, samples=37, float16="float16" in str(ops))
    from dali_bridge.pipeline.sampling import draws

    position = [s.name for s in plan.steps].index("vertical_flip")
    flips = draws(plan, seed=data["seed"], epoch=0, indices=np.arange(37))[position][:, 0] < 0.5
    assert 0 < flips.sum() < 37  # both flipped and unflipped images were compared


@needs_cpu_backends
def test_a_vertical_flip_on_one_side_only_fails_the_comparison(sample_root):
    from dali_bridge.tools.compare import compare_batches
    from dali_bridge.loader.loader import build_loader
    from dali_bridge.spec.pipeline import coerce_spec

    def spec(probability: float):
        return coerce_spec({"version": 1, "source": {"type": "folder", "root": str(sample_root)}, "batch_size": 8,
                            "outputs": ["image", "label", "index"], "loader": {"workers": 1},
                            "ops": [{"center_crop": 64}, {"vertical_flip": probability}, {"normalize": {}}]})

    loaders = [build_loader(spec(0.0), "dali-cpu"), build_loader(spec(1.0), "torchvision")]
    try:
        result = compare_batches(loaders[0], loaders[1], spec(0.0).outputs, build_plan(spec(0.0)).finish,
                                 loaders[0].listing.paths, max_batches=1)
    finally:
        for loader in loaders:
            loader.close()
    assert not result.passed and result.output("image").max_abs > 50
