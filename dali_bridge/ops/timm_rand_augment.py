"""timm's RandAugment variant (``rand_augment`` with ``variant: timm``): timm's operation set, its
magnitude scale (0 to 10), magnitude noise (``magnitude_std``), its "increasing" operations, the
0.5 chance of applying each layer, and its PIL kernels — so timm's ``rand-m9-mstd0.5-inc1`` is
``{rand_augment: {variant: timm, magnitude: 9, magnitude_std: 0.5, increasing: true}}``.

Per layer the bridge draws 5 uniforms, as timm's ``RandAugment``/``AugmentOp`` use Python's and
numpy's generators: the operation (``np.random.choice`` with replacement: uniform), whether it
applies (skipped when the uniform is > 0.5, as ``random.random() > prob``), the magnitude noise
(``random.gauss(magnitude, std)``: the normal's inverse CDF of one uniform; ``std`` infinite means
``random.uniform(0, magnitude)``), clipped to [0, 10], the sign (negated when the uniform is > 0.5)
and the resampling filter of shear, translate and rotate (``random.choice((BILINEAR, BICUBIC))``,
timm's default ``interpolation: random``; a fixed ``interpolation`` is used as given and its uniform
left unread, as timm then makes no call).

timm applies its operations to PIL images with PIL's own arithmetic (``Image.transform``,
``ImageEnhance``, ``ImageOps``); the kernel here makes the same PIL calls on the uint8 image, on the
CPU (a GPU tail brings its batch to the host once; the finish takes it back). One exception:
posterize keeping 0 bits (timm's ``Posterize`` at magnitude below 2.5, ``PosterizeIncreasing`` at
10, which magnitude noise reaches) makes the image black, what Pillow's posterize formula gives for
0 bits (each level & ~255); Pillow 13 rejects 0 bits with a ValueError, so timm itself fails on those draws.

The level arguments, the per-operation draws (``timm_operation``) and the PIL kernels here are timm's
for every operation its policies use; timm_auto_augment and timm_augmix share them.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from .base import Op
from .facets import Batching, Display, SpecRules
from .policy_tables import any_discontinuous

LAYER_DRAWS = 5  # uniforms per layer: the operation, whether it applies, the noise, the sign, the filter

LEVEL_DENOMINATOR = 10.0  # timm's magnitude scale: 0 to 10
TIMM_PROBABILITY = 0.5   # timm's default chance of applying each layer (its 'p' config section)
TIMM_FILL = (128, 128, 128)  # timm's default fill colour when no image mean is given

_COMMON = ("AutoContrast", "Equalize", "Invert", "Rotate")
_MOVES = ("ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
OPERATIONS = {  # timm's _RAND_TRANSFORMS and _RAND_INCREASING_TRANSFORMS, in its order
    False: _COMMON + ("Posterize", "Solarize", "SolarizeAdd", "Color", "Contrast", "Brightness", "Sharpness")
    + _MOVES,
    True: _COMMON + ("PosterizeIncreasing", "SolarizeIncreasing", "SolarizeAdd", "ColorIncreasing",
                     "ContrastIncreasing", "BrightnessIncreasing", "SharpnessIncreasing") + _MOVES,
}
_RESAMPLED = frozenset({"Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"})
RANDOM_RESAMPLING = ("bilinear", "bicubic")  # timm's _RANDOM_INTERPOLATION, in its order
# timm's policies' ``interpolation`` (its hparams' interpolation; ``random``: its default tuple).
TIMM_INTERPOLATIONS = ("random", "nearest", "bilinear", "bicubic")


@dataclass(frozen=True)
class TimmOperation:
    """One applied timm operation: its name, its argument (timm's level argument; None for those
    without) and the resampling filter (``nearest``/``bilinear``/``bicubic``; shear, translate, rotate only)."""
    name: str
    argument: float | int | None
    resample: str | None


@dataclass(frozen=True)
class TimmDraw:
    """The applied operations in order and the fill colour (R, G, B levels)."""
    operations: tuple[TimmOperation, ...]
    fill: tuple[int, int, int]


def _signed(value: float, u_sign: float) -> float:
    return -value if u_sign > 0.5 else value  # timm's _randomly_negate: random.random() > 0.5


def level_argument(name: str, magnitude: float, u_sign: float, translate_pct: float = 0.45) -> float | int | None:
    """timm's LEVEL_TO_ARG for ``name`` at a (clipped) magnitude, negated by ``u_sign`` where timm negates;
    ``translate_pct``: timm's hparam of that name (0.45 by default; its AugMix in create_transform: 0.3)."""
    level = magnitude / LEVEL_DENOMINATOR
    if name in ("AutoContrast", "Equalize", "Invert"):
        return None
    if name == "Rotate":
        return _signed(level * 30.0, u_sign)
    if name in ("ShearX", "ShearY"):
        return _signed(level * 0.3, u_sign)
    if name in ("TranslateXRel", "TranslateYRel"):
        return _signed(level * translate_pct, u_sign)
    if name.startswith("Posterize"):
        bits = int(level * 4)
        return {"PosterizeIncreasing": 4 - bits, "PosterizeOriginal": bits + 4}.get(name, bits)
    if name.startswith("Solarize") and name != "SolarizeAdd":
        threshold = min(256, int(level * 256))
        return 256 - threshold if name.endswith("Increasing") else threshold
    if name == "SolarizeAdd":
        return min(128, int(level * 110))
    if name == "Desaturate":  # timm's _minmax_level_to_arg(min_val=0.5, max_val=1.0)
        return max(0.5, min(1.0, 0.5 + 0.5 * level))
    if name == "GaussianBlurRand":  # _minmax_level_to_arg(0, 1): the factor of the radius' upper bound
        return max(0.0, min(1.0, level))
    if name.endswith("Increasing"):  # ColorIncreasing, ContrastIncreasing, ...
        return max(0.1, 1.0 + _signed(level * 0.9, u_sign))
    return level * 1.8 + 0.1  # Color, Contrast, Brightness, Sharpness


