"""The op layer's contract: every registered op answers for itself, and the DALI columns an op
declares are the ones it builds (by name, dtype and shape).

The every-op tests run over the registry (``OPS``) and the ops of ``op_fixtures.py``, registered
for the test: an op is checked by every one of them without being listed here. Each builds a
pipeline around the op from its own declarations (its category places it, its parameters'
defaults and checkers give its values).
"""
from __future__ import annotations

import itertools
import re
import sys

import numpy as np
import pytest

from tests.helpers.backends import plan_of
from tests.helpers.paths import REPO
from tests.helpers.op_fixtures import FIXTURE_OPS, RandomPosterize, registered

from dali_bridge.ops.base import REQUIRED, Category, Op, Param, Step
from dali_bridge.ops.registry import OPS
from dali_bridge.pipeline.sampling import draw_count, draws, sample_steps
from dali_bridge.spec.pipeline import spec_from_dict
from dali_bridge.spec.problems import SpecError
from dali_bridge.ops.facets import Sizing, facet

EVERY_OP_NAMES = sorted(OPS) + [op.name for op in FIXTURE_OPS]
every_op = pytest.mark.parametrize("name", EVERY_OP_NAMES)

MIXED_PIPELINE = [{"random_resized_crop": {"size": 48, "interpolation": "bicubic"}}, {"resize": 64},
                  {"horizontal_flip": 0.5}, {"vertical_flip": 0.5}, {"random_grayscale": 0.5},
                  {"resize": {"size": [40, 44], "interpolation": "nearest"}},
                  {"crop_mirror_normalize": {"crop": 32, "mirror": 0.5}}]
SIZES = [(300, 200), (17, 900), (64, 64), (481, 640), (5, 900), (900, 5)]
# Values tried, in turn, for a required parameter: the first that the op's own checks accept is used.
CANDIDATES = [32, 3, 0.5, [0.5, 1.5], [0.1, 0.9], True, "bilinear"]


@pytest.fixture(autouse=True)
def fixture_ops(request):
    """The fixture ops in the registry while a test runs over one of them."""
    callspec = getattr(request.node, "callspec", None)
    name = callspec.params.get("name") if callspec else None
    with registered(*[op for op in FIXTURE_OPS if op.name == name]):
        yield


def example_params(op: Op) -> dict:
    """Every parameter of ``op`` at its default, a required one at the first of CANDIDATES it accepts."""
    params = {}
    for param in op.params:
        if param.default is REQUIRED:
            value = next((v for v in CANDIDATES if param.validate(v)[1] is None), None)
            assert value is not None, f"op {op.name!r}: no value of {CANDIDATES} fits required '{param.name}'"
            params[param.name] = value
    return params


def pipeline_around(name: str) -> tuple[list, list[str]]:
    """(ops, outputs) of a valid pipeline holding op ``name`` where its category puts it."""
    op = OPS[name]
    entry = {name: example_params(op)}
    before, after = [{"center_crop": 40}], [{"center_crop": 16}, {"normalize": {}}]
    if op.category in (Category.FINISH, Category.COMPOUND):
        return before + [entry], ["image", "label"]
    if op.category in (Category.AFTER_FINISH, Category.BATCH):
        return before + after + [entry], ["image", "target"] if op.category is Category.BATCH else ["image", "label"]
    return before + [entry] + after, ["image", "label"]


def plan_around(name: str):
    from dali_bridge.pipeline.plan import build_plan

    ops, outputs = pipeline_around(name)
    try:
        spec = spec_from_dict({"version": 1, "source": {"type": "folder", "root": "/nonexistent"},
                               "batch_size": 2, "ops": ops, "outputs": outputs})
    except SpecError as exc:
        pytest.fail(f"op {name!r} in {ops}: {exc}")
    return build_plan(spec)


def per_sample_steps(plan, sizes=SIZES) -> list[list]:
    sample_draws = draws(plan, 0, 0, np.arange(len(sizes)))
    return [sample_steps(plan, h, w, {k: v[row] for k, v in sample_draws.items()}) for row, (h, w) in enumerate(sizes)]


@every_op
def test_every_op_documents_its_parameters(name):
    op = OPS[name]
    assert isinstance(op, Op) and op.name == name and op.doc and op.backends
    assert isinstance(op.category, Category)
    assert op.primary is None or op.param(op.primary) is not None
    for param in op.params:
        assert isinstance(param, Param) and param.doc and callable(param.check)
        if param.default is not REQUIRED:
            assert param.check(param.default) == (param.default, None) or param.default is None


