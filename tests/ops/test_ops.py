"""The op layer's contract: every registered op answers for itself, and the DALI columns an op
declares are the ones it builds (by name, dtype and shape)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from conftest import plan_of

from dali_bridge.ops import OPS, REQUIRED, Op, Step
from dali_bridge.sampling import draws, sample_steps

EVERY_OP = [{"random_resized_crop": {"size": 48, "interpolation": "bicubic"}}, {"resize": 64},
            {"horizontal_flip": 0.5}, {"vertical_flip": 0.5}, {"random_grayscale": 0.5},
            {"resize": {"size": [40, 44], "interpolation": "nearest"}},
            {"crop_mirror_normalize": {"crop": 32, "mirror": 0.5}}]



@pytest.mark.parametrize("name", list(OPS))
def test_every_registered_op_documents_its_parameters(name):
    op = OPS[name]
    assert isinstance(op, Op) and op.name == name and op.doc and op.backends
    assert op.primary is None or op.param(op.primary) is not None
    for param in op.params:
        assert param.doc and callable(param.check)
        if param.default is not REQUIRED:
            assert param.check(param.default) == (param.default, None) or param.default is None


def test_every_op_lowers_to_steps_whose_ops_say_how_many_uniforms_they_draw():
    plan = plan_of(EVERY_OP)
    assert [s.kind for s in plan.ops] == ["random_resized_crop", "resize", "horizontal_flip", "vertical_flip",
                                          "random_grayscale", "resize", "center_crop", "horizontal_flip", "normalize"]
    got = draws(plan, 0, 0, np.arange(3))
    assert {pos: u.shape[1] for pos, u in got.items()} == {0: 22, 2: 1, 3: 1, 4: 1, 7: 1}
    assert all(isinstance(step, Step) for step in plan.ops) and plan.finish_step is plan.ops[-1]


def test_declared_dali_columns_are_the_built_ones_for_every_op():
    from dali_bridge.backends.dali import ArgumentColumns

    plan = plan_of(EVERY_OP)
    columns = ArgumentColumns(plan)
    sample_draws = draws(plan, 0, 0, np.arange(4))
    sizes = [(300, 200), (17, 900), (64, 64), (481, 640)]
    per_sample = [sample_steps(plan, h, w, {k: v[row] for k, v in sample_draws.items()})
                  for row, (h, w) in enumerate(sizes)]
    built = columns.build(per_sample)  # raises on a missing, undeclared or mistyped column
    assert len(built) == len(columns.names) - 1 == len(columns.declared)
    assert len(set(columns.names)) == len(columns.names)
    names = dict(zip(columns.names[1:], built))
    np.testing.assert_array_equal(names["4.gray"] + names["4.keep"], np.ones(4))


def test_a_column_an_op_does_not_build_is_reported_with_the_op_and_its_names(monkeypatch):
    from dali_bridge.backends.dali import ArgumentColumns
    from dali_bridge.ops.vertical_flip import RandomVerticalFlip

    plan = plan_of([{"center_crop": 8}, {"vertical_flip": 0.5}])
    monkeypatch.setattr(RandomVerticalFlip, "dali_arguments", lambda self, step, concrete, sizes, ctx: {"flips": 1})
    per_sample = [sample_steps(plan, 10, 10, {1: np.array([0.2])})]
    with pytest.raises(RuntimeError, match=r"op 'vertical_flip' \(step 1\) built DALI columns \['flips'\], "
                                           r"declared \['flip'\]"):
        ArgumentColumns(plan).build(per_sample)


def test_a_column_of_the_wrong_dtype_is_reported_with_its_declaration(monkeypatch):
    from dali_bridge.backends.dali import ArgumentColumns
    from dali_bridge.ops.vertical_flip import RandomVerticalFlip

    plan = plan_of([{"center_crop": 8}, {"vertical_flip": 0.5}])
    monkeypatch.setattr(RandomVerticalFlip, "dali_arguments",
                        lambda self, step, concrete, sizes, ctx: {"flip": np.zeros(1, dtype=np.float64)})
    per_sample = [sample_steps(plan, 10, 10, {1: np.array([0.2])})]
    with pytest.raises(RuntimeError, match=r"column 'flip' declared int32 \(\), built float64"):
        ArgumentColumns(plan).build(per_sample)


def test_sample_steps_have_one_shape_for_every_image_size():
    plan = plan_of(EVERY_OP)
    sample_draws = draws(plan, 0, 0, np.arange(40))
    shapes = set()
    for i, (h, w) in enumerate(itertools.islice(itertools.cycle([(5, 900), (900, 5), (32, 32), (481, 640)]), 40)):
        steps = sample_steps(plan, h, w, {k: v[i] for k, v in sample_draws.items()})
        shapes.add(tuple(tuple(type(item).__name__ for item in concrete) for concrete, _ in steps))
    assert len(shapes) == 1
