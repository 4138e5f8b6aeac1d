"""Spec → plan: the backend-neutral list of op instances, and where each runs on each backend.

The plan lowers every op of the spec through its registry entry (``crop_mirror_normalize`` →
centre crop, flip, normalize), with sizes in (height, width) form, and ends the per-sample steps
with the finish (dtype, normalisation, layout). :func:`placement` answers, as plain data, which
implementation and device every step gets on a backend — each op lists its own stages; the DALI
graph builder reads the devices, ``dali-bridge show`` prints them, tests check them without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from .ops import OPS, fixed_output_size, unsupported_options
from .ops.base import GraphContext, Step
from .ops.exact_resize import METHODS
from .ops.finish import IMPLICIT_FINISH, Finish, Normalize
from .spec import PipelineSpec

__all__ = ["Finish", "Placed", "Plan", "Step", "build_plan", "fused_mirror", "placement", "resize_method",
           "resize_methods", "roi_decode", "unsupported_ops"]


@dataclass(frozen=True)
class Plan:
    """``ops``: every op instance in order — the per-sample steps, the finish, then (when such ops
    exist) ops after normalisation and batch-level ops (see :mod:`dali_bridge.ops`)."""
    ops: tuple[Step, ...]
    output_size: tuple[int, int]  # (height, width) in pixels
    decode_device: str            # as declared: mixed | cpu
    parity: str = "exact"         # exact: DALI reproduces torchvision's resize borders; fast: plain fn.resize

    @cached_property  # a plan never changes; executors ask per sample
    def finish_position(self) -> int:
        return next(n for n, step in enumerate(self.ops) if step.op.kind == "finish")

    @cached_property
    def steps(self) -> tuple[Step, ...]:
        """The per-sample steps on uint8 images, before the finish."""
        return self.ops[:self.finish_position]

    @cached_property
    def post_finish(self) -> tuple[tuple[int, Step], ...]:
        """(position in ``ops``, step) of each op after the finish: per-sample ops on the float images,
        then batch-level ops. The loader applies them (:mod:`dali_bridge.post_finish`); no executor sees them."""
        return tuple((n, step) for n, step in enumerate(self.ops) if n > self.finish_position)

    @cached_property
    def dali_steps(self) -> tuple[Step, ...]:
        """The steps a DALI graph runs: those before the first whose op runs in torch after DALI.

        Under ``parity: exact`` a torch tail starts earlier, at the last resize before it: DALI's
        resize rounds up to one level off torchvision's, and the tail's ops are not continuous in
        their input (a posterize bit, a solarize threshold, an equalize mapping, a hue round trip
        turn one level into up to 255), so the resize runs as torchvision's kernel too and the
        tail's pixels equal torchvision's. ``parity: fast`` keeps the resize in DALI.
        """
        tail = next((n for n, step in enumerate(self.steps) if step.op.torch_after_dali), len(self.steps))
        if tail < len(self.steps) and self.parity == "exact":
            tail = next((n for n in range(tail - 1, -1, -1) if self.steps[n].op.resamples), tail)
        return self.steps[:tail]

    @property
    def torch_tail(self) -> tuple[Step, ...]:
        """The steps DALI backends run after the graph, as torchvision kernels in torch."""
        return self.steps[len(self.dali_steps):]

    @property
    def finish_step(self) -> Step:
        return self.ops[self.finish_position]

    @property
    def dali_finish_step(self) -> Step:
        """The DALI graph's last operator: the finish, or before a torch tail a uint8 CHW one that only
        lays the images out for the torchvision kernels (it still folds a last flip, finishes border lines)."""
        if not self.torch_tail:
            return self.finish_step
        return OPS["normalize"].lower(dict(IMPLICIT_FINISH), self.finish_step.op_index)[0]

    @property
    def finish(self) -> Finish:
        return Normalize.finish(self.finish_step.params)

    @property
    def random(self) -> bool:
        return any(step.random for step in self.ops)

    def output_shape(self, batch: int) -> tuple[int, ...]:
        h, w = self.output_size
        return (batch, 3, h, w) if self.finish.layout == "CHW" else (batch, h, w, 3)


def build_plan(spec: PipelineSpec) -> Plan:
    """Lower a validated spec into a plan."""
    ops: list[Step] = []
    size: tuple[int, int] | None = None
    for index, op in enumerate(spec.ops):
        definition = OPS[op.name]
        ops += definition.lower(dict(op.params), index)
        value = op.params.get(definition.size_param) if definition.size_param else None
        if value is not None and not (definition.size_rule == "resize" and isinstance(value, int)):
            size = fixed_output_size(value)  # a shorter-side resize leaves the size open
    if not any(step.op.kind == "finish" for step in ops):
        ops += OPS["normalize"].lower(dict(IMPLICIT_FINISH), len(spec.ops))
    if size is None:
        raise ValueError("plan has no fixed output size (the spec validator should have caught this)")
    return Plan(tuple(ops), size, spec.decode_device, spec.parity)


@dataclass(frozen=True)
class Placed:
    """One stage of a backend's execution: what it does, the implementation, and the device."""
    stage: str
    implementation: str
    device: str


