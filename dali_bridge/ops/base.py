"""The op interface, the parameter checkers it re-exports and the plan's op instance.

An :class:`Op` is one registry entry: a frozen dataclass holding what the spec validator reads
(name, :class:`Category`, parameters, defaults, checks, backends) and the op's required core — its
draws and how they become concrete per-sample parameters, its torchvision kernel and its
``transforms.v2`` counterpart. Its DALI graph fragment is :class:`~dali_bridge.ops.dali_op.DaliOp`;
what only some ops answer (their effect on the size and the :class:`ResizeRequest` they make, spec
rules, the stages ``dali-bridge show`` lists, a batched kernel) are the facets of
:mod:`dali_bridge.ops.facets`.
A :class:`Step` is an op instance in a plan: the op itself and its resolved parameters.

Pure Python at import time: torch, torchvision and DALI are imported inside the methods that
need them, so the spec layer can validate anywhere.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Mapping

import numpy as np

# The checkers live in the leaf module below the op layer (the spec layer and the sources use them
# too); the op modules import them from here.
from ..util.checks import Checker, non_finite_problem

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
    """An op of the registry, its required core; subclasses hold one op's behaviour.

    What every op declares: its name, :class:`Category` (given as the member or its string),
    parameters, doc and backends (``primary``: the parameter a scalar shorthand, ``- resize: 256``,
    sets); ``draws`` and :meth:`sample`, torchvision's ``make_params`` driven by the bridge's
    uniforms; :meth:`torchvision_kernel`, the pixel work, given the step's static parameters; and
    :meth:`torchvision_transforms`, the ``transforms.v2`` reference the parity tests compare with.
    An op that runs in the DALI graph is a :class:`~dali_bridge.ops.dali_op.DaliOp` (its fragment);
    any other per-sample op runs, on the DALI backends, as its torchvision kernel right after the
    graph (the plan's torch tail). What only some ops answer (their effect on the size, spec rules,
    the stages ``show`` lists, a batched kernel, a plain-DALI baseline) are optional facets
    (:mod:`dali_bridge.ops.facets`), each with defaults.
    """
    name: str
    category: Category
    params: tuple[Param, ...]
    doc: str
    backends: tuple[str, ...] = ALL_BACKENDS
    primary: str | None = None

    draws: ClassVar[int] = 0       # uniforms drawn per sample (see sampling.draws)
    transform: ClassVar[str] = ""  # the transforms.v2 transform it matches (from_torchvision maps it here)
    # Its output jumps where its input crosses a threshold (posterize, solarize, equalize): a level
    # of difference before it (DALI's resize under parity: fast) can become many after it, so the
    # parity tests bound how many pixels differ rather than by how much (tests/backends/test_parity.py).
    discontinuous: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if isinstance(self.category, str) and self.category in Category._value2member_map_:
            object.__setattr__(self, "category", Category(self.category))  # else op_problems names it

    @property
    def random(self) -> bool:
        return self.draws > 0

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def sample(self, params: Mapping[str, Any], u: np.ndarray | None, height: int, width: int) -> tuple:
        """Concrete parameters for one image of (height, width) pixels from its ``draws`` uniforms:
        a tuple of small dataclasses, the same length for every sample of a plan."""
        return ()

    def torchvision_kernel(self, image: Any, concrete: tuple, params: Mapping[str, Any]) -> Any:
        """Apply one sample's concrete parameters to a CHW uint8 tensor (``transforms.v2.functional``);
        ``params``: the step's static parameters, the same for every sample."""
        raise NotImplementedError(f"op {self.name!r} has no torchvision kernel")

    def torchvision_transforms(self, params: Mapping[str, Any]) -> list:
        """The ``transforms.v2`` transforms a user writes for this step (parity tests, the bench baseline,
        ``dali_bridge.to_torchvision(spec)``). :func:`dali_bridge.recipes.from_torchvision` reads a transform back into
        this op by its attributes of the parameters' names (``p`` for ``probability``) and checks that
        this method rebuilds it equal."""
        raise NotImplementedError(f"op {self.name!r} has no transforms.v2 counterpart")
