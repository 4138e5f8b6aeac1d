"""Draws with views: each view's own, keyed on its number across the groups; the shared ops' once per
sample; a pipeline without views draws exactly what it drew before views existed."""
from __future__ import annotations

import numpy as np

from dali_bridge.pipeline.plan import build_plan
from dali_bridge.pipeline.sampling import draw_count, draws, uniforms
from dali_bridge.spec.pipeline import spec_from_dict

SOURCE = {"type": "folder", "root": "/nonexistent"}
CROP = {"random_resized_crop": {"size": 16}}


def views_plan(shared: list | None = None):
    return build_plan(spec_from_dict({
        "version": 1, "source": SOURCE, "batch_size": 2, "ops": shared or [],
        "views": {"a": {"count": 2, "ops": [CROP, "horizontal_flip", "normalize"]},
                  "b": {"count": 1, "ops": [{"random_resized_crop": {"size": 8}}, "normalize"]}},
        "outputs": ["views", "label"]}))


def test_views_are_numbered_across_groups_in_output_order():
    plan = views_plan()
    assert [(view.group, view.view, view.output_size) for view in plan.views] == \
        [("a", 0, (16, 16)), ("a", 1, (16, 16)), ("b", 2, (8, 8))]
    assert plan.view_plans == plan.views


def test_each_view_draws_its_own_parameters_from_its_number():
    plan, indices = views_plan(), np.arange(6)
    first, second = (draws(view, 3, 1, indices) for view in plan.views[:2])
    assert set(first) == set(second) == {0, 1}
    assert not np.array_equal(first[0], second[0]) and not np.array_equal(first[1], second[1])
    np.testing.assert_array_equal(first[0], uniforms(3, 1, indices, 1, draw_count(plan.views[0].all_steps[0]),
                                                     view=0))


def test_shared_ops_draw_once_for_every_view():
    plan = views_plan(shared=["horizontal_flip"])
    assert [view.shared_steps for view in plan.views] == [1, 1, 1]
    found = [draws(view, 3, 0, np.arange(8)) for view in plan.views]
    assert all(np.array_equal(found[0][0], other[0]) for other in found[1:])   # the shared flip
    assert not np.array_equal(found[0][1], found[1][1])                        # each view's crop
    np.testing.assert_array_equal(found[0][0], uniforms(3, 0, np.arange(8), 1, 1))


def test_a_pipeline_without_views_draws_with_no_view_term():
    plan = build_plan(spec_from_dict({"version": 1, "source": SOURCE, "batch_size": 2,
                                      "ops": [CROP, "horizontal_flip", "normalize"]}))
    assert plan.view_plans == (plan,) and plan.view is None
    found = draws(plan, 9, 2, np.arange(5), np.array([0, 1, 0, 1, 2]))
    for position, values in found.items():
        np.testing.assert_array_equal(values, uniforms(9, 2, np.arange(5), position + 1,
                                                       draw_count(plan.all_steps[position]),
                                                       np.array([0, 1, 0, 1, 2])))
