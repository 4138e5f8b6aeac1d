"""DALI's planning of a plan: how each resize runs, whether the decoder crops, where a flip folds,
and the stages ``dali-bridge show`` lists — computed once into a frozen :class:`DaliPlan`.

The plan (:mod:`dali_bridge.pipeline.plan`) says what runs; this module says how the DALI graph runs it.
It reads no op's parameters: an op declares what the planner needs — the resize it asks for
(:meth:`~dali_bridge.ops.facets.Sizing.resize_request`), the centre it keeps
(:meth:`~dali_bridge.ops.facets.Sizing.kept_centre`), the crop window columns a decoder can read
(``window_columns``), a flip the finish takes (``folds_into_finish``). Pure Python: the graph builder
(:mod:`dali_bridge.backends.dali.executor`) and the placement (:func:`dali_bridge.loader.placement.placement`)
both read the one value, so neither imports DALI to plan.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import TYPE_CHECKING, Mapping

from ...ops.registry import OPS
from ...ops.base import ResizeRequest, Step
from ...ops.dali_op import DaliOp, GraphContext
from ...ops.exact_resize import METHODS
from ...ops.finish import IMPLICIT_FINISH
from ...ops.facets import Display, Sizing, SpecRules, facet

if TYPE_CHECKING:
    from ...pipeline.plan import Plan

__all__ = ["DaliPlan", "dali_plan", "graph_context", "resize_method", "resize_methods"]

# Output pixels next to each border whose bilinear antialiasing filter reaches past the image:
# 1 when downscaling ((x + 0.5) * s - s < 0 only for x = 0, likewise at the far end); none that
# matter when upscaling (the truncated radius-1 filter equals the clamped one). One more for safety.
_BILINEAR_BORDER = 2
# The external source's columns of the window a torch tail's first crop keeps (DaliPlan.tail_window_columns).
TAIL_WINDOW_COLUMNS = ("tail.window.anchor", "tail.window.shape")


def resize_method(interpolation: str, antialias: bool) -> str:
    """How the DALI graph reproduces torchvision's F.resize on uint8 images (:mod:`dali_bridge.ops.exact_resize`).

    ``nearest`` (torchvision ignores antialias for nearest): two half-step-shifted resizes per
    axis blended by a mask; ``linear`` (bilinear, no antialias): plain fn.resize; ``filter_1pass``
    (bilinear, antialias): border renormalisation, one 2-D pass; ``filter_2pass`` (bicubic,
    antialias): renormalised width then height pass, clamped in between; ``antialias``: plain
    antialiased fn.resize, chosen by :attr:`DaliPlan.resize_methods` where a crop hides the border.
    ``random`` (bilinear or bicubic drawn per sample) with antialias: ``filter_2pass`` with the filter
    per sample, exact for both (a bilinear filter never overshoots, so the clamp between its passes
    changes nothing). Bicubic without antialias has none (see the resizing ops' ``unsupported_options``).
    """
    if interpolation == "random" and antialias:
        return "filter_2pass"
    if interpolation == "nearest":
        return "nearest"
    if not antialias:
        if interpolation == "bilinear":
            return "linear"
        raise ValueError(f"{interpolation} without antialias has no torchvision-exact DALI equivalent")
    return "filter_1pass" if interpolation == "bilinear" else "filter_2pass"


@dataclass(frozen=True)
class DaliPlan:
    """What the DALI graph of ``plan`` does, computed once (the executor's feeder holds it)."""
    plan: "Plan"

    @cached_property
    def steps(self) -> tuple[Step, ...]:
        """The steps the DALI graph runs: the plan's per-sample steps before the first whose op runs
        in torch after DALI (an op that is not a :class:`~dali_bridge.ops.dali_op.DaliOp`).

        Under ``parity: exact`` a torch tail starts earlier, at the last resize before it: DALI's
        resize rounds up to one level off torchvision's, and the tail's ops are not continuous in
        their input (a posterize bit, a solarize threshold, an equalize mapping, a hue round trip
        turn one level into up to 255), so the resize runs as torchvision's kernel too and the
        tail's pixels equal torchvision's. For the same reason, under ``parity: exact`` a DaliOp that is
        ``discontinuous`` (solarize) after a resize starts a torch tail too. ``parity: fast`` keeps the
        resize in DALI.
        """
        steps = self.plan.steps
        exact = self.plan.parity == "exact"

        def resized_before(n: int) -> bool:
            return any(facet(steps[m].op, Sizing).resize_request(steps[m].params) is not None for m in range(n))

        tail = next((n for n, step in enumerate(steps) if not isinstance(step.op, DaliOp)
                     or (exact and step.op.discontinuous and resized_before(n))), len(steps))
        if tail < len(steps) and exact:
            tail = next((n for n in range(tail - 1, -1, -1)
                         if facet(steps[n].op, Sizing).resize_request(steps[n].params) is not None), tail)
        return steps[:tail]

    @cached_property
    def torch_tail(self) -> tuple[Step, ...]:
        """The per-sample steps the DALI backends run after the graph, as torchvision kernels in torch."""
        return self.plan.steps[len(self.steps):]

    @cached_property
    def finish_step(self) -> Step | None:
        """The DALI graph's last operator: the plan's finish, or before a torch tail a uint8 HWC one (it
        still folds a last flip, finishes border lines). HWC: the tail reads each image as a CHW view of
        HWC memory, as torchvision's decoder gives it, and torchvision's uint8 resize and the PIL
        conversions of timm's policies are cheapest on that; a CHW graph output would be transposed there
        and again on the way to PIL. On a GPU the tail makes the batch CHW contiguous first (one transpose
        on the GPU).

        None when the graph runs no step before a torch tail (a random resized crop before a policy
        under ``parity: exact``): the decoder's output is uint8 HWC already, and a crop_mirror_normalize
        there would only copy every image, which on the CPU costs DALI's threads about as much as the
        window decode itself."""
        if not self.torch_tail:
            return self.plan.finish_step
        if not self.steps:
            return None
        finish = facet(OPS["normalize"], SpecRules)
        return finish.lower(dict(IMPLICIT_FINISH, layout="HWC"), self.plan.finish_step.op_index)[0]

    @cached_property
    def fused_mirror(self) -> bool:
        """A last step that folds into DALI's crop_mirror_normalize (a horizontal flip)."""
        return bool(self.steps) and facet(self.steps[-1].op, Sizing).folds_into_finish

    @cached_property
    def window_columns(self) -> tuple[str, str] | None:
        """The external source's (anchor, shape) columns of the crop window the decoder reads as its
        region of interest (``fn.decoders.image_slice``): the first step's, when its op declares them. None
        for a view (:attr:`~dali_bridge.pipeline.plan.Plan.view`): every view is cut from one whole decode."""
        if self.plan.view is not None:
            return None
        declared = facet(self.steps[0].op, Sizing).window_columns if self.steps else None
        return None if declared is None else (f"0.{declared[0]}", f"0.{declared[1]}")

    def tail_window_columns(self, *, gpu: bool) -> tuple[str, str] | None:
        """The external source's (anchor, shape) columns of the window the decoder reads when the graph
        runs no step and the torch tail's first step crops a window (a random resized crop before a
        policy under ``parity: exact``), else None. On the CPU decoder only (``dali-cpu``), whose window
        decode is a full decode then crop, as for the graph's own first crop; the tail's first step then
        crops the identity window of what was decoded."""
        tail = self.torch_tail
        if gpu or self.plan.view is not None or self.steps or not tail or not facet(tail[0].op, Sizing).window_columns:
            return None
        return TAIL_WINDOW_COLUMNS

    @cached_property
    def resize_methods(self) -> Mapping[int, str]:
        """Step index of each resizing step (one that makes a :class:`ResizeRequest`) → its
        :func:`resize_method` on DALI.

        A bilinear antialiased resize to a shorter side, cropped at the centre to at most that side
        minus 2 x 2 pixels (the shipped validation pipeline: 256 then 224), never shows its border
        rows, where alone the renormalisation changes pixels: it runs as a plain antialiased
        fn.resize (``antialias``), without the cost of the exact border. One to a fixed size of at
        least 3 x 3 that is the last step (a final flip folds into crop_mirror_normalize; the shipped
        training pipeline) runs plain too, with only its outermost rows and columns computed the
        exact way and written over the batch's (``border_patch``).
        """
        methods: dict[int, str] = {}
        for n, step in enumerate(self.steps):
            request = facet(step.op, Sizing).resize_request(step.params)
            if request is not None:
                methods[n] = self._method(n, request)
        return MappingProxyType(methods)

    def _method(self, n: int, request: ResizeRequest) -> str:
        method = resize_method(request.interpolation, request.antialias)
        if self.plan.parity == "fast" and method in ("filter_1pass", "filter_2pass"):
            return "antialias"  # DALI's own border handling: plain fn.resize, up to a few levels off at the edges
        following = self.steps[n + 1] if n + 1 < len(self.steps) else None
        kept = facet(following.op, Sizing).kept_centre(following.params) if following is not None else None
        if (method == "filter_1pass" and request.shorter_side and request.max_size is None and kept is not None
                and max(kept) <= request.size[0] - 2 * _BILINEAR_BORDER):
            return "antialias"
        last_step = following is None or (n + 2 == len(self.steps) and self.fused_mirror)
        if method == "filter_1pass" and not request.shorter_side and last_step and min(request.size) >= 3:
            return "border_patch"
        return method

    def context(self, device: str) -> GraphContext:
        """A fresh context to walk the graph's steps with on ``device`` (``cpu`` | ``gpu``)."""
        return GraphContext(plan=self.plan, steps=self.steps, device=device, resize_methods=self.resize_methods,
                            window_decoded=self.window_columns is not None)

    def stages(self, *, gpu: bool) -> list[tuple[str, str, str]]:
        """(stage, implementation, device) of each stage of the DALI backends, the torch tail included
        (``dali`` when ``gpu``, else ``dali-cpu``); :func:`dali_bridge.loader.placement.placement` lists them."""
        op_device = "gpu" if gpu else "cpu"
        decode_device = ("mixed" if self.plan.decode_device == "mixed" else "cpu") if gpu else "cpu"
        stages = [("read", "fn.external_source (bridge-owned order)", "cpu")]
        if self.window_columns or self.tail_window_columns(gpu=gpu):
            stages.append(("decode", "fn.decoders.image_slice (ROI decode of the crop window)", decode_device))
        elif self.plan.view is not None:
            stages.append(("decode", "fn.decoders.image (once per sample: every view is cut from it)", decode_device))
        else:
            stages.append(("decode", "fn.decoders.image", decode_device))
        if gpu and decode_device == "cpu":
            stages.append(("to_gpu", ".gpu()", "gpu"))
        ctx = self.context(op_device)
        for ctx.position, step in enumerate(self.steps):
            stages += [(stage, impl, op_device) for stage, impl in facet(step.op, Display).dali_stages(step, ctx)]
        finish = self.finish_step
        if finish is not None:
            stages += [(stage, impl, op_device) for stage, impl in facet(finish.op, Display).dali_stages(finish, ctx)]
        torch_device = "cuda" if gpu else "cpu"
        for method in sorted(set(self.resize_methods.values())):  # stages a resize method adds after the finish
            stages += [(stage, impl, device or op_device) for stage, impl, device in
                       METHODS[method].finish_stages(torch_device)]
        if self.torch_tail:  # per sample on the loader's device (DALI's own by default), then the finish
            stages += [(step.name, f"torch after DALI: {facet(step.op, Display).torchvision_stage(step.params)}",
                        torch_device) for step in self.torch_tail]
            finish = self.plan.finish_step
            shown = facet(finish.op, Display).torchvision_stage(finish.params)
            stages.append(("finish", f"torch after DALI: {shown}", torch_device))
        return stages


def dali_plan(plan: "Plan") -> DaliPlan:
    """DALI's planning of ``plan`` (build it once and keep it: its answers are cached on it)."""
    return DaliPlan(plan)


def resize_methods(plan: "Plan") -> dict[int, str]:
    """:attr:`DaliPlan.resize_methods` of ``plan``, as a plain dict."""
    return dict(dali_plan(plan).resize_methods)


def graph_context(plan: "Plan", device: str) -> GraphContext:
    """A context for one walk of ``plan``'s DALI steps (the bench baseline, tests of one fragment)."""
    return dali_plan(plan).context(device)
