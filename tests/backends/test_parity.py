"""`parity: fast` trades torchvision's exact resize borders for DALI's plain (faster) resize."""
from __future__ import annotations

import pytest
import torch

from dali_bridge.ops.registry import OPS

from dali_bridge import build_loader
from dali_bridge.spec.pipeline import coerce_spec, load_spec
from dali_bridge.backends.dali.plan import resize_methods
from dali_bridge.loader.placement import placement
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.spec.problems import SpecError

from tests.helpers.backends import backend_params, torch_vector_kernels
from tests.helpers.equivalence import parity_after_resize_problems
from tests.helpers.op_fixtures import RANDOM_POSTERIZE, registered
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


def discontinuous_ops() -> list[str]:
    """The ops the after-resize parity test holds to the discontinuous bound: every op flagged."""
    return sorted(name for name, op in OPS.items() if op.discontinuous)


def test_the_after_resize_parity_test_reads_the_discontinuous_flag(monkeypatch):
    assert {"trivial_augment_wide", "rand_augment", "auto_augment", "augmix", "timm_auto_augment",
            "timm_augmix"} <= set(discontinuous_ops())
    assert "vertical_flip" not in discontinuous_ops() and "color_jitter" not in discontinuous_ops()
    flip = OPS["vertical_flip"]
    jumps = torch.zeros(2, 3, 10, 10, dtype=torch.int32)
    jumps[0, 0, 4, :3] = 40  # 0.5% of the values jump, as a posterize bit flips
    assert parity_after_resize_problems(flip, jumps), "a continuous op is held to a level"
    monkeypatch.setattr(type(flip), "discontinuous", True)
    assert "vertical_flip" in discontinuous_ops()
    assert parity_after_resize_problems(flip, jumps) == []
    jumps[:, :, :5] = 40  # half the values jump: wrong whatever the flag
    assert parity_after_resize_problems(flip, jumps)


AFTER_RESIZE = [{"random_posterize": {"bits": 3, "probability": 1.0}}, "trivial_augment_wide", "rand_augment",
                "auto_augment", "augmix", "timm_auto_augment", "timm_augmix", "vertical_flip"]


@pytest.mark.parametrize("backend", backend_params(["dali-cpu"]))
@pytest.mark.parametrize("op", AFTER_RESIZE, ids=lambda op: op if isinstance(op, str) else next(iter(op)))
@pytest.mark.slow
def test_after_a_dali_resize_each_op_is_within_the_bound_its_discontinuous_flag_chooses(backend, op, sample_root):
    """Under parity: fast the resize runs in DALI (a level off torchvision's here and there); the op
    then runs in the graph (random_posterize, a DaliOp) or in the torch tail (the policies)."""
    name = op if isinstance(op, str) else next(iter(op))
    spec = {"version": 1, "source": {"type": "folder", "root": str(sample_root)}, "batch_size": 8, "seed": 3,
            "parity": "fast", "ops": [{"resize": [45, 51]}, op, {"normalize": {"dtype": "uint8"}}],
            "outputs": ["image", "label"], "loader": {"workers": 1, "shuffle": False}}
    with registered(RANDOM_POSTERIZE):
        assert resize_methods(build_plan(coerce_spec(spec))) == {0: "antialias"}  # DALI's own resize
        ours = [batch for batch, _ in build_loader(spec, backend)]
        theirs = [batch for batch, _ in build_loader(spec, "torchvision")]
        delta = torch.cat([(a.int() - b.int()).abs() for a, b in zip(ours, theirs)])
        assert parity_after_resize_problems(OPS[name], delta) == []
        # The flag is honest: an unflagged op never jumps past a level; a flagged op's jumps exceed it
        # (else it need not be flagged) wherever the resize leaves a level to cross — under torch's
        # default CPU kernels torchvision's uint8 resize rounds as DALI's does, and nothing is off.
        jumps = bool(delta[:, :, 1:-1, 1:-1].max() > 1)
        if OPS[name].discontinuous:
            assert jumps or not torch_vector_kernels()
        else:
            assert not jumps
