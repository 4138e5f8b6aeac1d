"""color_jitter: brightness, contrast, saturation and hue in a random order (torchvision's ``ColorJitter``).

Each sample draws the order of the four adjustments (a uniform permutation, torchvision's
``torch.randperm(4)``) and one factor per adjustment, uniform in its range and rounded to float32
as torchvision's ``torch.empty(1).uniform_(low, high)`` is; an adjustment whose range is the
identity is skipped, as in torchvision.

On DALI backends the op runs in torch right after the DALI graph (it is not a ``DaliOp``), as
torchvision's own kernels: no DALI operator reproduces their arithmetic. ``fn.hsv`` and
``fn.color_twist`` approximate hue and saturation by one linear transform in RGB space (DALI's
documentation says so) where torchvision converts to HSV, shifts the hue and converts back;
torchvision's contrast blends with the mean of the image's *grey level* (its float32
``rgb_to_grayscale``, then the mean), and each adjustment truncates to uint8 after its blend — and
the per-sample order of the four would need every permutation built into the graph. The torch tail
applies the exact kernels to the graph's uint8 output: given the same input, DALI backends equal
torchvision by construction.

``probability`` is torchvision's ``RandomApply([ColorJitter(...)], p)``, the self-supervised recipes'
way of jittering only some images: applied when a ninth uniform is below it (``torch.rand(1) < p``).
At 1, its default, no ninth uniform is drawn, so a pipeline without it draws what it always drew.
"""
from __future__ import annotations

import functools

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..util.checks import is_number, probability_checker, type_name
from .base import Op, Param
from .facets import Batching, DaliBaseline, Display, SpecRules

# torchvision's order ids (ColorJitter.transform): 0 brightness, 1 contrast, 2 saturation, 3 hue.
ADJUSTMENTS = ("brightness", "contrast", "saturation", "hue")


def jitter_checker(name: str) -> Any:
    """torchvision's ``ColorJitter._check_input``: a number ``v`` means [max(0, 1 - v), 1 + v] (hue:
    [-v, v]); [low, high] is taken as given; within bounds, low <= high. The identity range
    (every factor 1; hue 0) becomes null: that adjustment is skipped, as torchvision skips it."""
    return functools.partial(_check_jitter, name=name)  # not a closure: ops are pickled into workers


def _check_jitter(value: Any, *, name: str) -> tuple[Any, str | None]:
    hue = name == "hue"
    centre, bounds = (0.0, (-0.5, 0.5)) if hue else (1.0, (0.0, float("inf")))
    if value is None:
        return None, None
    if is_number(value):
        if value < 0:
            return value, f"expected a non-negative number (or [low, high]), found {value}"
        low, high = centre - value, centre + value
        low = low if hue else max(low, 0.0)
    elif isinstance(value, list) and len(value) == 2 and all(is_number(v) for v in value):
        low, high = float(value[0]), float(value[1])
    else:
        return value, f"expected a number or [low, high], found {type_name(value)} {value!r}"
    if not bounds[0] <= low <= high <= bounds[1]:
        where = "[-0.5, 0.5]" if hue else "[0, inf)"
        return value, f"expected {name} factors within {where} with low <= high, found [{low}, {high}]"
    return (None if low == high == centre else [float(low), float(high)]), None


@dataclass(frozen=True)
class Jitter:
    """The four adjustments in ``order`` (torchvision's ids), each with its factor or None (skipped);
    none of them when not ``applied`` (its ``probability`` drew no jitter for this image)."""
    order: tuple[int, ...]
    brightness: float | None
    contrast: float | None
    saturation: float | None
    hue: float | None
    applied: bool = True

    def adjustments(self) -> list[tuple[int, float]]:
        """(torchvision's id, factor) of each adjustment made, in order; none when not applied."""
        if not self.applied:
            return []
        factors = [(adjustment, getattr(self, ADJUSTMENTS[adjustment])) for adjustment in self.order]
        return [(adjustment, factor) for adjustment, factor in factors if factor is not None]


def _factor(bounds: list[float] | None, u: float) -> float | None:
    """torchvision's ``torch.empty(1).uniform_(low, high).item()``: uniform, held in float32."""
    if bounds is None:
        return None
    low, high = bounds
    return float(np.float32(low + (high - low) * u))


