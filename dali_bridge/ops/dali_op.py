"""The DALI fragment of an op: the hooks of an op that runs in the DALI graph.

An op that subclasses :class:`DaliOp` adds its fragment to the DALI graph: the per-sample argument
columns it declares by name (:class:`Column`), how it builds them for a batch, and its graph
fragment reading them by name (the stages ``dali-bridge show`` lists and the plain-DALI bench
baseline are facets, :mod:`dali_bridge.ops.facets`). A per-sample op that is not a :class:`DaliOp`
runs, on the DALI backends, as its torchvision kernel in torch right after the graph (the DALI
plan's torch tail), and needs none of this. :class:`GraphContext` is what one walk of the graph's steps shares.

Pure Python at import time, like :mod:`dali_bridge.ops.base`: DALI is imported inside the methods.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from .base import Op, Step

__all__ = ["Column", "DaliOp", "GraphContext", "on_coin_flip"]


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


@dataclass
class GraphContext:
    """What an op's DALI fragment needs besides its columns, shared along one graph.

    ``steps``: the steps the graph runs (the plan's, up to its torch tail); ``device``: the ops' device
    (``cpu`` | ``gpu``); ``position``: the step's place in the plan;
    ``mirror``: a per-sample flip handed to the finish (crop_mirror_normalize's ``mirror``);
    ``window_decoded``: the decoder read only the first step's crop window (its region of interest); not
    so where several views are cut from one whole decode, and the first crop slices its window itself;
    ``side_outputs``: images a step produced beside the main one (a border patch's exact edge
    lines), which the finish treats as images and the pipeline returns after the image — the plan
    allows them only where no step but a flip folded into the finish follows; ``crop``: a centre
    crop handed to the finish (the plain-DALI bench baseline only).
    """
    plan: Any
    steps: Sequence[Step]
    device: str
    resize_methods: dict[int, str]
    position: int = 0
    mirror: Any = None
    side_outputs: list = field(default_factory=list)
    crop: Any = None
    window_decoded: bool = True

    def is_last_step(self) -> bool:
        """The last step of the DALI graph (a plan's torch tail runs after it, see ``DaliPlan.steps``)."""
        return self.position == len(self.steps) - 1


class DaliOp(Op):
    """An op with a DALI graph fragment: the per-sample argument columns it declares by name, how it
    builds them for a batch (``dali_arguments``; the default builds none) and the fragment reading
    them (``dali_graph``, required). The stages ``show`` lists for it are its
    :class:`~dali_bridge.ops.facets.Display` facet, its plain-DALI counterpart its
    :class:`~dali_bridge.ops.facets.DaliBaseline` facet."""

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


def on_coin_flip(changed: Any, images: Any, probability: float, device: str) -> Any:
    """``changed`` where DALI's own coin flip (``fn.random.coin_flip``) comes up with ``probability``,
    else ``images`` (uint8, the same shapes): a probability as a plain-DALI bench baseline writes it."""
    from nvidia.dali import fn, types

    chosen = fn.random.coin_flip(probability=probability, dtype=types.UINT8)
    kept = fn.cast(1 - chosen, dtype=types.UINT8)  # an int constant widens uint8 to int32
    if device == "gpu":
        chosen, kept = chosen.gpu(), kept.gpu()
    return changed * chosen + images * kept  # uint8: exactly one of the two is 1 per sample
