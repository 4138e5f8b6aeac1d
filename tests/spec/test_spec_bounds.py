"""Every number a pipeline file gives an op is finite and every count is bounded.

The fields are found by walking the op registry's parameter declarations, never listed by hand:
a *float field* is one whose checker takes a fraction (0.5, [0.5, 0.5] or [0.5, 0.5, 0.5]); a
*count field* one whose checker takes an integer but not the same shape with a fraction. Each is
set, in an otherwise valid pipeline file, to a hostile value, and must be refused with a problem
that names the file, line and column and the field.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from dali_bridge.ops.base import REQUIRED
from dali_bridge.ops.registry import OPS
from dali_bridge.ops.base import Param
from dali_bridge.spec.model import MAX_OPS, MAX_REPEATED_AUGMENTATIONS, MAX_SEED
from dali_bridge.spec.overrides import SetFlags
from dali_bridge.spec.pipeline import load_spec, spec_from_dict
from dali_bridge.spec.problems import SpecError

FRACTION_SHAPES = (0.5, [0.5, 0.5], [0.5, 0.5, 0.5])
INTEGER_SHAPES = (3, [3, 3], 1)


def _accepted(param: Param, shapes: tuple) -> list:
    return [shape for shape in shapes if param.check(shape)[1] is None]


def _with_fraction(shape: Any) -> Any:
    return [v + 0.5 for v in shape] if isinstance(shape, list) else shape + 0.5


def _example(param: Param) -> Any:
    """A valid value for a required parameter (the first integer or fraction shape its checker takes)."""
    return (_accepted(param, INTEGER_SHAPES) + _accepted(param, FRACTION_SHAPES))[0]


# Parameters that only count together with another's value (the op's extra_check says so); a
# field missing here whose example fails shows up in test_the_example_values_make_a_valid_pipeline.
COMPANIONS = {("rand_augment", "magnitude_std"): {"variant": "timm"},
              ("rand_augment", "num_magnitude_bins"): {"magnitude": 0}}


def pipeline_with(op_name: str, params: dict) -> dict:
    """A valid pipeline around op ``op_name`` (placed where its kind must run) with ``params`` set."""
    op = OPS[op_name]
    companions = {key: value for name in params for key, value in COMPANIONS.get((op_name, name), {}).items()}
    params = {p.name: _example(p) for p in op.params if p.default is REQUIRED} | companions | params
    entry = {op_name: params}
    if op.category in ("geometry", "pixel"):
        ops = [{"resize": [64, 64]}, entry, {"resize": [32, 32]}]
    elif op.category in ("finish", "compound"):
        ops = [{"resize": [32, 32]}, entry]
    else:
        ops = [{"resize": [32, 32]}, "normalize", entry]
    return {"version": 1, "source": {"type": "folder", "root": "/nonexistent"}, "batch_size": 2, "ops": ops,
            "outputs": ["image", "target"] if op.category == "batch" else ["image", "label"]}


def _op_position(data: dict, op_name: str) -> int:
    """Where the op under test sits (the ops around it are given in the short form, never a mapping)."""
    return next(n for n, entry in enumerate(data["ops"])
                if isinstance(entry, dict) and isinstance(entry.get(op_name), dict))


def _fields(shapes_of) -> Iterator[tuple[str, str, Any]]:
    for op_name, op in sorted(OPS.items()):
        for param in op.params:
            for shape in shapes_of(param):
                yield op_name, param.name, shape


def _float_shapes(param: Param) -> list:
    return _accepted(param, FRACTION_SHAPES)


def _count_shapes(param: Param) -> list:
    return [shape for shape in _accepted(param, INTEGER_SHAPES)
            if not _float_shapes(param) and param.check(_with_fraction(shape))[1] is not None][:1]


FLOAT_FIELDS = list(_fields(_float_shapes))
COUNT_FIELDS = list(_fields(_count_shapes))


def _hostile(shape: Any, bad: Any) -> Iterator[Any]:
    """``shape`` with each of its numbers in turn replaced by ``bad``."""
    if not isinstance(shape, list):
        yield bad
        return
    for position in range(len(shape)):
        yield [bad if n == position else v for n, v in enumerate(shape)]


def _problems_of(tmp_path: Path, data: dict) -> list[str]:
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return [str(problem) for problem in info.value.problems]


def _assert_refused_naming(tmp_path: Path, op_name: str, field: str, value: Any, expected: str) -> None:
    data = pipeline_with(op_name, {field: value})
    key = f"ops[{_op_position(data, op_name)}].{op_name}.{field}: "
    problems = _problems_of(tmp_path, data)
    named = [p for p in problems if key in p]
    assert named, (value, problems)
    assert all(p.startswith(f"{tmp_path / 'p.yaml'}:") for p in named) and any(expected in p for p in named), named


def test_the_registry_has_the_fields_these_tests_walk():
    # The walk finds what the pipeline reference documents as numbers and counts (a shape the
    # probes miss would leave a field untested, so its absence fails here).
    floats = {(op, field) for op, field, _ in FLOAT_FIELDS}
    counts = {(op, field) for op, field, _ in COUNT_FIELDS}
    assert {("gaussian_blur", "sigma"), ("random_erasing", "scale"), ("random_erasing", "ratio"),
            ("random_erasing", "value"), ("random_resized_crop", "ratio"), ("normalize", "mean"),
            ("normalize", "std"), ("mixup", "alpha"), ("augmix", "alpha"), ("color_jitter", "brightness"),
            ("rand_augment", "fill")} <= floats
    assert {("rand_augment", "num_ops"), ("rand_augment", "num_magnitude_bins"), ("augmix", "mixture_width"),
            ("augmix", "chain_depth"), ("gaussian_blur", "kernel_size"), ("resize", "size")} <= counts
    assert not floats & counts


def test_every_other_parameter_takes_no_number_at_all():
    # So no number-taking parameter escapes the walk: each one neither a float nor a count field
    # (choices, flags) refuses every probe shape.
    walked = {(op, field) for op, field, _ in FLOAT_FIELDS + COUNT_FIELDS}
    others = [(name, param) for name, op in OPS.items() for param in op.params if (name, param.name) not in walked]
    assert others
    for name, param in others:
        assert not _accepted(param, FRACTION_SHAPES + INTEGER_SHAPES + (0, 1.0, 10 ** 9)), (name, param.name)


@pytest.mark.parametrize("op_name, field, shape", FLOAT_FIELDS + COUNT_FIELDS,
                         ids=[f"{o}.{f}-{s}" for o, f, s in FLOAT_FIELDS + COUNT_FIELDS])
def test_the_example_values_make_a_valid_pipeline(op_name, field, shape):
    spec_from_dict(pipeline_with(op_name, {field: shape}))  # so each refusal below is the hostile value's


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1e300, -1e39, 10 ** 400],
                         ids=["nan", "inf", "-inf", "1e300", "-1e39", "10^400"])
@pytest.mark.parametrize("op_name, field, shape", FLOAT_FIELDS, ids=[f"{o}.{f}-{s}" for o, f, s in FLOAT_FIELDS])
def test_every_float_field_refuses_non_finite_numbers_naming_the_field(tmp_path, op_name, field, shape, bad):
    param = OPS[op_name].param(field)
    for value in _hostile(shape, bad):
        if param.infinity and bad == math.inf:
            continue  # this parameter gives .inf a meaning (tested below)
        expected = "within float32 range" if isinstance(bad, int) or math.isfinite(bad) else "expected a finite number"
        if param.infinity and bad < 0:
            expected = ""  # the parameter's own lower bound may refuse it first
        _assert_refused_naming(tmp_path, op_name, field, value, expected)


def test_infinity_is_kept_only_where_a_parameter_gives_it_a_meaning():
    infinite = [(name, p.name) for name, op in OPS.items() for p in op.params if p.infinity]
    assert infinite == [("rand_augment", "magnitude_std"), ("timm_augmix", "magnitude_std")]
    spec = spec_from_dict(pipeline_with("rand_augment", {"variant": "timm", "magnitude_std": math.inf}))
    assert spec.ops[1]["magnitude_std"] == math.inf
    assert ".inf" in OPS["rand_augment"].param("magnitude_std").doc  # the reference says so
    with pytest.raises(SpecError, match=r"magnitude_std: expected a finite number \(\.inf is allowed\), found \.nan"):
        spec_from_dict(pipeline_with("rand_augment", {"variant": "timm", "magnitude_std": math.nan}))


@pytest.mark.parametrize("op_name, field, shape", COUNT_FIELDS, ids=[f"{o}.{f}-{s}" for o, f, s in COUNT_FIELDS])
def test_every_count_field_has_an_upper_bound_naming_the_field(tmp_path, op_name, field, shape):
    for value in _hostile(shape, 10 ** 9 + 1):  # odd: a kernel size must be
        _assert_refused_naming(tmp_path, op_name, field, value, "at most")


# ---- counts the spec itself reads

BASE = {"version": 1, "source": {"type": "folder", "root": "/nonexistent"}, "batch_size": 2,
        "ops": [{"center_crop": 8}]}


def _only_problem(data: dict, overrides: dict | None = None) -> str:
    with pytest.raises(SpecError) as info:
        spec_from_dict(data, overrides=overrides)
    assert len(info.value.problems) == 1, info.value.problems
    return str(info.value.problems[0])


@pytest.mark.parametrize("count", [MAX_OPS + 1, 1000, 100_000])
def test_more_ops_than_the_bound_are_refused_once_without_checking_each(count):
    problem = _only_problem(BASE | {"ops": [{"center_crop": 8}] * count})
    assert f"ops: expected at most {MAX_OPS} ops" in problem and f"found {count}" in problem


def test_the_most_ops_allowed_validate():
    assert len(spec_from_dict(BASE | {"ops": [{"center_crop": 8}] * MAX_OPS}).ops) == MAX_OPS


@pytest.mark.parametrize("value", [MAX_REPEATED_AUGMENTATIONS + 1, 10 ** 9])
def test_repeated_augmentations_beyond_the_bound_are_refused(value):
    problem = _only_problem(BASE | {"loader": {"repeated_augmentations": value}})
    assert f"loader.repeated_augmentations: expected an integer >= 1, at most {MAX_REPEATED_AUGMENTATIONS}" in problem


def test_repeated_augmentations_up_to_the_bound_validate():
    spec = spec_from_dict(BASE | {"loader": {"repeated_augmentations": MAX_REPEATED_AUGMENTATIONS}})
    assert spec.loader.repeated_augmentations == MAX_REPEATED_AUGMENTATIONS


@pytest.mark.parametrize("seed", [2 ** 32, 2 ** 32 + 7, 2 ** 64, 10 ** 30])
def test_a_seed_of_2_to_the_32_or_more_is_refused_naming_why(seed):
    # The draws key on the seed's low 32 bits while the order uses all of it: seed s and s + 2^32
    # would give the same augmentations in a different order.
    problem = _only_problem(BASE | {"seed": seed})
    assert "seed: expected an integer >= 0, at most 4294967295" in problem and "low 32 bits" in problem
    assert "seed=" in _only_problem(BASE, overrides=SetFlags({"seed": seed}))  # --set names the flag


@pytest.mark.parametrize("seed", [-1, -(2 ** 32)])
def test_a_negative_seed_is_refused(seed):
    assert "seed: expected an integer >= 0" in _only_problem(BASE | {"seed": seed})


def test_the_largest_seed_validates_and_round_trips():
    spec = spec_from_dict(BASE | {"seed": MAX_SEED})
    assert spec.seed == 2 ** 32 - 1 and spec_from_dict(spec.to_dict()).seed == MAX_SEED


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_label_smoothing_the_one_float_outside_the_ops_is_finite(value):
    data = BASE | {"ops": [{"center_crop": 8}, "normalize", {"mixup": {}}], "outputs": ["image", "target"],
                   "target": {"label_smoothing": value}}
    assert "target.label_smoothing: expected a number in [0, 1)" in _only_problem(data)
