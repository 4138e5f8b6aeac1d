"""The optional facets of an op: what only some ops answer, each a small mixin with its defaults.

:class:`~dali_bridge.ops.base.Op` holds the required core (parameters and checks, draws, the torch
kernel, the parity reference) and :class:`~dali_bridge.ops.dali_op.DaliOp` the DALI fragment. An op
that answers more subclasses a facet beside it, in its own module, and overrides what differs:

* :class:`Sizing`: its effect on the image size and what it asks of a backend's planner (the resize
  it runs, the centre it keeps, a crop window a decoder reads, a flip the finish takes, the dtype
  the finish outputs);
* :class:`SpecRules`: rules across parameters, options only some backends reproduce, the steps it
  lowers to, a parameter-dependent draw count, hints for keys users try;
* :class:`Display`: the stages ``dali-bridge show`` lists for it;
* :class:`Batching`: its kernel on a whole batch, and whether the kernel needs the host;
* :class:`DaliBaseline`: the plain DALI a user writes for it (the bench baseline).

A consumer asks an op for a facet with :func:`facet`: the op itself when it subclasses the facet,
else the facet's defaults bound to the op, so no consumer tests which facets an op has and no op
writes a facet it does not need. Pure Python at import time, like :mod:`dali_bridge.ops.base`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence, TypeVar

from ..util.checks import fixed_output_size

if TYPE_CHECKING:
    from .base import ResizeRequest, Step
    from .dali_op import GraphContext

__all__ = ["Batching", "DaliBaseline", "Display", "Sizing", "SpecRules", "facet"]

FacetT = TypeVar("FacetT")


class _DefaultsOf:
    """A facet's defaults for an op that does not subclass it: what the facet declares (its class
    attributes, its methods bound to this object) read from the facet, anything else (``name``,
    ``draws``) from the op — what the op would answer were the facet mixed in."""

    def __init__(self, op: Any, facet_class: type) -> None:
        self.op, self._facet_class = op, facet_class

    def __getattr__(self, name: str) -> Any:
        if not hasattr(self._facet_class, name):
            return getattr(self.op, name)
        value = getattr(self._facet_class, name)
        return value.__get__(self) if callable(value) and hasattr(value, "__get__") else value


def facet(op: Any, facet_class: type[FacetT]) -> FacetT:
    """``op`` as a ``facet_class``: the op itself when it subclasses the facet, else the defaults."""
    return op if isinstance(op, facet_class) else _DefaultsOf(op, facet_class)  # type: ignore[return-value]


def _op_of(answering: Any) -> Any:
    """The op a facet method answers for: itself, or the op behind a facet's defaults."""
    return answering.op if isinstance(answering, _DefaultsOf) else answering


class Sizing:
    """The size facet: how an op changes the image size and what it asks of a backend's planner.

    ``size_param``/``size_rule`` tell the validator how the op sets the output size: ``output`` (that
    size), ``resize`` (an int is a shorter side) or ``crop`` (that size, which must fit what comes
    before); ``None`` when the size stays. ``window_columns``: as the first step, the names of its
    (anchor, shape) columns of a crop window the decoder reads as its region of interest (a random
    resized crop): DALI's decoder, and the torchvision backend's window decode
    (:mod:`dali_bridge.pipeline.region_decode`). ``folds_into_finish``: on DALI, a last step
    crop_mirror_normalize takes (a flip).
    """
    size_param: ClassVar[str | None] = None
    size_rule: ClassVar[str | None] = None
    window_columns: ClassVar[tuple[str, str] | None] = None
    folds_into_finish: ClassVar[bool] = False

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

    def output_size(self, concrete: tuple, height: int, width: int) -> tuple[int, int]:
        """(height, width) after this step, given its concrete parameters and the input's size: the
        input's, unless the op declares its own (crops and resizes do).

        An op written when the size was read off any concrete item with a height and a width is
        refused here rather than left to keep the input's size unnoticed."""
        sized = next((item for item in concrete if hasattr(item, "height") and hasattr(item, "width")), None)
        if sized is not None:
            raise TypeError(f"op {getattr(self, 'name', '?')!r}: its concrete {type(sized).__name__} has a height "
                            f"and a width, but the op does not declare its size: override output_size(concrete, "
                            f"height, width) to return the (height, width) after the op")
        return height, width

    def resize_request(self, params: Mapping[str, Any]) -> ResizeRequest | None:
        """The resize this step runs (a backend's planner chooses how), or None for an op that
        does not resample."""
        return None

    def kept_centre(self, params: Mapping[str, Any]) -> tuple[int, int] | None:
        """The (height, width) of the middle of its input a centre crop keeps (its border hidden);
        None for every other op."""
        return None

    def output_dtype(self, params: Mapping[str, Any]) -> str | None:
        """The dtype of the images this op outputs, from the spec's parameters, for an op that
        converts it (the finish); None for an op that keeps the dtype."""
        return None


