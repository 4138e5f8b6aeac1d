"""`parity: fast` trades torchvision's exact resize borders for DALI's plain (faster) resize."""
from __future__ import annotations

import pytest
import torch

from dali_bridge import build_loader
from dali_bridge.spec.pipeline import load_spec
from dali_bridge.backends.dali.plan import resize_methods
from dali_bridge.loader.placement import placement
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.spec.problems import SpecError

from tests.helpers.backends import backend_params
from tests.helpers.paths import TRAIN

UINT8 = {"ops.2.normalize.dtype": "uint8", "ops.2.normalize.mean": [0, 0, 0], "ops.2.normalize.std": [1, 1, 1]}


def test_parity_defaults_to_exact_and_round_trips():
    spec = load_spec(TRAIN)
    assert spec.parity == "exact"
    assert "parity: exact" in spec.to_yaml()
    assert load_spec(TRAIN, {"parity": "fast"}).parity == "fast"


def test_unknown_parity_is_reported_with_the_choices():
    with pytest.raises(SpecError) as info:
        load_spec(TRAIN, {"parity": "approximate"})
    (problem,) = info.value.problems
    assert problem.path == "parity" and "exact, fast" in problem.message


def test_fast_parity_uses_plain_dali_resize_and_exact_uses_border_renormalisation():
    exact = build_plan(load_spec(TRAIN))
    fast = build_plan(load_spec(TRAIN, {"parity": "fast"}))
    assert resize_methods(exact) == {0: "border_patch"}
    assert resize_methods(fast) == {0: "antialias"}
    fast_stages = [stage.implementation for stage in placement(fast, "dali-cpu")]
    assert not any("multi_paste" in impl for impl in fast_stages)
    assert any("multi_paste" in impl for impl in (s.implementation for s in placement(exact, "dali-cpu")))


def test_nearest_stays_exact_under_fast_parity():
    spec = load_spec(TRAIN, {"parity": "fast", "ops.0.random_resized_crop.interpolation": "nearest"})
    assert resize_methods(build_plan(spec)) == {0: "nearest"}


@pytest.mark.parametrize("backend", backend_params(["dali-cpu"]))
@pytest.mark.slow
def test_fast_parity_differs_from_torchvision_only_in_the_outermost_rows_and_columns(backend, sample_root):
    overrides = {"source.root": str(sample_root), "batch_size": 8, "parity": "fast", **UINT8}
    fast = [batch for batch, _ in build_loader(TRAIN, backend, overrides=overrides)]
    reference = [batch for batch, _ in build_loader(TRAIN, "torchvision", overrides=overrides)]
    delta = torch.cat([(a.int() - b.int()).abs() for a, b in zip(fast, reference)])
    interior = delta[:, :, 1:-1, 1:-1]
    assert interior.max() <= 1 and interior.float().mean() <= 0.25
    assert delta.float().mean() <= 0.25
    assert delta.max() > 1, "the sample set should show DALI's border handling (else this test proves nothing)"