def noisy_magnitude(magnitude: float, std: float, u: float) -> float:
    """timm's magnitude for one application: ``random.gauss(magnitude, std)`` (``random.uniform(0,
    magnitude)`` for an infinite std), clipped to [0, 10]; the magnitude itself for std 0."""
    if std == float("inf"):
        magnitude = magnitude * u
    elif std > 0:
        magnitude = NormalDist(magnitude, std).inv_cdf(min(max(u, 2.0 ** -53), 1.0 - 2.0 ** -53))
    return max(0.0, min(magnitude, LEVEL_DENOMINATOR))


def timm_operation(name: str, magnitude: float, std: float, u: Any, translate_pct: float = 0.45,
                   interpolation: str = "random") -> TimmOperation:
    """One timm ``AugmentOp`` once it applies, from 4 uniforms in the order of timm's random calls:
    the magnitude noise, the sign, the resampling filter (shear, translate, rotate; drawn for
    ``interpolation`` random, else that filter), and ``GaussianBlurRand``'s radius
    (``random.uniform(0.1, 2 * factor)`` in its kernel; the operation's argument is then that
    radius). ``u`` may hold only the first 3 for an operation set without it."""
    noisy = noisy_magnitude(magnitude, std, u[0])
    resample = None
    if name in _RESAMPLED:
        resample = (RANDOM_RESAMPLING[min(int(u[2] * 2), 1)] if interpolation == "random" else interpolation)
    argument = level_argument(name, noisy, u[1], translate_pct)
    if name == "GaussianBlurRand":
        argument = 0.1 + (2.0 * argument - 0.1) * u[3]  # Python's random.uniform(a, b): a + (b - a) * random()
    return TimmOperation(name, argument, resample)


def draw_layers(params: Any, u: Any) -> tuple[TimmOperation, ...]:
    """The applied operations of ``num_ops`` layers from 5 uniforms each (see the module docstring)."""
    names = OPERATIONS[bool(params["increasing"])]
    found = []
    for layer in range(params["num_ops"]):
        pick, apply, noise, sign, filter_ = u[LAYER_DRAWS * layer:LAYER_DRAWS * (layer + 1)]
        name = names[min(int(pick * len(names)), len(names) - 1)]
        if apply > TIMM_PROBABILITY:
            continue
        found.append(timm_operation(name, params["magnitude"], params["magnitude_std"], (noise, sign, filter_),
                                    interpolation=params["interpolation"]))
    return tuple(found)


def fill_colour(fill: Any) -> tuple[int, int, int]:
    """PIL's fill colour for the ``fill`` parameter: timm's (128, 128, 128) when null."""
    if fill is None:
        return TIMM_FILL
    values = fill if isinstance(fill, (list, tuple)) else [fill] * 3
    return tuple(int(round(v)) for v in values)


def to_picture(image: Any) -> Any:
    """A CHW uint8 tensor in host memory as the RGB PIL image timm's operations take."""
    import numpy as np
    from PIL import Image

    return Image.fromarray(np.ascontiguousarray(image.permute(1, 2, 0).numpy()))


