"""Checks of raw values read from files: type names as messages say them, integer and number tests
that refuse booleans, the parameter checkers the ops declare, and non-finite numbers.

A leaf: it imports nothing of the project, so the spec layer, the sources and the converter use it
without the op layer.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

import numpy as np

# A checker takes the raw value and returns (normalised value, problem or None).
Checker = Callable[[Any], "tuple[Any, str | None]"]


def type_name(value: Any) -> str:
    """How a message names the type of a value read from YAML: ``a string``, ``a list``, ``null``."""
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string",
            list: "a list", dict: "a mapping"}.get(type(value), type(value).__name__)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# The largest magnitude of a number a parameter may hold: the ops compute in float32.
FLOAT32_MAX = float(np.finfo(np.float32).max)

# The largest size an op may set, per side: a 16384 x 16384 RGB image is 768 MiB as uint8, and a
# batch of larger ones fits no host; a size beyond it is a typo, not a pipeline.
MAX_SIZE = 16384


def size_checker(value: Any) -> tuple[Any, str | None]:
    """A size: one positive int (square, or the shorter side for ``resize``) or [height, width]."""
    if is_int(value):
        if value <= 0:
            return value, f"expected a positive size in pixels, found {value}"
        if value > MAX_SIZE:
            return value, f"expected a size of at most {MAX_SIZE} pixels, found {shown(value)}"
        return value, None
    if isinstance(value, list) and len(value) == 2 and all(is_int(v) for v in value):
        if min(value) <= 0:
            return value, f"expected positive sizes in pixels, found {value}"
        if max(value) > MAX_SIZE:
            return value, f"expected sizes of at most {MAX_SIZE} pixels, found [{', '.join(map(shown, value))}]"
        return list(value), None
    return value, f"expected a size in pixels (an integer or [height, width]), found {type_name(value)} {value!r}"


def shown(number: int) -> str:
    """An integer as a message quotes it: at most 20 digits."""
    if abs(number).bit_length() > 10_000:  # str() refuses integers past 4,300 digits
        return f"an integer of about {int(abs(number).bit_length() * math.log10(2)) + 1:,} digits"
    text = str(number)
    return text if len(text) <= 20 else f"{text[:8]}...({len(text)} digits)"


# The checker factories return partials of module-level functions, not closures: an op holds its
# checkers, a plan's steps hold their ops, and a plan is pickled into DataLoader workers started by
# spawn or forkserver.

def int_checker(low: int, high: int, what: str, why: str) -> Checker:
    """An integer from ``low`` to ``high``; ``why`` says what the upper bound comes from (the message
    quotes it, and docs/errors.md lists every bound)."""
    return functools.partial(_check_int, low=low, high=high, what=what, why=why)


def _check_int(value: Any, *, low: int, high: int, what: str, why: str) -> tuple[Any, str | None]:
    if is_int(value) and low <= value <= high:
        return value, None
    found = shown(value) if is_int(value) else f"{type_name(value)} {value!r}"
    return value, f"expected {what} (an integer >= {low}, at most {high}: {why}), found {found}"


def choice_checker(choices: tuple[str, ...]) -> Checker:
    return functools.partial(_check_choice, choices=choices)


def _check_choice(value: Any, *, choices: tuple[str, ...]) -> tuple[Any, str | None]:
    if isinstance(value, str) and value in choices:
        return value, None
    return value, f"expected one of {', '.join(choices)}, found {value!r}"


def probability_checker(value: Any) -> tuple[Any, str | None]:
    if not is_number(value):
        return value, f"expected a probability (number in [0, 1]), found {type_name(value)} {value!r}"
    if not 0.0 <= value <= 1.0:
        return value, f"expected a probability in [0, 1], found {value}"
    return float(value), None


def bool_checker(value: Any) -> tuple[Any, str | None]:
    if isinstance(value, bool):
        return value, None
    return value, f"expected true or false, found {type_name(value)} {value!r}"


def range_checker(lo_bound: float, hi_bound: float | None, what: str) -> Checker:
    """[low, high] with lo_bound < low <= high (<= hi_bound when given)."""
    return functools.partial(_check_range, lo_bound=lo_bound, hi_bound=hi_bound, what=what)


def _check_range(value: Any, *, lo_bound: float, hi_bound: float | None, what: str) -> tuple[Any, str | None]:
    if not (isinstance(value, list) and len(value) == 2 and all(is_number(v) for v in value)):
        return value, f"expected [low, high] {what}, found {type_name(value)} {value!r}"
    lo, hi = float(value[0]), float(value[1])
    if lo > hi:
        return value, f"expected low <= high, found {value}"
    if lo <= lo_bound or (hi_bound is not None and hi > hi_bound):
        upper = f", {hi_bound}]" if hi_bound is not None else ", inf)"
        return value, f"expected both ends in ({lo_bound}{upper}, found {value}"
    return [lo, hi], None


def channels_checker(what: str, positive: bool) -> Checker:
    """Three per-channel (R, G, B) numbers in [0, 1] units; std must be > 0."""
    return functools.partial(_check_channels, what=what, positive=positive)


def _check_channels(value: Any, *, what: str, positive: bool) -> tuple[Any, str | None]:
    if is_number(value):
        value = [value] * 3
    if not (isinstance(value, list) and all(is_number(v) for v in value)):
        return value, f"expected {what} as 3 numbers (R, G, B) in [0, 1] units, found {type_name(value)} {value!r}"
    if len(value) != 3:
        return value, f"expected 3 values (R, G, B) for {what}, found {len(value)}: {value}"
    if positive and any(v <= 0 for v in value):
        return value, f"expected every {what} value > 0, found {value}"
    if any(abs(v) > 1.0 for v in value):
        return value, (f"expected {what} in [0, 1] units like torchvision's (e.g. 0.229, not 58.4), "
                       f"found {value}")
    return [float(v) for v in value], None


def optional(checker: Checker) -> Checker:
    return functools.partial(_check_optional, checker=checker)


def _check_optional(value: Any, *, checker: Checker) -> tuple[Any, str | None]:
    return (None, None) if value is None else checker(value)


def _yaml_number(value: float) -> str:
    """A non-finite float as a pipeline file writes it (``.nan``, ``.inf``, ``-.inf``)."""
    return ".nan" if math.isnan(value) else ".inf" if value > 0 else "-.inf"


def non_finite_problem(value: Any, *, infinity: bool = False) -> str | None:
    """Why a parameter value holds a number no pipeline can compute with, or None.

    NaN compares false with every bound, so an op's own range check lets it through; ±inf passes
    every one-sided bound; a number beyond float32 range becomes inf in the float32 arithmetic of
    DALI and torch (and an integer beyond float range makes a checker's ``float()`` raise). All are
    refused here, once for every parameter of every op (``infinity``: the parameter gives +inf a
    meaning its doc states). Lists are walked, so a range or an (R, G, B) triple is checked item
    by item.
    """
    items = value if isinstance(value, list) else [value]
    for position, item in enumerate(items):
        where = f" at item {position + 1}" if isinstance(value, list) else ""
        if isinstance(item, list):
            problem = non_finite_problem(item, infinity=infinity)
            if problem:
                return problem + where
        elif isinstance(item, float) and not math.isfinite(item):
            if not (infinity and item > 0):
                allowed = " (.inf is allowed)" if infinity else ""
                return f"expected a finite number{allowed}, found {_yaml_number(item)}{where}"
        elif is_number(item) and abs(item) > FLOAT32_MAX:  # exact for an int of any size
            found = shown(item) if is_int(item) else repr(item)
            return (f"expected numbers within float32 range (magnitude at most {FLOAT32_MAX:.3g}, as DALI and "
                    f"torch compute), found {found}{where}")
    return None


def fixed_output_size(size: Any) -> tuple[int, int]:
    """(height, width) for a crop-like size parameter."""
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