class ColorJitter(Op, Batching, Display, DaliBaseline, SpecRules):
    # 8 uniforms per sample: 4 ranked into the order (argsort of iid uniforms: a uniform permutation,
    # as torch.randperm(4)), then one per factor, drawn whether or not the adjustment is set; a ninth
    # decides whether to jitter at all when probability < 1 (see draw_count).
    draws = 8
    transform = "ColorJitter"

    def draw_count(self, params) -> int:
        return self.draws + (params["probability"] < 1.0)

    def sample(self, params, u, height, width) -> tuple:
        order = tuple(int(i) for i in np.argsort(u[:4], kind="stable"))
        factors = {name: _factor(params[name], u[4 + n]) for n, name in enumerate(ADJUSTMENTS)}
        applied = len(u) == self.draws or bool(u[self.draws] < params["probability"])  # RandomApply's rand < p
        return (Jitter(order, **factors, applied=applied),)

    def torchvision_kernel(self, image, concrete, params):
        from torchvision.transforms.v2 import functional as F

        kernels = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
        for adjustment, factor in concrete[0].adjustments():  # as ColorJitter.transform
            image = kernels[adjustment](image, factor)
        return image

    def batch_kernel(self, images, concrete, params):
        from . import batched

        batch = batched.stacked(images)
        if batch is None:
            return None
        jitters = [c[0] for c in concrete]
        kernels = (batched.adjust_brightness, batched.adjust_contrast, batched.adjust_saturation, batched.adjust_hue)
        for place in range(len(ADJUSTMENTS)):  # the n-th adjustment of every sample, grouped by which it is
            groups: dict[int, list[int]] = {}
            for row, jitter in enumerate(jitters):
                adjustment = jitter.order[place]
                if jitter.applied and getattr(jitter, ADJUSTMENTS[adjustment]) is not None:
                    groups.setdefault(adjustment, []).append(row)
            batch = batched.by_group(batch, groups, lambda adjustment, group, rows: kernels[adjustment](
                group, [getattr(jitters[row], ADJUSTMENTS[adjustment]) for row in rows]))
        return batch

    def torchvision_transforms(self, params):
        from torchvision.transforms import v2

        jitter = v2.ColorJitter(**{name: None if params[name] is None else tuple(params[name])
                                   for name in ADJUSTMENTS})
        return [jitter] if params["probability"] == 1.0 else [v2.RandomApply([jitter], p=params["probability"])]

    def torchvision_stage(self, params) -> str:
        chosen = [name for name in ADJUSTMENTS if params[name] is not None]
        if not chosen:
            return "nothing (no factor range set: the image is kept)"
        chance = "" if params["probability"] == 1.0 else f", with probability {params['probability']}"
        return f"F.adjust_{'/'.join(chosen)} (random order{chance})"

    def dali_baseline(self, step, images, ctx):
        from nvidia.dali import fn

        from .dali_op import on_coin_flip

        # What a DALI user writes: fn.color_twist with DALI's own draws, in DALI's fixed order
        # (hue in degrees, rotated in YIQ space), kept or not on DALI's coin flip.
        args = {}
        for name in ADJUSTMENTS:
            bounds = step.params[name]
            if bounds is not None:
                scale = 360.0 if name == "hue" else 1.0
                args[name] = fn.random.uniform(range=[bounds[0] * scale, bounds[1] * scale])
        if not args:
            return images
        jittered = fn.color_twist(images, device=ctx.device, **args)
        probability = step.params["probability"]
        return jittered if probability == 1.0 else on_coin_flip(jittered, images, probability, ctx.device)


_DOCS = {
    "brightness": "brightness factor range: a number v means [max(0, 1 - v), 1 + v], or [low, high] (default none)",
    "contrast": "contrast factor range: a number v means [max(0, 1 - v), 1 + v], or [low, high] (default none)",
    "saturation": "saturation factor range: a number v means [max(0, 1 - v), 1 + v], or [low, high] (default none)",
    "hue": "hue shift range in turns: a number v in [0, 0.5] means [-v, v], or [low, high] within [-0.5, 0.5] "
           "(default none)",
}

COLOR_JITTER = ColorJitter(
    "color_jitter", "pixel", tuple(Param(name, None, jitter_checker(name), _DOCS[name]) for name in ADJUSTMENTS) + (
        Param("probability", 1.0, probability_checker,
              "chance of jittering each image at all, in [0, 1], as torchvision's RandomApply([ColorJitter(...)], p) "
              "(default 1: every image)"),),
    "Change brightness, contrast, saturation and hue by random factors, in a random order per image "
    "(torchvision's ColorJitter). On DALI backends it runs in torch right after the DALI graph.",
    primary="brightness")

REGISTERED = (COLOR_JITTER,)
