"""The op interface, its parameter checkers and the plan's op instance.

An :class:`Op` is one registry entry: a frozen dataclass holding what the spec validator reads
(name, :class:`Category`, parameters, defaults, checks, backends) whose methods answer every other
question about the op — its draws and how they become concrete per-sample parameters, its effect
on the image size, what it asks of a backend's planner (:class:`ResizeRequest`, the centre it
keeps), its torchvision kernel and ``transforms.v2`` counterpart, and the stage ``dali-bridge show``
lists for it. Its DALI graph fragment is an optional facet (:mod:`dali_bridge.ops.dali_op`).
A :class:`Step` is an op instance in a plan: the op itself and its resolved parameters.

Pure Python at import time: torch, torchvision and DALI are imported inside the methods that
need them, so the spec layer can validate anywhere.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, ClassVar, Mapping

import numpy as np

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
            return value, f"expected a size of at most {MAX_SIZE} pixels, found {_shown(value)}"
        return value, None
    if isinstance(value, list) and len(value) == 2 and all(is_int(v) for v in value):
        if min(value) <= 0:
            return value, f"expected positive sizes in pixels, found {value}"
        if max(value) > MAX_SIZE:
            return value, f"expected sizes of at most {MAX_SIZE} pixels, found [{', '.join(map(_shown, value))}]"
        return list(value), None
    return value, f"expected a size in pixels (an integer or [height, width]), found {_type_name(value)} {value!r}"


def _shown(number: int) -> str:
    """An integer as a message quotes it: at most 20 digits."""
    if abs(number).bit_length() > 10_000:  # str() refuses integers past 4,300 digits
        return f"an integer of about {int(abs(number).bit_length() * math.log10(2)) + 1:,} digits"
    text = str(number)
    return text if len(text) <= 20 else f"{text[:8]}...({len(text)} digits)"


def int_checker(low: int, high: int, what: str, why: str) -> Checker:
    """An integer from ``low`` to ``high``; ``why`` says what the upper bound comes from (the message
    quotes it, and docs/errors.md lists every bound)."""
    def check(value: Any) -> tuple[Any, str | None]:
        if is_int(value) and low <= value <= high:
            return value, None
        found = _shown(value) if is_int(value) else f"{_type_name(value)} {value!r}"
        return value, f"expected {what} (an integer >= {low}, at most {high}: {why}), found {found}"
    return check


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
            found = _shown(item) if is_int(item) else repr(item)
            return (f"expected numbers within float32 range (magnitude at most {FLOAT32_MAX:.3g}, as DALI and "
                    f"torch compute), found {found}{where}")
    return None


def fixed_output_size(size: Any) -> tuple[int, int]:
    """(height, width) for a crop-like size parameter."""
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


@dataclass(frozen=True)
class Param:
    """One op parameter: name, default (``REQUIRED`` when none), checker, docs with units.

    ``infinity``: +inf is a value of this parameter with a meaning (its doc says which); every
    other parameter's numbers must be finite (:meth:`validate`).
    """
    name: str
    default: Any
    check: Checker
    doc: str
    infinity: bool = False

    def validate(self, value: Any) -> tuple[Any, str | None]:
        """(normalised value, problem or None): the rule every parameter shares — its numbers are
        finite (:func:`non_finite_problem`) — then the parameter's own checker."""
        problem = non_finite_problem(value, infinity=self.infinity)
        if problem:
            return value, problem
        return self.check(value)


REQUIRED = object()


class Category(str, Enum):
    """What an op is, which places it in the plan (:mod:`dali_bridge.ops`): ``geometry`` moves pixels
    (and may change the size), ``pixel`` changes values in place, ``finish`` converts dtype/layout
    and normalises (last of the per-sample ops on uint8 images), ``compound`` lowers to several plan
    steps; ``after_finish`` (per-sample, on the float images) and ``batch`` (on the whole batch) run
    after the finish (:mod:`dali_bridge.ops.after_finish`). A member equals its name as a string,
    so a pipeline file's wording and an op written with the string (``"pixel"``) both match it."""
    GEOMETRY = "geometry"
    PIXEL = "pixel"
    FINISH = "finish"
    COMPOUND = "compound"
    AFTER_FINISH = "after_finish"
    BATCH = "batch"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


