"""Where each stage of a plan runs on each backend, as plain data (:class:`~dali_bridge.pipeline.plan.Placed`).

``dali-bridge show`` prints it and tests check it without a GPU. It sits above the plan and the
backends' planning: the plan is backend-neutral, and the DALI backends' stages are DALI's own
decision (:meth:`~dali_bridge.backends.dali.plan.DaliPlan.stages`).
"""
from __future__ import annotations

from ..backends.dali.plan import dali_plan
from ..pipeline.plan import Placed, Plan
from ..ops.facets import Display, facet

__all__ = ["placement"]


def placement(plan: Plan, backend: str, cuda: bool = False, *, executor: str = "processes") -> list[Placed]:
    """Where each stage runs on ``backend``.

    ``dali``: decode ``mixed`` (nvJPEG; ``cpu`` when the spec says ``decode.device: cpu``), every
    other op on ``gpu``. ``dali-cpu``: everything on ``cpu``. ``torchvision``: decode and the steps
    in DataLoader worker processes on the CPU, finishing on the batch — on ``cuda`` when the loader
    targets a GPU (``cuda=True``), else in the main process; under ``executor="threads"`` (the
    spec's ``loader.executor``) the read and the steps run in threads of the loader's process, under
    ``executor="ray"`` in Ray tasks on a cluster's CPU nodes (the batch's uint8 pixels come back
    through Ray's object store).
    """
    if backend in ("dali", "dali-cpu"):
        device = "cuda" if backend == "dali" else "cpu"
        return [Placed(*stage) for stage in dali_plan(plan).stages(gpu=backend == "dali")] + \
            _post_finish_placement(plan, device)
    if backend == "torchvision":
        where = {"threads": "loader thread", "ray": "Ray task"}.get(executor, "DataLoader worker")
        batch = {"threads": "uint8 batch in the loader's process",
                 "ray": "uint8 batch through Ray's object store"}.get(executor, "uint8 batch through worker queue")
        stages = [Placed("read", f"{where}: file read", "cpu"),
                  Placed("decode", "torchvision.io.decode_image (RGB, EXIF orientation)", "cpu")]
        stages += [Placed(step.name, facet(step.op, Display).torchvision_stage(step.params), "cpu")
                   for step in plan.steps]
        stages.append(Placed("batch", batch, "cpu"))
        stages.append(Placed("finish", facet(plan.finish_step.op, Display).torchvision_stage(plan.finish_step.params),
                             "cuda" if cuda else "cpu"))
        return stages + _post_finish_placement(plan, "cuda" if cuda else "cpu")
    raise ValueError(f"unknown backend {backend!r}")


def _post_finish_placement(plan: Plan, device: str) -> list[Placed]:
    """The ops after the finish: torch on the finished batch, on the loader's device, for every backend."""
    return [Placed(step.name, step.op.stage(step.params), device) for _, step in plan.post_finish]