@every_op
def test_every_op_and_a_plan_around_it_survive_pickling_for_workers_started_by_spawn(name):
    import pickle

    plan = plan_around(name)  # a step holds its op, and its op its parameters' checkers
    again = pickle.loads(pickle.dumps(plan))
    steps = [(step.name, step.params) for step in plan.all_steps]
    assert [(step.name, step.params) for step in again.all_steps] == steps
    for param in pickle.loads(pickle.dumps(OPS[name])).params:
        if param.default is not REQUIRED and param.default is not None:
            assert param.check(param.default) == (param.default, None)


@every_op
def test_every_op_lowers_to_steps_drawing_the_uniforms_their_ops_declare(name):
    plan = plan_around(name)
    position = next(n for n, op in enumerate(pipeline_around(name)[0]) if name in op)
    own = [step for step in plan.ops if step.op_index == position]
    assert own and all(isinstance(step, Step) and isinstance(step.op, Op) for step in plan.ops)
    assert OPS[name].category is Category.COMPOUND or [step.op for step in own] == [OPS[name]]
    got = draws(plan, 0, 0, np.arange(3))
    assert {pos: u.shape for pos, u in got.items()} == {
        n: (3, draw_count(step)) for n, step in enumerate(plan.ops) if draw_count(step)}


@every_op
def test_every_op_builds_the_dali_columns_it_declares(name):
    from dali_bridge.backends.dali.feed import ArgumentColumns

    plan = plan_around(name)
    columns = ArgumentColumns(plan)
    built = columns.build(per_sample_steps(plan))  # raises on a missing, undeclared or mistyped column
    assert len(built) == len(columns.names) - 1 == len(columns.declared)
    assert len(set(columns.names)) == len(columns.names)


@every_op
def test_every_op_samples_one_shape_and_size_for_every_image_size(name):
    plan = plan_around(name)
    steps = per_sample_steps(plan, list(itertools.islice(itertools.cycle(SIZES), 24)))
    assert len({tuple(tuple(type(item).__name__ for item in concrete) for concrete, _ in sample)
                for sample in steps}) == 1
    # each op's declared output size, step after step, ends at the plan's, whatever the input's,
    # and a step that declares a fixed size (step_size) makes images of that size
    for sample, (height, width) in zip(steps, itertools.cycle(SIZES)):
        for step, (concrete, size) in zip(plan.steps, sample):
            assert size == (height, width)
            height, width = facet(step.op, Sizing).output_size(concrete, height, width)
            fixed = facet(step.op, Sizing).step_size(step.params)
            assert fixed is None or len(fixed) == 1 or (height, width) == fixed, (step.name, fixed)
        assert (height, width) == plan.output_size


@every_op
def test_every_op_is_placed_on_every_backend_it_supports(name):
    from dali_bridge.loader.placement import placement

    plan = plan_around(name)
    for backend in OPS[name].backends:
        stages = [placed.stage for placed in placement(plan, backend)]
        for step in plan.ops:
            if step.op.category is not Category.FINISH:
                assert any(stage.startswith(step.name) for stage in stages), (backend, step.name, stages)


@every_op
def test_every_op_has_its_section_in_the_pipeline_reference(name):
    from dali_bridge.spec.reference import render_reference

    page = render_reference()
    assert f"### `{name}`" in page and OPS[name].doc in page


@every_op
def test_every_op_is_named_where_an_unknown_op_is_reported(name):
    with pytest.raises(SpecError) as refused:
        spec_from_dict({"version": 1, "source": {"type": "folder", "root": "/nonexistent"}, "batch_size": 2,
                        "ops": [{"no_such_op": {}}]})
    known = re.search(r"known ops: ([a-z0-9_, ]+)", str(refused.value)).group(1).split(", ")
    assert name in known


def test_every_op_test_covers_the_registry_and_the_fixture_ops_without_a_list():
    every_op_tests = [test for test_name, test in vars(sys.modules[__name__]).items()
                      if test_name.startswith("test_every_op_") and hasattr(test, "pytestmark")]
    assert len(every_op_tests) >= 7
    for test in every_op_tests:
        names = next(mark.args[1] for mark in test.pytestmark if mark.name == "parametrize")
        assert set(names) == set(OPS) | {op.name for op in FIXTURE_OPS}
    assert not {op.name for op in FIXTURE_OPS} & set(OPS)  # registered only while a test runs over them


def test_an_op_building_a_column_it_did_not_declare_fails_the_every_op_column_test(monkeypatch):
    monkeypatch.setattr(RandomPosterize, "dali_arguments", lambda self, step, concrete, sizes, ctx: {"bits": 1})
    with registered(*FIXTURE_OPS), pytest.raises(RuntimeError, match="built DALI columns"):
        test_every_op_builds_the_dali_columns_it_declares("random_posterize")


