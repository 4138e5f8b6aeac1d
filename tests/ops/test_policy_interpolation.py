"""The policies' torchvision counterparts are given an ``InterpolationMode``, not its name: torchvision's
``transforms.v2`` policies accept a string only in its newer releases, and a GPU machine may come with
an older torchvision of its own (docs/gpu.md states the oldest the device check accepts)."""
from __future__ import annotations

import pytest
from torchvision.transforms import InterpolationMode

from dali_bridge.pipeline.plan import build_plan
from dali_bridge.spec.pipeline import coerce_spec

POLICIES = {"rand_augment": {"num_ops": 2, "magnitude": 9}, "trivial_augment_wide": {},
            "auto_augment": {"policy": "imagenet"}, "augmix": {"severity": 3}}


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_each_policys_torchvision_transform_gets_an_interpolation_mode(name, interpolation):
    spec = coerce_spec({"version": 1, "source": {"type": "folder", "root": "/nowhere"}, "batch_size": 2,
                        "ops": [{"resize": {"size": [32, 32]}},
                                {name: {**POLICIES[name], "interpolation": interpolation}}]})
    step = build_plan(spec).steps[1]
    (transform,) = step.op.torchvision_transforms(step.params)
    assert type(transform.interpolation) is InterpolationMode
    assert transform.interpolation == InterpolationMode(interpolation)