def from_picture(picture: Any) -> Any:
    """An RGB PIL image as a CHW uint8 tensor."""
    import numpy as np
    import torch

    return torch.from_numpy(np.array(picture)).permute(2, 0, 1).contiguous()


def apply_timm(image: Any, draw: TimmDraw) -> Any:
    """timm's PIL operations on a CHW uint8 tensor in host memory (a GPU tail brings its batch there
    once: ``kernel_on_host``), giving one there too."""
    if not draw.operations:
        return image
    return from_picture(apply_operations(to_picture(image), draw.operations, draw.fill))


def apply_operations(picture: Any, operations: Any, fill: tuple[int, int, int]) -> Any:
    """timm's operations applied in turn to a PIL image."""
    for operation in operations:
        picture = pil_operation(picture, operation, fill)
    return picture


def pil_operation(picture: Any, operation: TimmOperation, fill: tuple[int, int, int]) -> Any:
    """One of timm's operations (its ``NAME_TO_OP`` function) on a PIL image."""
    from PIL import Image, ImageEnhance, ImageFilter, ImageOps

    name, argument = operation.name, operation.argument
    filters = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}
    moved = dict(resample=filters.get(operation.resample),
                 fillcolor=fill)
    width, height = picture.size
    affine = {"ShearX": (1, argument, 0, 0, 1, 0), "ShearY": (1, 0, 0, argument, 1, 0),
              "TranslateXRel": (1, 0, (argument or 0) * width, 0, 1, 0),
              "TranslateYRel": (1, 0, 0, 0, 1, (argument or 0) * height)}
    if name in affine:
        return picture.transform(picture.size, Image.AFFINE, affine[name], **moved)
    if name == "Rotate":
        return picture.rotate(argument, **moved)
    if name in ("AutoContrast", "Equalize", "Invert"):
        return {"AutoContrast": ImageOps.autocontrast, "Equalize": ImageOps.equalize,
                "Invert": ImageOps.invert}[name](picture)
    if name.startswith("Posterize"):
        if argument == 0:  # keep 0 bits: black. Pillow 13 refuses 0 bits (see the module docstring)
            return picture.point([0] * 256 * 3)
        return picture if argument >= 8 else ImageOps.posterize(picture, argument)
    if name == "SolarizeAdd":  # below 128, add (capped at 255); timm's lookup table
        return picture.point([min(255, i + argument) if i < 128 else i for i in range(256)] * 3)
    if name.startswith("Solarize"):
        return ImageOps.solarize(picture, argument)
    if name == "Desaturate":  # colour enhance by 1 - level: 0 is grey
        return ImageEnhance.Color(picture).enhance(min(1.0, max(0.0, 1.0 - argument)))
    if name == "GaussianBlurRand":  # the argument is the radius drawn (timm_operation)
        return picture.filter(ImageFilter.GaussianBlur(radius=argument))
    enhancer = {"Color": ImageEnhance.Color, "Contrast": ImageEnhance.Contrast,
                "Brightness": ImageEnhance.Brightness, "Sharpness": ImageEnhance.Sharpness}
    return enhancer[name.removesuffix("Increasing")](picture).enhance(argument)


class TimmRandAugment(Op, SpecRules, Batching, Display):
    """The plan step of ``rand_augment`` with ``variant: timm`` (``RandAugment.lower``): the pipeline
    file keeps one op name and its parameters, the plan holds timm's algorithm. Not registered:
    the registry's ``rand_augment`` validates and documents the parameters."""
    draws = LAYER_DRAWS  # per layer; see draw_count
    discontinuous = any_discontinuous(name for names in OPERATIONS.values() for name in names)

    def draw_count(self, params) -> int:
        return LAYER_DRAWS * params["num_ops"]

    def sample(self, params, u, height, width) -> tuple:
        return (TimmDraw(draw_layers(params, u), fill_colour(params["fill"])),)

    def kernel_on_host(self, params) -> bool:
        return True  # timm's operations are PIL's

    def torchvision_kernel(self, image, concrete, params):
        return apply_timm(image, concrete[0])

    def torchvision_transforms(self, params):
        raise NotImplementedError("rand_augment with variant timm is timm's transform, not a transforms.v2 one")

    def torchvision_stage(self, params) -> str:
        return (f"timm's RandAugment operations with PIL (magnitude {params['magnitude']} of 10, "
                f"std {params['magnitude_std']}{', increasing' if params['increasing'] else ''}, "
                f"{params['interpolation']} resampling)")


TIMM_RAND_AUGMENT = TimmRandAugment(
    "rand_augment", "pixel", (),
    "timm's RandAugment: its operations with PIL, each layer applied with chance 0.5 (rand_augment, variant timm).")
