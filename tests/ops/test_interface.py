"""The op interface stays small: a required core on Op and DaliOp, the rest in optional facets."""
from __future__ import annotations

import dataclasses
import inspect

import pytest

from dali_bridge.ops.base import Op
from dali_bridge.ops.dali_op import DaliOp
from dali_bridge.ops.facets import Batching, DaliBaseline, Display, Sizing, SpecRules, facet
from dali_bridge.ops.registry import OPS, op_problems

from tests.helpers.op_fixtures import RandomInvert

MAX_CORE_MEMBERS = 20  # Op plus what DaliOp adds: what an op author reads before writing one
FACETS = (Sizing, SpecRules, Display, Batching, DaliBaseline)


def public_members(cls: type) -> set[str]:
    """Dataclass fields, class variables, methods and properties a class declares itself."""
    declared = set(vars(cls)) | set(getattr(cls, "__annotations__", {}))
    if dataclasses.is_dataclass(cls):
        declared |= {field.name for field in dataclasses.fields(cls)}
    return {name for name in declared if not name.startswith("_")}


def test_op_and_dali_op_have_at_most_twenty_public_members_together():
    core = public_members(Op) | public_members(DaliOp)
    assert len(core) <= MAX_CORE_MEMBERS, sorted(core)
    # Op's dataclass fields, the class variables and methods are all counted (a field without a default
    # is in no class __dict__): the count includes them.
    assert {"name", "category", "params", "doc", "draws", "discontinuous", "sample", "torchvision_kernel",
            "dali_columns", "dali_graph"} <= core


def test_no_facet_member_is_also_a_core_member():
    core = public_members(Op) | public_members(DaliOp)
    for facet_class in FACETS:
        assert not public_members(facet_class) & core, facet_class.__name__


def test_the_torch_kernel_receives_the_steps_static_parameters():
    parameters = list(inspect.signature(Op.torchvision_kernel).parameters)
    assert parameters == ["self", "image", "concrete", "params"]


def test_an_op_without_a_facet_answers_with_the_facets_defaults():
    invert = RandomInvert("random_invert", "pixel", (), "Inverts.")
    sizing = facet(invert, Sizing)
    assert sizing.size_param is None and sizing.output_size((), 7, 5) == (7, 5)
    (step,) = facet(invert, SpecRules).lower({"probability": 0.5}, 3)
    assert step.op is invert and step.params == {"probability": 0.5} and step.op_index == 3
    assert facet(invert, SpecRules).draw_count({}) == invert.draws == 1
    assert facet(invert, Batching).batch_kernel([], [], {}) is None
    assert facet(OPS["resize"], Sizing) is OPS["resize"]  # an op with the facet answers itself


def test_the_display_facets_defaults_name_the_ops_class():
    class Plain(DaliOp):
        def torchvision_kernel(self, image, concrete, params):
            return image

        def dali_graph(self, step, images, columns, ctx):
            return images

    plain = Plain("plain", "pixel", (), "Keeps the image.")
    (step,) = facet(plain, SpecRules).lower({}, 0)
    assert facet(plain, Display).torchvision_stage({}) == "Plain.torchvision_kernel"
    assert facet(plain, Display).dali_stages(step, None) == [("plain", "Plain.dali_graph")]
    assert not op_problems(plain)


def test_a_facet_member_written_without_the_facet_is_refused():
    class Shrinking(RandomInvert):
        def resize_request(self, params):  # never asked: the op is no Sizing
            return None

    problems = op_problems(Shrinking("shrinking", "pixel", (), "Shrinks."))
    assert problems == ["defines resize_request of the Sizing facet without subclassing it: add "
                        "dali_bridge.ops.facets.Sizing to its bases"]


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_registered_op_passes_the_facet_check(name):
    assert not op_problems(OPS[name])