class SpecRules:
    """The spec facet: what the validator and the planner ask of an op beyond its parameters.

    ``key_hints``: a key this op lacks but a user coming from another library may try, and what to
    write instead (added to the unknown-key error).
    """
    key_hints: ClassVar[Mapping[str, str]] = {}

    def extra_check(self, params: dict) -> list[tuple[str, str]]:
        """Problems across parameters: (parameter, message)."""
        return []

    def unsupported_options(self, params: Mapping[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
        """Option combinations only some backends reproduce: ``(what, those backends)``."""
        return []

    def lower(self, params: dict[str, Any], op_index: int) -> list[Step]:
        """The plan steps of this op (sizes as (height, width) tuples): one step of the op itself,
        unless it is compound or stands for another op's algorithm (``Step(other, params, op_index)``)."""
        from .base import Step

        return [Step(_op_of(self), dict(params), op_index)]

    def draw_count(self, params: Mapping[str, Any]) -> int:
        """Uniforms per sample for these parameters: ``draws``, unless a parameter sets the count."""
        return self.draws  # type: ignore[attr-defined]


class Display:
    """The display facet: what ``dali-bridge show`` lists for a step. The defaults name the op's
    class and method; the built-in ops name the functions and DALI operators they call."""

    def torchvision_stage(self, params: Mapping[str, Any]) -> str:
        """What ``dali-bridge show`` lists for this step on the torchvision backend."""
        return f"{type(_op_of(self)).__name__}.torchvision_kernel"

    def dali_stages(self, step: Step, ctx: GraphContext) -> list[tuple[str, str]]:
        """(stage, implementation) of each DALI operator the fragment adds, in graph order."""
        return [(step.name, f"{type(_op_of(self)).__name__}.dali_graph")]


class Batching:
    """The batching facet: a torch kernel on a whole batch, and where the per-sample kernel runs."""

    def batch_kernel(self, images: Sequence[Any], concrete: Sequence[tuple], params: Mapping[str, Any]) -> Any:
        """``torchvision_kernel`` on a whole batch (CHW uint8 images: a list, or an N x C x H x W
        tensor) in as few calls as the op can, with the same pixels; ``concrete``: each sample's.
        None: the op has no batched kernel (or not for these images), and a DALI backend's torch tail
        runs ``torchvision_kernel`` per sample (:mod:`dali_bridge.backends.dali.tail`)."""
        return None

    def kernel_on_host(self, params: Mapping[str, Any]) -> bool:
        """Whether ``torchvision_kernel`` needs its image in host memory (a PIL kernel): a GPU
        torch tail then brings the whole batch to the host once, not each sample there and back."""
        return False


class DaliBaseline:
    """The plain DALI a user writes for an op, with DALI's own random draws: the bench baseline
    (:mod:`dali_bridge.bench.baselines`). An op without it is left out of that baseline."""

    def dali_baseline_decode(self, step: Step, encoded: Any, decode_device: str, ctx: GraphContext) -> Any:
        """As the first step of the plain-DALI bench baseline: a decoder doing this step too, or None."""
        return None

    def dali_baseline(self, step: Step, images: Any, ctx: GraphContext) -> Any:
        """The plain DALI a user writes for this step (DALI's own random draws)."""
        raise NotImplementedError(f"op {getattr(self, 'name', '?')!r} has no plain DALI counterpart")
