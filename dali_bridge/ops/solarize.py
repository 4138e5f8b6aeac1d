"""solarize: invert every level at or above a threshold, with a probability (torchvision's ``RandomSolarize``).

On a uint8 image torchvision's ``solarize_image`` is ``torch.where(image >= threshold, 255 - image,
image)`` (``invert_image`` is a bitwise not), on every channel; ``RandomSolarize`` applies it when
``torch.rand(1) < p``. The threshold may be fractional (a level is compared with it as a number) and
at most 255, torchvision's bound for uint8.

The DALI fragment is a lookup table of the 256 levels (``fn.lookup_table``, built in Python with
the same comparison: every level equal to torchvision's by construction) and the per-sample choice
as the grey op makes it: ``solarized x apply + image x keep`` in uint8, one of the two columns 1
and the other 0 per sample.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..util.checks import is_number, probability_checker, type_name
from .base import Param
from .dali_op import Column, DaliOp, on_coin_flip
from .facets import Batching, DaliBaseline, Display


@dataclass(frozen=True)
class Solarize:
    """Invert the levels at or above the step's threshold when ``apply``."""
    apply: bool


def threshold_checker(value: Any) -> tuple[Any, str | None]:
    """A level in [0, 255]: torchvision refuses a threshold above the dtype's largest value (255 for uint8)."""
    if not is_number(value):
        return value, f"expected a level in [0, 255] (a number; uint8 images), found {type_name(value)} {value!r}"
    if not 0 <= value <= 255:
        return value, (f"expected a level in [0, 255] (levels at or above it are inverted; uint8 images), "
                       f"found {value}")
    return value, None


def solarized_levels(threshold: float) -> np.ndarray:
    """The 256 uint8 levels after solarizing at ``threshold``: ``255 - v`` where ``v >= threshold``."""
    levels = np.arange(256)
    return np.where(levels >= threshold, 255 - levels, levels).astype(np.uint8)


class RandomSolarize(DaliOp, Batching, Display, DaliBaseline):
    draws = 1  # one uniform per sample: solarized when below the probability, as torchvision's torch.rand(1) < p
    transform = "RandomSolarize"
    discontinuous = True  # a level either side of the threshold lands at opposite ends

    def sample(self, params, u, height, width) -> tuple:
        return (Solarize(bool(u[0] < params["probability"])),)

    def torchvision_kernel(self, image, concrete, params):
        from torchvision.transforms.v2 import functional as F

        return F.solarize(image, params["threshold"]) if concrete[0].apply else image

    def batch_kernel(self, images, concrete, params):
        from torchvision.transforms.v2 import functional as F

        from .batched import by_group, stacked

        batch = stacked(images)
        if batch is None:
            return None
        chosen = [row for row, c in enumerate(concrete) if c[0].apply]
        return by_group(batch, {"solarized": chosen},
                        lambda _, group, rows: F.solarize(group, params["threshold"]))

    def torchvision_transforms(self, params):
        from torchvision.transforms import v2

        return [v2.RandomSolarize(params["threshold"], p=params["probability"])]

    def torchvision_stage(self, params) -> str:
        return f"F.solarize (threshold {params['threshold']})"

    def dali_columns(self, step, ctx):
        return [Column("solarized", "uint8", ()), Column("keep", "uint8", ())]

    def dali_arguments(self, step, concrete, sizes, ctx):
        solarized = np.array([c[0].apply for c in concrete], dtype=np.uint8)
        return {"solarized": solarized, "keep": 1 - solarized}

    def dali_graph(self, step, images, columns, ctx):
        from nvidia.dali import fn, types

        solarized, keep = columns["solarized"], columns["keep"]
        if ctx.device == "gpu":
            solarized, keep = solarized.gpu(), keep.gpu()
        table = fn.lookup_table(images, keys=list(range(256)),
                                values=solarized_levels(step.params["threshold"]).tolist(),
                                dtype=types.UINT8, device=ctx.device)
        return table * solarized + images * keep  # uint8: exactly one of the two columns is 1 per sample

    def dali_stages(self, step, ctx):
        return [(step.name, f"fn.lookup_table (levels >= {step.params['threshold']} inverted)"),
                (step.name, "arithmetic (solarized x chosen + image x kept)")]

    def dali_baseline(self, step, images, ctx):
        from nvidia.dali import fn, types

        # What a DALI user writes: the same table on DALI's own coin flip.
        table = fn.lookup_table(images, keys=list(range(256)),
                                values=solarized_levels(step.params["threshold"]).tolist(),
                                dtype=types.UINT8, device=ctx.device)
        return on_coin_flip(table, images, step.params["probability"], ctx.device)


SOLARIZE = RandomSolarize(
    "solarize", "pixel", (
        Param("threshold", 128, threshold_checker,
              "level in [0, 255]: every level at or above it is inverted (255 - level) (default 128, the "
              "self-supervised recipes' value)"),
        Param("probability", 0.5, probability_checker,
              "chance of solarizing each image, in [0, 1] (default 0.5, torchvision's)"),),
    "Invert every level at or above the threshold with the given probability (torchvision's "
    "RandomSolarize on uint8 images).",
    primary="threshold")

REGISTERED = (SOLARIZE,)
