"""A pipeline with views on the DALI backends: one decoder output feeding each view's branch of the
graph, and each view's batch handed over (after its torch tail where it has one) in output order.

Each view is a plan of its own (:attr:`~dali_bridge.pipeline.plan.Plan.views`) with its own
:class:`~dali_bridge.backends.dali.feed.ArgumentColumns`; the external source carries the encoded
images once, then every view's columns under ``<view>/<column>``. The decoder decodes each image
whole, once (a view's first crop slices its window from it:
:attr:`~dali_bridge.ops.dali_op.GraphContext.window_decoded`), and every branch ends in its group's finish.
The graph's outputs are each view's outputs in turn.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import numpy as np
import torch

from ...ops.facets import Batching, facet
from ...pipeline.plan import Plan
from ...util.dtypes import torch_dtype
from ...util.intra_op import single_intra_op_thread
from ..device import InFlightCopies, copy_batch_to_host, images_to_host, keep_alive, move_output
from ..finishing import finish_batch
from .outputs import as_chw, graph_batch
from .tail import run_tail

__all__ = ["ViewColumns", "ViewOutputs", "view_branches"]


class ViewColumns:
    """Every view's argument columns after the encoded images, each view's under ``<view>/``; built from
    each sample's :class:`~dali_bridge.backends.per_sample.ViewSteps`."""

    def __init__(self, plan: Plan, columns: Sequence[Any]):
        self.plan, self.views = plan, list(columns)  # one ArgumentColumns per view
        self.arity: list[int] = []  # outputs of each view's branch, counted when the graph is built

    @property
    def names(self) -> list[str]:
        return ["encoded"] + [f"{v}/{name}" for v, columns in enumerate(self.views) for name in columns.names[1:]]

    def dali_types(self, types: Any) -> list:
        return [types.UINT8] + [kind for columns in self.views for kind in columns.dali_types(types)[1:]]

    def build(self, per_sample: list[list]) -> tuple[list, list[list[list]]]:
        """The columns of a batch (every view's in turn) and each view's torch tail parameters per sample."""
        built, tails = [], []
        for v, columns in enumerate(self.views):
            steps = [sample[v] for sample in per_sample]
            built += columns.build(steps)
            tails.append([sample_steps[len(columns.dali.steps):] for sample_steps in steps])
        return built, tails


def view_branches(columns: ViewColumns, named: dict[str, Any], images: Any, *, device: str,
                  arity: list[int]) -> list:
    """Each view's branch of the graph from the one decoded ``images``, its outputs in turn (``arity``
    gets how many outputs each view's branch returned: its images, then any border lines)."""
    outputs: list = []
    for v, view in enumerate(columns.views):
        dali = view.dali
        prefix = f"{v}/"
        own = {name[len(prefix):]: node for name, node in named.items() if name.startswith(prefix)}
        branch = images
        ctx = dali.context(device)
        for ctx.position, step in enumerate(dali.steps):
            step_prefix = f"{ctx.position}."
            step_columns = {name[len(step_prefix):]: node for name, node in own.items()
                            if name.startswith(step_prefix)}
            branch = step.op.dali_graph(step, branch, step_columns, ctx)
        if dali.finish_step is not None:
            branch = dali.finish_step.op.dali_graph(dali.finish_step, branch, {}, ctx)
        branch = list(branch) if isinstance(branch, (tuple, list)) else [branch]
        arity.append(len(branch))
        outputs += branch
    return outputs


class ViewOutputs:
    """A batch's graph outputs as each view's finished batch on the loader's ``target``: a view with a torch
    tail runs it (torchvision's per-sample kernels on the host, the batch kernels on a GPU) and its finish;
    the views' tails run side by side in ``threads`` threads."""

    def __init__(self, plan: Plan, columns: ViewColumns, *, gpu: bool, target: torch.device,
                 in_flight: InFlightCopies, threads: int):
        self.plan, self.columns, self.gpu, self.target, self._in_flight = plan, columns, gpu, target, in_flight
        tails = any(view.dali.torch_tail for view in columns.views)
        # Host tails side by side in threads (torch's kernels release the GIL); a GPU tail stays on the
        # consumer's thread, where the loader's device and stream are current.
        workers = max(1, min(threads, len(columns.views)))
        self._pool = (ThreadPoolExecutor(workers, thread_name_prefix="dali-bridge-view",
                                         initializer=single_intra_op_thread)
                      if tails and threads > 1 and not gpu else None)

    def convert(self, outputs: Sequence[Any], tails: list[list[list]]) -> list[torch.Tensor]:
        """Each view's finished batch from the flat graph ``outputs`` (a tail per view, per sample)."""
        bounds = np.cumsum([0, *self.columns.arity]).tolist()
        parts = [(list(outputs[a:b]), view, tail) for (a, b), view, tail
                 in zip(zip(bounds[:-1], bounds[1:]), self.columns.views, tails)]
        if self._pool is None:
            return [self._view(*part) for part in parts]
        return list(self._pool.map(lambda part: self._view(*part), parts))

    def _view(self, outputs: list, columns: Any, tail: list[list]) -> torch.Tensor:
        dali, plan = columns.dali, columns.plan
        if not dali.torch_tail:
            view = graph_batch(outputs, plan.finish.layout)
            tensor = move_output(view, self.target, self._in_flight)
            return keep_alive(tensor, outputs) if tensor is view else tensor
        # As the executor's own tail runs: on DALI's GPU with the batch kernels, unless a kernel is PIL's
        # (or DALI runs on the CPU): then on the host, torchvision's per-sample kernels.
        on_host = not self.gpu or any(facet(step.op, Batching).kernel_on_host(step.params) for step in dali.torch_tail)
        done = run_tail(dali.torch_tail, self._tail_inputs(outputs, on_host=on_host), tail, batched=not on_host)
        return finish_batch(done, plan.finish, self.target)

    def _tail_inputs(self, outputs: list, *, on_host: bool) -> Any:
        """The graph's uint8 HWC images as CHW tensors where the tail runs: one N x C x H x W tensor, or a
        list where their sizes differ."""
        images = outputs[0]
        if images.is_dense_tensor():
            batch = graph_batch(outputs, "HWC")
            return as_chw(copy_batch_to_host(batch) if on_host and batch.device.type != "cpu" else batch)
        samples = [torch.from_dlpack(images[n]) for n in range(len(images))]
        if on_host and samples and samples[0].device.type != "cpu":
            samples = images_to_host(samples)
        return [as_chw(sample) for sample in samples]

    def empty(self) -> list[torch.Tensor]:
        """Each view's images of a batch no sample of which is left: none, in a full batch's shape and dtype."""
        return [torch.empty((0,) + tuple(view.output_shape(0)[1:]), dtype=torch_dtype(view.finish.dtype),
                            device=self.target) for view in self.plan.views]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