def unsupported_ops(spec: PipelineSpec, backend: str) -> list[tuple[int, str, tuple[str, ...]]]:
    """(op position, op name, backends that support it) for every op ``backend`` cannot run.

    An op whose options only some backends reproduce is named with them (``resize with
    interpolation bicubic with antialias false (...)``, see :meth:`~dali_bridge.ops.Op.unsupported_options`).
    """
    found = [(i, op.name, OPS[op.name].backends) for i, op in enumerate(spec.ops)
             if backend not in OPS[op.name].backends]
    for i, op in enumerate(spec.ops):
        found += [(i, f"{op.name} with {what}", backends) for what, backends in unsupported_options(op.name, op.params)
                  if backend not in backends and backend in OPS[op.name].backends]
    return sorted(found, key=lambda item: item[0])


def resize_method(interpolation: str, antialias: bool) -> str:
    """How the DALI graph reproduces torchvision's F.resize on uint8 images (:mod:`dali_bridge.ops.exact_resize`).

    ``nearest`` (torchvision ignores antialias for nearest): two half-step-shifted resizes per
    axis blended by a mask; ``linear`` (bilinear, no antialias): plain fn.resize; ``filter_1pass``
    (bilinear, antialias): border renormalisation, one 2-D pass; ``filter_2pass`` (bicubic,
    antialias): renormalised width then height pass, clamped in between; ``antialias``: plain
    antialiased fn.resize, chosen by :func:`resize_methods` where a crop hides the border.
    Bicubic without antialias has none (see the resizing ops' ``unsupported_options``).
    """
    if interpolation == "nearest":
        return "nearest"
    if not antialias:
        if interpolation == "bilinear":
            return "linear"
        raise ValueError(f"{interpolation} without antialias has no torchvision-exact DALI equivalent")
    return "filter_1pass" if interpolation == "bilinear" else "filter_2pass"


# Output pixels next to each border whose bilinear antialiasing filter reaches past the image:
# 1 when downscaling ((x + 0.5) * s - s < 0 only for x = 0, likewise at the far end); none that
# matter when upscaling (the truncated radius-1 filter equals the clamped one). One more for safety.
_BILINEAR_BORDER = 2


def resize_methods(plan: Plan) -> dict[int, str]:
    """Step index of each resizing step (its op ``resamples``) → its :func:`resize_method` on DALI.

    A bilinear antialiased resize to a shorter side, cropped at the centre to at most that side
    minus 2 x 2 pixels (the shipped validation pipeline: 256 then 224), never shows its border
    rows, where alone the renormalisation changes pixels: it runs as a plain antialiased
    fn.resize (``antialias``), without the cost of the exact border. One to a fixed size of at
    least 3 x 3 that is the last step (a final flip folds into crop_mirror_normalize; the shipped
    training pipeline) runs plain too, with only its outermost rows and columns computed the
    exact way and written over the batch's (``border_patch``).
    """
    methods: dict[int, str] = {}
    steps = plan.dali_steps
    for n, step in enumerate(steps):
        if not step.op.resamples:
            continue
        p = step.params
        method = resize_method(p["interpolation"], p["antialias"])
        if plan.parity == "fast" and method in ("filter_1pass", "filter_2pass"):
            method = "antialias"  # DALI's own border handling: plain fn.resize, up to a few levels off at the edges
        following = steps[n + 1] if n + 1 < len(steps) else None
        shorter_side = p.get("shorter_side", False)
        if (method == "filter_1pass" and shorter_side and p["max_size"] is None and following is not None
                and following.op.hides_border_within
                and max(following.params["size"]) <= p["size"][0] - 2 * _BILINEAR_BORDER):
            method = "antialias"
        last_step = following is None or (n + 2 == len(steps) and fused_mirror(plan))
        if method == "filter_1pass" and not shorter_side and last_step and min(p["size"]) >= 3:
            method = "border_patch"
        methods[n] = method
    return methods