def test_the_readme_op_table_lists_every_built_in_op_once():
    from dali_bridge.ops.registry import BUILTIN_OPS

    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Ops\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    listed = [name for row in rows for name in re.findall(r"`(\w+)`", row)]
    assert sorted(listed) == sorted(BUILTIN_OPS)


def test_the_mixed_pipeline_lowers_to_steps_whose_ops_say_how_many_uniforms_they_draw():
    plan = plan_of(MIXED_PIPELINE)
    assert [s.name for s in plan.ops] == ["random_resized_crop", "resize", "horizontal_flip", "vertical_flip",
                                          "random_grayscale", "resize", "center_crop", "horizontal_flip", "normalize"]
    got = draws(plan, 0, 0, np.arange(3))
    assert {pos: u.shape[1] for pos, u in got.items()} == {0: 22, 2: 1, 3: 1, 4: 1, 7: 1}
    assert all(isinstance(step, Step) for step in plan.ops) and plan.finish_step is plan.ops[-1]


def test_the_mixed_pipeline_builds_its_declared_dali_columns():
    from dali_bridge.backends.dali.feed import ArgumentColumns

    plan = plan_of(MIXED_PIPELINE)
    columns = ArgumentColumns(plan)
    built = columns.build(per_sample_steps(plan, [(300, 200), (17, 900), (64, 64), (481, 640)]))
    names = dict(zip(columns.names[1:], built))
    np.testing.assert_array_equal(names["4.gray"] + names["4.keep"], np.ones(4))


def test_a_step_takes_its_op_and_refuses_a_name_saying_what_to_write():
    with pytest.raises(TypeError, match=r"Step\(self, params, op_index\)"):
        Step("center_crop", {"size": (2, 2)}, 0)
    step = Step(OPS["center_crop"], {"size": (2, 2)}, 0)
    assert step.op is OPS["center_crop"] and step.name == "center_crop"


def test_a_column_an_op_does_not_build_is_reported_with_the_op_and_its_names(monkeypatch):
    from dali_bridge.backends.dali.feed import ArgumentColumns
    from dali_bridge.ops.vertical_flip import RandomVerticalFlip

    plan = plan_of([{"center_crop": 8}, {"vertical_flip": 0.5}])
    monkeypatch.setattr(RandomVerticalFlip, "dali_arguments", lambda self, step, concrete, sizes, ctx: {"flips": 1})
    per_sample = [sample_steps(plan, 10, 10, {1: np.array([0.2])})]
    with pytest.raises(RuntimeError, match=r"op 'vertical_flip' \(step 1\) built DALI columns \['flips'\], "
                                           r"declared \['flip'\]"):
        ArgumentColumns(plan).build(per_sample)


def test_a_column_of_the_wrong_dtype_is_reported_with_its_declaration(monkeypatch):
    from dali_bridge.backends.dali.feed import ArgumentColumns
    from dali_bridge.ops.vertical_flip import RandomVerticalFlip

    plan = plan_of([{"center_crop": 8}, {"vertical_flip": 0.5}])
    monkeypatch.setattr(RandomVerticalFlip, "dali_arguments",
                        lambda self, step, concrete, sizes, ctx: {"flip": np.zeros(1, dtype=np.float64)})
    per_sample = [sample_steps(plan, 10, 10, {1: np.array([0.2])})]
    with pytest.raises(RuntimeError, match=r"column 'flip' declared int32 \(\), built float64"):
        ArgumentColumns(plan).build(per_sample)


def test_an_op_whose_concrete_carries_a_size_it_does_not_declare_is_refused_saying_what_to_write():
    from dali_bridge.ops.geometry import Crop

    class Cropping(RandomPosterize):
        def sample(self, params, u, height, width):
            return (Crop(0, 0, 4, 4),)

    op = Cropping("cropping", "geometry", (), "Crops.")
    with pytest.raises(TypeError, match=r"op 'cropping': its concrete Crop has a height and a width, .* override "
                                        r"output_size\(concrete, height, width\)"):
        facet(op, Sizing).output_size(op.sample({}, None, 8, 8), 8, 8)



def test_no_op_module_imports_the_registry_that_imports_it():
    """The registry imports every op module; none imports it back, directly, inside a function or
    through import_module (a step holds its op, a compound op lowers through the ops themselves)."""
    import ast

    for path in sorted((REPO / "dali_bridge" / "ops").glob("*.py")):
        if path.name in ("registry.py", "__init__.py"):
            continue
        tree = ast.parse(path.read_text())
        imported = {node.module or alias.name for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.level for alias in node.names}
        calls = {node.func.id for node in ast.walk(tree)
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
        assert "registry" not in imported and "import_module" not in calls, path.name
