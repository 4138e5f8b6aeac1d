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

from .backends.dali_plan import dali_plan
from .ops import OPS, unsupported_options
from .ops.base import Category, Step
from .ops.finish import IMPLICIT_FINISH, Finish, Normalize
from .spec import PipelineSpec

__all__ = ["Finish", "Placed", "Plan", "Step", "build_plan", "placement", "unsupported_ops"]


@dataclass(frozen=True)
class Plan:
    """``all_steps``: every step (op instance) in order — the per-sample steps (:attr:`steps`), the
    finish, then (when such ops exist) ops after normalisation and batch-level ops (:attr:`post_finish`,
    see :mod:`dali_bridge.ops`). A step's position in it keys its draws."""
    all_steps: tuple[Step, ...]
    output_size: tuple[int, int]  # (height, width) in pixels
    decode_device: str            # as declared: mixed | cpu
    parity: str = "exact"         # exact: DALI reproduces torchvision's resize borders; fast: plain fn.resize

    @property
    def ops(self) -> tuple[Step, ...]:
        """:attr:`all_steps`, under its older name."""
        return self.all_steps

    @cached_property  # a plan never changes; executors ask per sample
    def finish_position(self) -> int:
        return next(n for n, step in enumerate(self.all_steps) if step.op.category is Category.FINISH)

    @cached_property
    def steps(self) -> tuple[Step, ...]:
        """The per-sample steps on uint8 images, before the finish."""
        return self.all_steps[:self.finish_position]

    @cached_property
    def post_finish(self) -> tuple[tuple[int, Step], ...]:
        """(position in ``all_steps``, step) of each op after the finish: per-sample ops on the float images,
        then batch-level ops. The loader applies them (:mod:`dali_bridge.post_finish`); no executor sees them."""
        return tuple((n, step) for n, step in enumerate(self.all_steps) if n > self.finish_position)

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
            tail = next((n for n in range(tail - 1, -1, -1)
                         if self.steps[n].op.resize_request(self.steps[n].params) is not None), tail)
        return self.steps[:tail]

    @property
    def torch_tail(self) -> tuple[Step, ...]:
        """The steps DALI backends run after the graph, as torchvision kernels in torch."""
        return self.steps[len(self.dali_steps):]

    @property
    def finish_step(self) -> Step:
        return self.all_steps[self.finish_position]

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
        return any(step.random for step in self.all_steps)

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
        size = definition.fixed_size(op.params) or size  # a shorter-side resize leaves the size open
    if not any(step.op.category is Category.FINISH for step in ops):
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


def placement(plan: Plan, backend: str, cuda: bool = False) -> list[Placed]:
    """Where each stage runs on ``backend``.

    ``dali``: decode ``mixed`` (nvJPEG; ``cpu`` when the spec says ``decode.device: cpu``), every
    other op on ``gpu``. ``dali-cpu``: everything on ``cpu``. ``torchvision``: decode and the steps
    in DataLoader worker processes on the CPU, finishing on the batch — on ``cuda`` when the loader
    targets a GPU (``cuda=True``), else in the main process.
    """
    if backend in ("dali", "dali-cpu"):
        device = "cuda" if backend == "dali" else "cpu"
        return [Placed(*stage) for stage in dali_plan(plan).stages(gpu=backend == "dali")] + \
            _post_finish_placement(plan, device)
    if backend == "torchvision":
        stages = [Placed("read", "DataLoader worker: file read", "cpu"),
                  Placed("decode", "torchvision.io.decode_image (RGB, EXIF orientation)", "cpu")]
        stages += [Placed(step.name, step.op.torchvision_stage(step.params), "cpu") for step in plan.steps]
        stages.append(Placed("batch", "uint8 batch through worker queue", "cpu"))
        stages.append(Placed("finish", plan.finish_step.op.torchvision_stage(plan.finish_step.params),
                             "cuda" if cuda else "cpu"))
        return stages + _post_finish_placement(plan, "cuda" if cuda else "cpu")
    raise ValueError(f"unknown backend {backend!r}")


def _post_finish_placement(plan: Plan, device: str) -> list[Placed]:
    """The ops after the finish: torch on the finished batch, on the loader's device, for every backend."""
    return [Placed(step.name, step.op.stage(step.params), device) for _, step in plan.post_finish]
