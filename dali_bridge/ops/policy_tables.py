"""The augmentation policies' tables: torchvision's operation sets with their magnitude ranges
(``_AUGMENTATION_SPACE``) and signs, AutoAugment's ImageNet policy, and how a drawn bin and sign
become a :class:`PolicyOperation` (the magnitude tables are torchvision's own ``linspace`` in float32)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

# (start, end) of each linspace table, or a table kind, per operation: torchvision's _AUGMENTATION_SPACE.
# "width"/"height": end = factor x the image's width/height ("width/": width / divisor); "posterize":
# 8 - arange / ((bins - 1) / span) ("posterize4": from 4).
ORIGINAL = {  # RandAugment and AutoAugment
    "Identity": None, "ShearX": (0.0, 0.3), "ShearY": (0.0, 0.3),
    "TranslateX": ("width", 150.0 / 331.0), "TranslateY": ("height", 150.0 / 331.0), "Rotate": (0.0, 30.0),
    "Brightness": (0.0, 0.9), "Color": (0.0, 0.9), "Contrast": (0.0, 0.9), "Sharpness": (0.0, 0.9),
    "Posterize": ("posterize", 4), "Solarize": (1.0, 0.0), "AutoContrast": None, "Equalize": None,
}
WIDE = {  # TrivialAugmentWide
    "Identity": None, "ShearX": (0.0, 0.99), "ShearY": (0.0, 0.99), "TranslateX": (0.0, 32.0),
    "TranslateY": (0.0, 32.0), "Rotate": (0.0, 135.0), "Brightness": (0.0, 0.99), "Color": (0.0, 0.99),
    "Contrast": (0.0, 0.99), "Sharpness": (0.0, 0.99), "Posterize": ("posterize", 6), "Solarize": (1.0, 0.0),
    "AutoContrast": None, "Equalize": None,
}
_AUGMIX_PARTIAL = {  # AugMix's own tables (10 bins, read at the severity's bins)
    "ShearX": (0.0, 0.3), "ShearY": (0.0, 0.3), "TranslateX": ("width/", 3.0),
    "TranslateY": ("height/", 3.0), "Rotate": (0.0, 30.0), "Posterize": ("posterize4", 4),
    "Solarize": (1.0, 0.0), "AutoContrast": None, "Equalize": None,
}
_AUGMIX = {**_AUGMIX_PARTIAL, "Brightness": (0.0, 0.9), "Color": (0.0, 0.9), "Contrast": (0.0, 0.9),
           "Sharpness": (0.0, 0.9)}
SIGNED = frozenset({"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
                     "Sharpness"})
SPACES = {"original": ORIGINAL, "wide": WIDE, "auto": {**ORIGINAL, "Invert": None}, "augmix": _AUGMIX,
          "augmix_partial": _AUGMIX_PARTIAL}

# torchvision's AutoAugmentPolicy.IMAGENET: 25 sub-policies of two (operation, probability, magnitude bin).
IMAGENET_POLICY = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)), (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, None)), (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
    (("Equalize", 0.0, None), ("Equalize", 0.8, None)), (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, None)), (("Color", 0.4, 0), ("Equalize", 0.6, None)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
)
POLICIES = {"imagenet": IMAGENET_POLICY}

# The operations whose output jumps where a pixel crosses a threshold: posterize (a bit boundary),
# solarize (the threshold), equalize (the histogram's cumulative steps), under torchvision's and timm's
# names (PosterizeIncreasing, SolarizeAdd, ...). An op applying any of them is ``discontinuous``.
DISCONTINUOUS_OPERATIONS = ("Posterize", "Solarize", "Equalize")


def any_discontinuous(names: Iterable[str]) -> bool:
    """Whether an op applying the operations ``names`` is discontinuous in its input (see above)."""
    return any(name.startswith(DISCONTINUOUS_OPERATIONS) for name in names)


@dataclass(frozen=True)
class PolicyOperation:
    """One operation of a policy (torchvision's transform id) with its signed magnitude (0.0 when it has none)."""
    name: str
    magnitude: float


@lru_cache(maxsize=4096)
def magnitudes(space: str, name: str, bins: int, height: int, width: int) -> tuple[float, ...] | None:
    """torchvision's magnitude table of operation ``name`` for an image of (height, width): its own
    ``torch.linspace``/``arange`` in float32, as Python floats (what ``float(magnitudes[i])`` reads)."""
    import torch

    table = SPACES[space][name]
    if table is None:
        return None
    start, end = table
    if start in ("posterize", "posterize4"):  # AugMix's counts down from 4 bits, the others' from 8
        values = ((4 if start == "posterize4" else 8) - (torch.arange(bins) / ((bins - 1) / end))).round().int()
    else:
        if start in ("width", "height"):  # torchvision's 150.0 / 331.0 * width
            start, end = 0.0, end * (width if start == "width" else height)
        elif start in ("width/", "height/"):  # AugMix's width / 3.0
            start, end = 0.0, (width if start == "width/" else height) / end
        values = torch.linspace(start, end, bins)
    return tuple(float(v) for v in values)


def pick(u: float, count: int) -> int:
    """``int(torch.randint(count, ()))`` from one uniform."""
    return min(int(u * count), count - 1)


def signed_operation(space: str, name: str, bins: int, index: int, u_sign: float, height: int,
                     width: int) -> PolicyOperation:
    """Operation ``name`` at magnitude bin ``index``, negated when ``u_sign <= 0.5`` for signed operations."""
    table = magnitudes(space, name, bins, height, width)
    if table is None:
        return PolicyOperation(name, 0.0)
    magnitude = table[index]
    if name in SIGNED and u_sign <= 0.5:
        magnitude *= -1
    return PolicyOperation(name, magnitude)