@dataclass(frozen=True)
class Step:
    """An op instance in a plan: the registry :class:`Op` with its resolved ``params``.

    ``op_index`` is the position, in the spec, of the op that produced it (a compound op lowers
    to several steps with one index; the finish a spec leaves implicit has ``len(spec.ops)``).
    An op's ``lower`` builds its steps with itself: ``Step(self, params, op_index)``.
    """
    op: "Op" = field(hash=False)
    params: dict[str, Any] = field(hash=False)
    op_index: int

    def __post_init__(self) -> None:
        if not isinstance(self.op, Op):
            raise TypeError(f"Step takes the op itself, found {type(self.op).__name__} {self.op!r}: an op's "
                            f"lower() writes Step(self, params, op_index)")

    def __hash__(self) -> int:
        return hash((self.op.name, self.op_index))

    @property
    def name(self) -> str:
        """The op's name (``kind`` is its older spelling)."""
        return self.op.name

    @property
    def kind(self) -> str:
        return self.op.name

    @property
    def random(self) -> bool:
        return self.op.random


@dataclass(frozen=True)
class ResizeRequest:
    """What a resizing step asks for: torchvision's filter and ``antialias``, and ``size`` — the
    output (height, width), or ``(shorter side,)`` with the longer side capped at ``max_size``."""
    interpolation: str
    antialias: bool
    size: tuple[int, ...]
    max_size: int | None = None

    @property
    def shorter_side(self) -> bool:
        return len(self.size) == 1


