"""The op interface, the parameter checkers it re-exports and the plan's op instance.

An :class:`Op` is one registry entry: a frozen dataclass holding what the spec validator reads
(name, parameters, defaults, checks, backends) whose methods answer every other question about
the op — its draws and how they become concrete per-sample parameters, its effect on the image
size, its torchvision kernel and ``transforms.v2`` counterpart, its DALI graph fragment with the
argument columns it declares by name, and the stages ``dali-bridge show`` lists for it.
A :class:`Step` is an op instance in a plan: the op's name and its resolved parameters.

Pure Python at import time: torch, torchvision and DALI are imported inside the methods that
need them, so the spec layer can validate anywhere.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

# The checkers live in the leaf module below the op layer (the spec layer and the sources use them
# too); the op modules import them from here.
from ..checks import (Checker, bool_checker, channels_checker, choice_checker, fixed_output_size,  # noqa: F401
                      int_checker, is_int, is_number, non_finite_problem, optional, probability_checker,
                      range_checker, size_checker)
from ..checks import shown as _shown, type_name as _type_name  # noqa: F401

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


REQUIRED = object()


@dataclass(frozen=True)
class Column:
    """A per-sample argument column an op's DALI fragment reads: its name (unique within the op),
    numpy dtype, and per-sample shape (``None`` where a length varies from sample to sample)."""
    name: str
    dtype: str
    shape: tuple[int | None, ...]

    def problem(self, value: Any) -> str | None:
        """Why a batch's column does not match this declaration, or None (checks the first sample)."""
        first = value[0] if isinstance(value, list) else value[0] if len(value) else None
        if first is None:
            return None
        first = np.asarray(first)
        if first.dtype != np.dtype(self.dtype) or first.ndim != len(self.shape) or any(
                want is not None and got != want for got, want in zip(first.shape, self.shape)):
            return (f"column '{self.name}' declared {self.dtype} {self.shape}, "
                    f"built {first.dtype} {tuple(first.shape)}")
        return None


@dataclass(frozen=True)
class Step:
    """An op instance in a plan: the registry op ``kind`` with its resolved ``params``.

    ``op_index`` is the position, in the spec, of the op that produced it (a compound op lowers
    to several steps with one index; the finish a spec leaves implicit has ``len(spec.ops)``).
    """
    kind: str
    params: dict[str, Any] = field(hash=False)
    op_index: int

    @property
    def op(self) -> "Op":
        return _registry()[self.kind]

    @property
    def random(self) -> bool:
        return self.op.random


_REGISTRY: list[dict[str, "Op"]] = []


def _registry() -> dict[str, "Op"]:
    """The registry's OPS (imported on first use: it imports the op modules, which import this one)."""
    if not _REGISTRY:
        from .registry import OPS

        _REGISTRY.append(OPS)
    return _REGISTRY[0]


@dataclass
class GraphContext:
    """What an op's DALI fragment needs besides its columns, shared along one graph.

    ``device``: the ops' device (``cpu`` | ``gpu``); ``position``: the step's place in the plan;
    ``mirror``: a per-sample flip handed to the finish (crop_mirror_normalize's ``mirror``);
    ``side_outputs``: images a step produced beside the main one (a border patch's exact edge
    lines), which the finish treats as images and the pipeline returns after the image — the plan
    allows them only where no step but a flip folded into the finish follows; ``crop``: a centre
    crop handed to the finish (the plain-DALI bench baseline only).
    """
    plan: Any
    device: str
    resize_methods: dict[int, str]
    position: int = 0
    mirror: Any = None
    side_outputs: list = field(default_factory=list)
    crop: Any = None

    def is_last_step(self) -> bool:
        """The last step of the DALI graph (a plan's torch tail runs after it, see ``Plan.dali_steps``)."""
        return self.position == len(self.plan.dali_steps) - 1


