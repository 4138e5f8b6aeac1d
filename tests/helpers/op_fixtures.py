"""Ops registered for tests only: what an op's author writes, used to show that the every-op
tests in ``test_ops.py`` check an op nobody listed there.

``random_posterize`` (torchvision's RandomPosterize) runs in the DALI graph (a :class:`DaliOp`
with one argument column; posterize is discontinuous, so it says so); ``random_invert``
(RandomInvert) has no DALI fragment, so the DALI backends run it in torch after the graph.
``FIXTURE_OPS`` is all of them; :func:`registered` adds them to the registry for one test.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from dali_bridge.util.checks import int_checker, probability_checker
from dali_bridge.ops.base import Op, Param
from dali_bridge.ops.dali_op import Column, DaliOp
from dali_bridge.ops.facets import Display
from dali_bridge.ops.registry import OPS
from dali_bridge.ops.registry import op_problems


@dataclass(frozen=True)
class Posterize:
    bits: int  # 8 keeps the image as it is


class RandomPosterize(DaliOp, Display):
    draws = 1
    transform = "RandomPosterize"
    discontinuous = True  # a level's difference before it moves a pixel across a bit boundary

    def sample(self, params, u, height, width) -> tuple:
        return (Posterize(params["bits"] if u[0] < params["probability"] else 8),)

    def torchvision_kernel(self, image, concrete, params):
        from torchvision.transforms.v2 import functional as F

        return F.posterize(image, concrete[0].bits)

    def torchvision_transforms(self, params):
        from torchvision.transforms import v2

        return [v2.RandomPosterize(params["bits"], params["probability"])]

    def torchvision_stage(self, params) -> str:
        return "F.posterize"

    def dali_columns(self, step, ctx):
        return [Column("mask", "uint8", ())]

    def dali_arguments(self, step, concrete, sizes, ctx):
        return {"mask": np.array([(0xFF << (8 - c[0].bits)) & 0xFF for c in concrete], dtype=np.uint8)}

    def dali_graph(self, step, images, columns, ctx):
        from nvidia.dali import fn, types

        return fn.cast(images & columns["mask"], dtype=types.UINT8, device=ctx.device)

    def dali_stages(self, step, ctx):
        return [(step.name, "bitwise and with the mask")]


@dataclass(frozen=True)
class Invert:
    apply: bool


class RandomInvert(Op, Display):
    draws = 1
    transform = "RandomInvert"

    def sample(self, params, u, height, width) -> tuple:
        return (Invert(bool(u[0] < params["probability"])),)

    def torchvision_kernel(self, image, concrete, params):
        from torchvision.transforms.v2 import functional as F

        return F.invert(image) if concrete[0].apply else image

    def torchvision_transforms(self, params):
        from torchvision.transforms import v2

        return [v2.RandomInvert(params["probability"])]

    def torchvision_stage(self, params) -> str:
        return "F.invert"


_PROBABILITY = Param("probability", 0.5, probability_checker, "chance of applying it to each image, in [0, 1]")

RANDOM_POSTERIZE = RandomPosterize(
    "random_posterize", "pixel",
    (Param("bits", 4, int_checker(1, 8, "a number of bits", "kept per channel"), "bits kept per channel, 1 to 8"),
     _PROBABILITY),
    "Keep the top `bits` of each channel with the given probability (torchvision's RandomPosterize).")

RANDOM_INVERT = RandomInvert(
    "random_invert", "pixel", (_PROBABILITY,),
    "Invert the colours with the given probability (torchvision's RandomInvert).", primary="probability")

FIXTURE_OPS = (RANDOM_POSTERIZE, RANDOM_INVERT)


@contextmanager
def registered(*ops: Op) -> Iterator[None]:
    """The registry with ``ops`` added, each passing the checks every op passes (:func:`op_problems`)."""
    for op in ops:
        assert not op_problems(op), (op.name, op_problems(op))
        assert op.name not in OPS, op.name
    OPS.update({op.name: op for op in ops})
    try:
        yield
    finally:
        for op in ops:
            del OPS[op.name]
