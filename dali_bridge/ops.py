"""The op registry: every op a pipeline file may name, its parameters and which backends run it.

A new op is one entry here, one implementation per backend and one parity test. Parameter
meanings and defaults follow torchvision's ``transforms.v2``; sizes are in pixels, mean/std in
[0, 1] units (the DALI compiler multiplies by 255).

Pure Python: no DALI or torch import, so the spec layer can validate anywhere.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

ALL_BACKENDS = ("dali", "dali-cpu", "torchvision")
INTERPOLATIONS = ("nearest", "bilinear", "bicubic")
DTYPES = ("float32", "float16", "uint8")
LAYOUTS = ("CHW", "HWC")

# A checker takes the raw value and returns (normalised value, problem or None).
Checker = Callable[[Any], "tuple[Any, str | None]"]


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a mapping"}.get(type(value), type(value).__name__)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def size_checker(value: Any) -> tuple[Any, str | None]:
    """A size: one positive int (square, or the shorter side for ``resize``) or [height, width]."""
    if is_int(value):
        return (value, None) if value > 0 else (value, f"expected a positive size in pixels, found {value}")
    if isinstance(value, list) and len(value) == 2 and all(is_int(v) for v in value):
        if min(value) <= 0:
            return value, f"expected positive sizes in pixels, found {value}"
        return list(value), None
    return value, f"expected a size in pixels (an integer or [height, width]), found {_type_name(value)} {value!r}"


def choice_checker(choices: tuple[str, ...]) -> Checker:
    def check(value: Any) -> tuple[Any, str | None]:
        if isinstance(value, str) and value in choices:
            return value, None
        return value, f"expected one of {', '.join(choices)}, found {value!r}"
    return check


def probability_checker(value: Any) -> tuple[Any, str | None]:
    if not is_number(value):
        return value, f"expected a probability (number in [0, 1]), found {_type_name(value)} {value!r}"
    if not 0.0 <= value <= 1.0:
        return value, f"expected a probability in [0, 1], found {value}"
    return float(value), None


def bool_checker(value: Any) -> tuple[Any, str | None]:
    if isinstance(value, bool):
        return value, None
    return value, f"expected true or false, found {_type_name(value)} {value!r}"


def range_checker(lo_bound: float, hi_bound: float | None, what: str) -> Checker:
    """[low, high] with lo_bound < low <= high (<= hi_bound when given)."""
    def check(value: Any) -> tuple[Any, str | None]:
        if not (isinstance(value, list) and len(value) == 2 and all(is_number(v) for v in value)):
            return value, f"expected [low, high] {what}, found {_type_name(value)} {value!r}"
        lo, hi = float(value[0]), float(value[1])
        if lo > hi:
            return value, f"expected low <= high, found {value}"
        if lo <= lo_bound or (hi_bound is not None and hi > hi_bound):
            upper = f", {hi_bound}]" if hi_bound is not None else ", inf)"
            return value, f"expected both ends in ({lo_bound}{upper}, found {value}"
        return [lo, hi], None
    return check


def channels_checker(what: str, positive: bool) -> Checker:
    """Three per-channel (R, G, B) numbers in [0, 1] units; std must be > 0."""
    def check(value: Any) -> tuple[Any, str | None]:
        if is_number(value):
            value = [value] * 3
        if not (isinstance(value, list) and all(is_number(v) for v in value)):
            return value, f"expected {what} as 3 numbers (R, G, B) in [0, 1] units, found {_type_name(value)} {value!r}"
        if len(value) != 3:
            return value, f"expected 3 values (R, G, B) for {what}, found {len(value)}: {value}"
        if positive and any(v <= 0 for v in value):
            return value, f"expected every {what} value > 0, found {value}"
        if any(abs(v) > 1.0 for v in value):
            return value, (f"expected {what} in [0, 1] units like torchvision's (e.g. 0.229, not 58.4), "
                           f"found {value}")
        return [float(v) for v in value], None
    return check


def optional(checker: Checker) -> Checker:
    def check(value: Any) -> tuple[Any, str | None]:
        return (None, None) if value is None else checker(value)
    return check


@dataclass(frozen=True)
class Param:
    """One op parameter: name, default (``REQUIRED`` when none), checker, docs with units."""
    name: str
    default: Any
    check: Checker
    doc: str


REQUIRED = object()


@dataclass(frozen=True)
class OpDef:
    """An op of the registry.

    ``kind`` says how the plan treats it: ``geometry`` changes pixel positions, ``finish`` converts
    dtype/layout and normalises (must be last), ``compound`` lowers to several plan steps.
    ``primary`` is the parameter a scalar shorthand (``- resize: 256``) sets.
    """
    name: str
    kind: str
    params: tuple[Param, ...]
    doc: str
    backends: tuple[str, ...] = ALL_BACKENDS
    primary: str | None = None
    random: bool = False
    extra_check: Callable[[dict], list[tuple[str, str]]] | None = field(default=None, compare=False)

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


_INTERP = Param("interpolation", "bilinear", choice_checker(INTERPOLATIONS),
                "resampling filter: nearest | bilinear | bicubic (default bilinear)")
_ANTIALIAS = Param("antialias", True, bool_checker,
                   "low-pass filter when downscaling, as torchvision's antialias=True (default true)")
_MEAN = Param("mean", [0.0, 0.0, 0.0], channels_checker("mean", positive=False),
              "per-channel mean in [0, 1] units (default [0, 0, 0])")
_STD = Param("std", [1.0, 1.0, 1.0], channels_checker("std", positive=True),
             "per-channel std in [0, 1] units, > 0 (default [1, 1, 1])")
_DTYPE = Param("dtype", "float32", choice_checker(DTYPES), "output dtype: float32 | float16 | uint8 (default float32)")
_LAYOUT = Param("layout", "CHW", choice_checker(LAYOUTS), "output layout per image: CHW | HWC (default CHW)")


def _check_finish(params: dict) -> list[tuple[str, str]]:
    if params.get("dtype") == "uint8" and (params.get("mean") != [0.0] * 3 or params.get("std") != [1.0] * 3):
        return [("dtype", "uint8 output cannot hold normalised values: use dtype float32 or float16, "
                          "or leave mean/std at their defaults [0,0,0]/[1,1,1]")]
    return []


OPS: dict[str, OpDef] = {op.name: op for op in (
    OpDef("random_resized_crop", "geometry", (
        Param("size", REQUIRED, size_checker, "output size in pixels: an integer (square) or [height, width]"),
        Param("scale", [0.08, 1.0], range_checker(0.0, 1.0, "fractions of the image area"),
              "range of the crop's area as a fraction of the image area, in (0, 1] (default [0.08, 1.0])"),
        Param("ratio", [3.0 / 4.0, 4.0 / 3.0], range_checker(0.0, None, "aspect ratios (width/height)"),
              "range of the crop's aspect ratio width/height, drawn log-uniformly (default [3/4, 4/3])"),
        _INTERP, _ANTIALIAS),
        "Crop a random window (area and aspect ratio drawn as torchvision's RandomResizedCrop: "
        "10 attempts, then a centred fallback) and resize it to `size`.",
        primary="size", random=True),
    OpDef("resize", "geometry", (
        Param("size", REQUIRED, size_checker,
              "an integer: the shorter side in pixels, aspect ratio kept (torchvision's Resize(int)); "
              "or [height, width]: exact output size"),
        Param("max_size", None, optional(size_checker),
              "with an integer size: cap on the longer side in pixels (default none)"),
        _INTERP, _ANTIALIAS),
        "Resize the image, like torchvision's Resize.", primary="size"),
    OpDef("center_crop", "geometry", (
        Param("size", REQUIRED, size_checker, "output size in pixels: an integer (square) or [height, width]"),),
        "Crop the centre (torchvision's rounding); images smaller than the crop are padded with zeros.",
        primary="size"),
    OpDef("horizontal_flip", "geometry", (
        Param("probability", 0.5, probability_checker, "chance of flipping each image, in [0, 1] (default 0.5)"),),
        "Mirror left-right with the given probability (torchvision's RandomHorizontalFlip).",
        primary="probability", random=True),
    OpDef("normalize", "finish", (_MEAN, _STD, _DTYPE, _LAYOUT),
          "Convert to `dtype` and normalise: (pixel/255 - mean) / std for float outputs. Must be last.",
          extra_check=_check_finish),
    OpDef("crop_mirror_normalize", "compound", (
        Param("crop", None, optional(size_checker), "centre crop size in pixels applied first (default none)"),
        Param("mirror", 0.0, probability_checker, "chance of a horizontal flip, in [0, 1] (default 0)"),
        _MEAN, _STD, _DTYPE, _LAYOUT),
        "DALI-style fused op: optional centre crop, random mirror, then normalize. Must be last.",
        random=True, extra_check=_check_finish),
)}


def op_names() -> list[str]:
    return sorted(OPS)


def unsupported_options(name: str, params: dict[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
    """Option combinations of an op that only some backends reproduce: ``(what, those backends)``.

    bicubic without antialias: torchvision's filter is Keys' cubic with a = -0.75 and DALI's
    cubic filter has a = -0.5 (measured up to 11 levels of 255 apart, everywhere in the image),
    so it runs on torchvision only rather than silently differ. A 1 x 1 output (size 1, or a
    shorter side of 1 on a square image) with bilinear or bicubic: PyTorch's uint8 resize fails on
    it with an internal assert, so it runs on the DALI backends only.
    """
    found = []
    if name not in ("resize", "random_resized_crop"):
        return found
    if params.get("interpolation") == "bicubic" and params.get("antialias") is False:
        found.append(("interpolation bicubic with antialias false (torchvision's non-antialiased bicubic, a=-0.75, "
                      "has no DALI filter; DALI's cubic is a=-0.5): set antialias: true or use bilinear",
                      ("torchvision",)))
    if params.get("size") in (1, [1, 1], (1, 1)) and params.get("interpolation", "bilinear") != "nearest":
        found.append((f"size {params['size']} with interpolation {params.get('interpolation', 'bilinear')} "
                      "(PyTorch's uint8 resize cannot make a 1x1 image): use nearest or at least 2 pixels",
                      ("dali", "dali-cpu")))
    return found


def fixed_output_size(size: Any) -> tuple[int, int]:
    """(height, width) for a crop-like size parameter."""
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))