@dataclass(frozen=True)
class Op:
    """An op of the registry; subclasses hold one op's behaviour.

    ``kind``: ``geometry`` moves pixels (and may change the size), ``pixel`` changes values in
    place, ``finish`` converts dtype/layout and normalises (last of the per-sample ops on uint8
    images), ``compound`` lowers to several plan steps; ``after_finish`` (per-sample, on the float
    images) and ``batch`` (on the whole batch) run after the finish
    (:mod:`dali_bridge.ops.after_finish`). ``primary`` is the parameter a scalar shorthand
    (``- resize: 256``) sets. ``size_param``/``size_rule`` tell the validator how the op sets
    the output size: ``output`` (that size), ``resize`` (an int is a shorter side) or ``crop``
    (that size, which must fit what comes before); ``None`` when the size stays.
    """
    name: str
    kind: str
    params: tuple[Param, ...]
    doc: str
    backends: tuple[str, ...] = ALL_BACKENDS
    primary: str | None = None
    size_param: str | None = None
    size_rule: str | None = None

    draws: ClassVar[int] = 0                  # uniforms drawn per sample (see sampling.draws)
    transform: ClassVar[str] = ""             # the transforms.v2 transform it matches (from_torchvision maps it here)
    folds_into_finish: ClassVar[bool] = False  # DALI: a last step given to crop_mirror_normalize
    decodes_window: ClassVar[bool] = False     # DALI: as the first step, its crop is the decoder's ROI
    resamples: ClassVar[bool] = False          # runs a resize (plan.resize_methods chooses how)
    hides_border_within: ClassVar[bool] = False  # a centre crop: keeps only the middle of its input
    # DALI: runs as its torchvision kernel in torch on the loader's device right after the DALI graph,
    # which then ends before the first such step (the plan's torch tail; each op's docstring says why).
    torch_after_dali: ClassVar[bool] = False

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
        return [Step(self.name, dict(params), op_index)]

    # ---- per sample: pure numpy
    def draw_count(self, params: Mapping[str, Any]) -> int:
        """Uniforms per sample for these parameters: ``draws``, unless a parameter sets the count."""
        return self.draws

    def sample(self, params: Mapping[str, Any], u: np.ndarray | None, height: int, width: int) -> tuple:
        """Concrete parameters for one image of (height, width) pixels from its ``draws`` uniforms:
        a tuple of small dataclasses, the same length for every sample of a plan."""
        return ()

    def output_size(self, concrete: tuple, height: int, width: int) -> tuple[int, int]:
        """(height, width) after this step; crops and resizes give theirs."""
        for item in reversed(concrete):
            if hasattr(item, "height") and hasattr(item, "width"):
                return item.height, item.width
        return height, width

    # ---- torchvision
    def torchvision_kernel(self, image: Any, concrete: tuple) -> Any:
        """Apply the concrete parameters to a CHW uint8 tensor (``transforms.v2.functional``)."""
        raise NotImplementedError(f"op {self.name!r} has no torchvision kernel")

    def batch_kernel(self, images: Sequence[Any], concrete: Sequence[tuple]) -> Any:
        """:meth:`torchvision_kernel` on a whole batch (CHW uint8 images: a list, or an N x C x H x W
        tensor) in as few calls as the op can, with the same pixels; ``concrete``: each sample's.
        None: the op has no batched kernel (or not for these images), and a DALI backend's torch tail
        runs :meth:`torchvision_kernel` per sample (:mod:`dali_bridge.backends.tail`)."""
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

    # ---- DALI
    def dali_columns(self, step: Step, ctx: GraphContext) -> list[Column]:
        """The per-sample argument columns the fragment reads, declared by name."""
        return []

    def dali_arguments(self, step: Step, concrete: Sequence[tuple], sizes: Sequence[tuple[int, int]],
                       ctx: GraphContext) -> dict[str, Any]:
        """The batch's columns by name: an array with the batch first, or a list of per-sample arrays.
        ``concrete``: each sample's :meth:`sample`; ``sizes``: each sample's input (height, width)."""
        return {}

    def dali_graph(self, step: Step, images: Any, columns: Mapping[str, Any], ctx: GraphContext) -> Any:
        """Add the step to the DALI graph; ``columns`` maps the declared names to DataNodes."""
        raise NotImplementedError(f"op {self.name!r} has no DALI graph fragment")

    def dali_stages(self, step: Step, ctx: GraphContext) -> list[tuple[str, str]]:
        """(stage, implementation) of each DALI operator the fragment adds, in graph order."""
        raise NotImplementedError(f"op {self.name!r} has no DALI stages")

    def dali_baseline_decode(self, step: Step, encoded: Any, decode_device: str, ctx: GraphContext) -> Any:
        """As the first step of the plain-DALI bench baseline: a decoder doing this step too, or None."""
        return None

    def dali_baseline(self, step: Step, images: Any, ctx: GraphContext) -> Any:
        """The plain DALI a user writes for this step (DALI's own random draws): the bench baseline."""
        raise NotImplementedError(f"op {self.name!r} has no plain DALI counterpart")