@dataclass(frozen=True)
class Op:
    """An op of the registry; subclasses hold one op's behaviour.

    ``category``: its :class:`Category` (given as the member or its string; ``kind`` is its older
    name). An op that runs in the DALI graph is a :class:`~dali_bridge.ops.dali_op.DaliOp` (the
    DALI hooks); any other per-sample op runs, on the DALI backends, as its torchvision kernel
    right after the graph (the plan's torch tail). ``primary`` is the parameter a scalar shorthand
    (``- resize: 256``) sets. ``size_param``/``size_rule`` tell the validator how the op sets
    the output size: ``output`` (that size), ``resize`` (an int is a shorter side) or ``crop``
    (that size, which must fit what comes before); ``None`` when the size stays.
    """
    name: str
    category: Category
    params: tuple[Param, ...]
    doc: str
    backends: tuple[str, ...] = ALL_BACKENDS
    primary: str | None = None
    size_param: str | None = None
    size_rule: str | None = None

    draws: ClassVar[int] = 0                  # uniforms drawn per sample (see sampling.draws)
    transform: ClassVar[str] = ""             # the transforms.v2 transform it matches (from_torchvision maps it here)
    folds_into_finish: ClassVar[bool] = False  # DALI: a last step given to crop_mirror_normalize
    # DALI: as the first step, the names of its (anchor, shape) columns of a crop window the decoder
    # reads as its region of interest (a random resized crop); None when it has none.
    window_columns: ClassVar[tuple[str, str] | None] = None
    # DALI: runs as its torchvision kernel in torch on the loader's device right after the DALI graph,
    # which then ends before the first such step (the plan's torch tail; each op's docstring says why).
    # True for every op but a DaliOp.
    torch_after_dali: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if isinstance(self.category, str) and self.category in Category._value2member_map_:
            object.__setattr__(self, "category", Category(self.category))  # else op_problems names it

    @property
    def kind(self) -> Category:
        """The category, under its older name."""
        return self.category

    @property
    def random(self) -> bool:
        return self.draws > 0

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    # ---- spec
    def extra_check(self, params: dict) -> list[tuple[str, str]]:
        """Problems across parameters: (parameter, message)."""
        return []

    def unsupported_options(self, params: Mapping[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
        """Option combinations only some backends reproduce: ``(what, those backends)``."""
        return []

    # ---- plan
    def lower(self, params: dict[str, Any], op_index: int) -> list[Step]:
        """The plan steps of this op (sizes as (height, width) tuples)."""
        return [Step(self, dict(params), op_index)]

    def fixed_size(self, params: Mapping[str, Any]) -> tuple[int, int] | None:
        """The (height, width) this op sets every image to, from the spec's parameters; None when it
        leaves the size as it is or open (a shorter-side resize), read from ``size_param``."""
        value = params.get(self.size_param) if self.size_param else None
        if value is None or (self.size_rule == "resize" and isinstance(value, int)):
            return None
        return fixed_output_size(value)

    def step_size(self, params: Mapping[str, Any]) -> tuple[int, ...] | None:
        """The size a plan step of this op sets, from its lowered parameters: (height, width), or
        ``(shorter side,)`` for a resize keeping the aspect ratio; None when it keeps the size."""
        value = params.get(self.size_param) if self.size_param else None
        return None if value is None else tuple(value)

    def resize_request(self, params: Mapping[str, Any]) -> ResizeRequest | None:
        """The resize this step runs (a backend's planner chooses how), or None for an op that
        does not resample."""
        return None

    def kept_centre(self, params: Mapping[str, Any]) -> tuple[int, int] | None:
        """The (height, width) of the middle of its input a centre crop keeps (its border hidden);
        None for every other op."""
        return None

    # ---- per sample: pure numpy
    def draw_count(self, params: Mapping[str, Any]) -> int:
        """Uniforms per sample for these parameters: ``draws``, unless a parameter sets the count."""
        return self.draws

    def sample(self, params: Mapping[str, Any], u: np.ndarray | None, height: int, width: int) -> tuple:
        """Concrete parameters for one image of (height, width) pixels from its ``draws`` uniforms:
        a tuple of small dataclasses, the same length for every sample of a plan."""
        return ()

    def output_size(self, concrete: tuple, height: int, width: int) -> tuple[int, int]:
        """(height, width) after this step, given its concrete parameters and the input's size: the
        input's, unless the op declares its own (crops and resizes do).

        An op written when the size was read off any concrete item with a height and a width is
        refused here rather than left to keep the input's size unnoticed."""
        sized = next((item for item in concrete if hasattr(item, "height") and hasattr(item, "width")), None)
        if sized is not None:
            raise TypeError(f"op {self.name!r}: its concrete {type(sized).__name__} has a height and a width, but the "
                            f"op does not declare its size: override output_size(concrete, height, width) to return "
                            f"the (height, width) after the op")
        return height, width

    # ---- torchvision
    def torchvision_kernel(self, image: Any, concrete: tuple) -> Any:
        """Apply the concrete parameters to a CHW uint8 tensor (``transforms.v2.functional``)."""
        raise NotImplementedError(f"op {self.name!r} has no torchvision kernel")

    def kernel_on_host(self, params: Mapping[str, Any]) -> bool:
        """Whether :meth:`torchvision_kernel` needs its image in host memory (a PIL kernel): a GPU
        torch tail then brings the whole batch to the host once, not each sample there and back."""
        return False

    def torchvision_transforms(self, params: Mapping[str, Any]) -> list:
        """The ``transforms.v2`` transforms a user writes for this step (parity tests, the bench baseline,
        ``spec.to_torchvision``). :func:`dali_bridge.recipes.from_torchvision` reads a transform back into
        this op by its attributes of the parameters' names (``p`` for ``probability``) and checks that
        this method rebuilds it equal."""
        raise NotImplementedError(f"op {self.name!r} has no transforms.v2 counterpart")

    def torchvision_stage(self, params: Mapping[str, Any]) -> str:
        """What ``dali-bridge show`` lists for this step on the torchvision backend."""
        raise NotImplementedError(f"op {self.name!r} has no torchvision stage")