def roi_decode(plan: Plan) -> bool:
    """DALI decodes only the crop window when the first step's op crops a window (random resized crop)."""
    return bool(plan.dali_steps) and plan.dali_steps[0].op.decodes_window


def fused_mirror(plan: Plan) -> bool:
    """A last step that folds into DALI's crop_mirror_normalize (a horizontal flip)."""
    return bool(plan.dali_steps) and plan.dali_steps[-1].op.folds_into_finish


def graph_context(plan: Plan, device: str) -> GraphContext:
    """The context the DALI graph builder and :func:`placement` walk the plan with."""
    return GraphContext(plan=plan, device=device, resize_methods=resize_methods(plan))


def placement(plan: Plan, backend: str, cuda: bool = False) -> list[Placed]:
    """Where each stage runs on ``backend``.

    ``dali``: decode ``mixed`` (nvJPEG; ``cpu`` when the spec says ``decode.device: cpu``), every
    other op on ``gpu``. ``dali-cpu``: everything on ``cpu``. ``torchvision``: decode and the steps
    in DataLoader worker processes on the CPU, finishing on the batch — on ``cuda`` when the loader
    targets a GPU (``cuda=True``), else in the main process.
    """
    if backend in ("dali", "dali-cpu"):
        return _dali_placement(plan, gpu=backend == "dali")
    if backend == "torchvision":
        stages = [Placed("read", "DataLoader worker: file read", "cpu"),
                  Placed("decode", "torchvision.io.decode_image (RGB, EXIF orientation)", "cpu")]
        stages += [Placed(step.kind, step.op.torchvision_stage(step.params), "cpu") for step in plan.steps]
        stages.append(Placed("batch", "uint8 batch through worker queue", "cpu"))
        stages.append(Placed("finish", plan.finish_step.op.torchvision_stage(plan.finish_step.params),
                             "cuda" if cuda else "cpu"))
        return stages + _post_finish_placement(plan, "cuda" if cuda else "cpu")
    raise ValueError(f"unknown backend {backend!r}")


def _dali_placement(plan: Plan, gpu: bool) -> list[Placed]:
    op_device = "gpu" if gpu else "cpu"
    decode_device = ("mixed" if plan.decode_device == "mixed" else "cpu") if gpu else "cpu"
    stages = [Placed("read", "fn.external_source (bridge-owned order)", "cpu")]
    if roi_decode(plan):
        stages.append(Placed("decode", "fn.decoders.image_slice (ROI decode of the crop window)", decode_device))
    else:
        stages.append(Placed("decode", "fn.decoders.image", decode_device))
    if gpu and decode_device == "cpu":
        stages.append(Placed("to_gpu", ".gpu()", "gpu"))
    ctx = graph_context(plan, op_device)
    for ctx.position, step in enumerate(plan.dali_steps):
        stages += [Placed(stage, impl, op_device) for stage, impl in step.op.dali_stages(step, ctx)]
    finish = plan.dali_finish_step
    stages += [Placed(stage, impl, op_device) for stage, impl in finish.op.dali_stages(finish, ctx)]
    for method in sorted(set(ctx.resize_methods.values())):  # stages a resize method adds after the finish
        stages += [Placed(stage, impl, device or op_device) for stage, impl, device in
                   METHODS[method].finish_stages("cuda" if gpu else "cpu")]
    if plan.torch_tail:  # per sample on the loader's device (DALI's own by default), then the finish on the batch
        tail_device = "cuda" if gpu else "cpu"
        stages += [Placed(step.kind, f"torch after DALI: {step.op.torchvision_stage(step.params)}", tail_device)
                   for step in plan.torch_tail]
        finish_stage = plan.finish_step.op.torchvision_stage(plan.finish_step.params)
        stages.append(Placed("finish", f"torch after DALI: {finish_stage}", tail_device))
    return stages + _post_finish_placement(plan, "cuda" if gpu else "cpu")


def _post_finish_placement(plan: Plan, device: str) -> list[Placed]:
    """The ops after the finish: torch on the finished batch, on the loader's device, for every backend."""
    return [Placed(step.kind, step.op.stage(step.params), device) for _, step in plan.post_finish]
