"""The op interface, the parameter checkers it re-exports and the plan's op instance.

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

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

# The checkers live in the leaf module below the op layer (the spec layer and the sources use them
# too); the op modules import them from here.
from ..util.checks import Checker, fixed_output_size, non_finite_problem

ALL_BACKENDS = ("dali", "dali-cpu", "torchvision")
INTERPOLATIONS = ("nearest", "bilinear", "bicubic")
DTYPES = ("float32", "float16", "uint8")
LAYOUTS = ("CHW", "HWC")


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


class _Required:
    """The default of a parameter that has none: one object, after pickling too (a plan's steps hold
    their ops, and a plan travels to DataLoader workers started by spawn), so ``is REQUIRED`` holds."""

    def __repr__(self) -> str:
        return "REQUIRED"

    def __reduce__(self) -> str:
        return "REQUIRED"  # pickled by name: unpickling finds this module's one instance


REQUIRED = _Required()


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
        """The op's name."""
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

    ``category``: its :class:`Category` (given as the member or its string). An op that runs in the
    DALI graph is a :class:`~dali_bridge.ops.dali_op.DaliOp` (the DALI hooks); any other per-sample op
    runs, on the DALI backends, as its torchvision kernel right after the graph (the plan's torch tail).
    ``primary`` is the parameter a scalar shorthand
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
    # As the first step, the names of its (anchor, shape) columns of a crop window the decoder reads as
    # its region of interest (a random resized crop): DALI's decoder, and the torchvision backend's
    # window decode (dali_bridge.pipeline.region_decode), which decodes only that window; None when it has none.
    window_columns: ClassVar[tuple[str, str] | None] = None
    # DALI: runs as its torchvision kernel in torch on the loader's device right after the DALI graph,
    # which then ends before the first such step (the plan's torch tail; each op's docstring says why).
    # True for every op but a DaliOp.
    torch_after_dali: ClassVar[bool] = True
    # A key this op lacks but a user coming from another library may try, and what to write instead
    # (added to the unknown-key error).
    key_hints: ClassVar[Mapping[str, str]] = {}

    def __post_init__(self) -> None:
        if isinstance(self.category, str) and self.category in Category._value2member_map_:
            object.__setattr__(self, "category", Category(self.category))  # else op_problems names it

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

    def output_dtype(self, params: Mapping[str, Any]) -> str | None:
        """The dtype of the images this op outputs, from the spec's parameters, for an op that
        converts it (the finish); None for an op that keeps the dtype."""
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

    def batch_kernel(self, images: Sequence[Any], concrete: Sequence[tuple]) -> Any:
        """:meth:`torchvision_kernel` on a whole batch (CHW uint8 images: a list, or an N x C x H x W
        tensor) in as few calls as the op can, with the same pixels; ``concrete``: each sample's.
        None: the op has no batched kernel (or not for these images), and a DALI backend's torch tail
        runs :meth:`torchvision_kernel` per sample (:mod:`dali_bridge.backends.dali.tail`)."""
        return None

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
