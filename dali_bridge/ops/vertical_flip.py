"""vertical_flip: mirror top-bottom with a probability (torchvision's ``RandomVerticalFlip``)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..util.checks import probability_checker
from .base import Param
from .dali_op import Column, DaliOp
from .facets import DaliBaseline, Display


@dataclass(frozen=True)
class VerticalFlip:
    """Mirror top-bottom when ``apply``."""
    apply: bool


class RandomVerticalFlip(DaliOp, Display, DaliBaseline):
    draws = 1  # one uniform per sample: flipped when below the probability, as torchvision's torch.rand(1) < p
    transform = "RandomVerticalFlip"

    def sample(self, params, u, height, width) -> tuple:
        return (VerticalFlip(bool(u[0] < params["probability"])),)

    def torchvision_kernel(self, image, concrete, params):
        from torchvision.transforms.v2 import functional as F

        return F.vertical_flip(image) if concrete[0].apply else image

    def torchvision_transforms(self, params):
        from torchvision.transforms import v2

        return [v2.RandomVerticalFlip(params["probability"])]

    def torchvision_stage(self, params) -> str:
        return "F.vertical_flip"

    def dali_columns(self, step, ctx):
        return [Column("flip", "int32", ())]

    def dali_arguments(self, step, concrete, sizes, ctx):
        return {"flip": np.array([c[0].apply for c in concrete], dtype=np.int32)}

    def dali_graph(self, step, images, columns, ctx):
        from nvidia.dali import fn

        return fn.flip(images, horizontal=0, vertical=columns["flip"], device=ctx.device)

    def dali_stages(self, step, ctx):
        return [(step.name, "fn.flip (vertical)")]

    def dali_baseline(self, step, images, ctx):
        from nvidia.dali import fn

        coin = fn.random.coin_flip(probability=step.params["probability"])
        return fn.flip(images, horizontal=0, vertical=coin, device=ctx.device)


VERTICAL_FLIP = RandomVerticalFlip(
    "vertical_flip", "geometry", (
        Param("probability", 0.5, probability_checker, "chance of flipping each image, in [0, 1] (default 0.5)"),),
    "Mirror top-bottom with the given probability (torchvision's RandomVerticalFlip).",
    primary="probability")

REGISTERED = (VERTICAL_FLIP,)
