"""random_erasing: erase a random rectangle of the normalised image (torchvision's ``RandomErasing``).

Runs after the finish, on the float image (kind ``after_finish``), as torchvision's recipes place
it after ``Normalize``: ``value`` is in the normalised units (0 is the mean colour). The box is
torchvision's ``make_params`` driven by the bridge's uniforms: with probability ``probability``,
up to 10 attempts each drawing an area fraction uniform in ``scale`` and an aspect ratio
log-uniform in ``ratio``, the box height ``round(sqrt(area * ratio))`` and width
``round(sqrt(area / ratio))``, kept when both are smaller than the image, then its top and left
uniform over the positions that fit; when no attempt fits, nothing is erased.
``value: random`` fills the box with standard normal noise from a CPU ``torch.Generator`` seeded by
the sample's own draw, so the noise is the same on every backend and device and after a resume.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .after_finish import AFTER_FINISH, AfterFinishOp
from ..util.checks import type_name, is_number, probability_checker, range_checker
from .base import Param
from .geometry import area_and_aspect

ERASE_ATTEMPTS = 10  # torchvision's RandomErasing tries 10 boxes, then erases nothing


@dataclass(frozen=True)
class Erase:
    """Erase rows [top, top+height) and columns [left, left+width) when ``apply``; ``noise_seed``
    seeds the normal noise for ``value: random`` (None for a constant value)."""
    apply: bool
    top: int = 0
    left: int = 0
    height: int = 0
    width: int = 0
    noise_seed: int | None = None


NO_ERASE = Erase(False)


def erase_box(height: int, width: int, u: Any, scale: Any, ratio: Any) -> tuple[int, int, int, int] | None:
    """torchvision's ``RandomErasing.make_params`` box from ``2 * ERASE_ATTEMPTS + 2`` uniforms:
    (top, left, box height, box width), or None when no attempt fits."""
    for attempt in range(ERASE_ATTEMPTS):
        erase_area, aspect = area_and_aspect(height * width, u[2 * attempt], u[2 * attempt + 1], scale, ratio)
        h = int(round(math.sqrt(erase_area * aspect)))
        w = int(round(math.sqrt(erase_area / aspect)))
        if not (h < height and w < width):
            continue
        top = min(int(u[-2] * (height - h + 1)), height - h)  # torch.randint(0, height - h + 1)
        left = min(int(u[-1] * (width - w + 1)), width - w)
        return top, left, h, w
    return None


def _value_checker(value: Any) -> tuple[Any, str | None]:
    """0 (any number), one number per channel (R, G, B) in the normalised units, or ``random``."""
    if value == "random":
        return value, None
    if is_number(value):
        return float(value), None
    if isinstance(value, list) and len(value) in (1, 3) and all(is_number(v) for v in value):
        return [float(v) for v in value], None
    return value, (f"expected a number, 3 numbers (R, G, B) in the normalised units, or 'random' (normal noise), "
                   f"found {type_name(value)} {value!r}")


class RandomErasing(AfterFinishOp):
    # 1: erase or not (torchvision's torch.rand(1) >= p returns early); 2 per attempt (area, log
    # ratio); top and left; the noise seed.
    draws = 1 + 2 * ERASE_ATTEMPTS + 2 + 1
    transform = "RandomErasing"

    def sample(self, params, u, height, width) -> tuple:
        if not u[0] < params["probability"]:
            return (NO_ERASE,)
        box = erase_box(height, width, u[1:-1], params["scale"], params["ratio"])
        if box is None:
            return (NO_ERASE,)
        seed = int(u[-1] * (1 << 53)) if params["value"] == "random" else None  # the uniform's 53 bits
        return (Erase(True, *box, noise_seed=seed),)

    def value(self, params, concrete: Erase, channels: int) -> Any:
        """The fill of one box as torchvision builds it: [C, h, w] noise or [C|1, 1, 1] constants (float32)."""
        import torch

        if concrete.noise_seed is not None:
            generator = torch.Generator().manual_seed(concrete.noise_seed)
            return torch.empty([channels, concrete.height, concrete.width], dtype=torch.float32).normal_(
                generator=generator)
        value = params["value"]
        return torch.tensor(value if isinstance(value, list) else [value])[:, None, None]

    def apply(self, params, image: Any, concrete: tuple) -> None:
        """Erase one CHW float image in place (``F.erase``'s assignment)."""
        erase = concrete[0]
        if erase.apply:
            fill = self.value(params, erase, image.shape[-3]).to(image.device, non_blocking=True)
            image[..., erase.top:erase.top + erase.height, erase.left:erase.left + erase.width] = fill

    def apply_samples(self, params, images: Any, concretes: list[tuple]) -> None:
        """Erase the batch's boxes in place; the fills are made on the host and, for a batch on a GPU,
        copied to it in one transfer (not one per erased sample)."""
        import torch

        erased = [(row, concrete[0]) for row, concrete in enumerate(concretes) if concrete[0].apply]
        if not erased:
            return
        fills = [self.value(params, erase, images.shape[-3]) for _, erase in erased]
        if images.device.type != "cpu":
            flat = torch.cat([fill.reshape(-1) for fill in fills]).to(images.device, non_blocking=True)
            fills = [part.view(fill.shape) for part, fill in zip(flat.split([f.numel() for f in fills]), fills)]
        for (row, erase), fill in zip(erased, fills):
            images[row, ..., erase.top:erase.top + erase.height, erase.left:erase.left + erase.width] = fill

    def torchvision_transforms(self, params):
        from torchvision.transforms import v2

        return [v2.RandomErasing(p=params["probability"], scale=tuple(params["scale"]), ratio=tuple(params["ratio"]),
                                 value=params["value"] if not isinstance(params["value"], list)
                                 else tuple(params["value"]))]

    def stage(self, params) -> str:
        fill = "normal noise (CPU torch.Generator per sample)" if params["value"] == "random" else f"{params['value']}"
        return f"torch: F.erase's box assignment per sample, fill {fill}"


RANDOM_ERASING = RandomErasing(
    "random_erasing", AFTER_FINISH, (
        Param("probability", 0.5, probability_checker, "chance of erasing a box in each image, in [0, 1] "
                                                       "(default 0.5)"),
        Param("scale", [0.02, 0.33], range_checker(0.0, 1.0, "fractions of the image area"),
              "[low, high] fraction of the image area the box covers, in (0, 1] (default [0.02, 0.33])"),
        Param("ratio", [0.3, 3.3], range_checker(0.0, None, "aspect ratios (height / width)"),
              "[low, high] aspect ratio (height / width) of the box, drawn log-uniformly (default [0.3, 3.3])"),
        Param("value", 0.0, _value_checker,
              "fill in the normalised units: a number, [R, G, B], or `random` (standard normal noise per pixel, "
              "drawn reproducibly) (default 0)")),
    "Erase a random box of the normalised image (torchvision's RandomErasing: 10 attempts, then none). Runs after "
    "`normalize`, on the loader's device.",
    primary="probability")

REGISTERED = (RANDOM_ERASING,)
