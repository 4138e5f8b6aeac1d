"""The DALI backend's input side: the external source that feeds each batch in the loader's order
(:class:`Feeder`, through the per-sample core; each batch's record is a :class:`BatchFeed`), the
argument columns every step declares
(:class:`ArgumentColumns`), and the graph builder (:func:`build_pipeline`), with the guard that keeps
DALI pipelines a forked child inherits alive."""
from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ...data.sources.formats import ImageInfo
from ...ops.dali_op import Column
from ...ops.geometry import Crop
from ...pipeline.plan import Plan
from ...pipeline.region_decode import decoded_window, steps_over_window
from ...pipeline.sampling import BatchTask, dealt_ahead
from .plan import DaliPlan, dali_plan
from .views import ViewColumns, view_branches
from ..base import BatchOutcome
from ..per_sample import SampleCore
from ..device import mixed_decoder_arguments
from ...data.sources.listing import Listing
from ...spec.pipeline import PipelineSpec

# Every DALI pipeline alive in this process. A forked child (a DataLoader worker, say) inherits
# them without DALI's threads, and destroying one there — e.g. when the child's garbage collector
# finalizes a loader left in a reference cycle by a traceback — waits forever on a condition
# variable those threads were waiting on, or crashes. The child keeps them, never destroying them.
# They are pinned in the parent just before the fork: a collection can run in the child before
# any hook of ours (threading's own after-fork hook allocates), and must find them referenced.
_LIVE_PIPELINES: "weakref.WeakSet[Any]" = weakref.WeakSet()
_INHERITED_PIPELINES: list = []
_PINNED_FOR_FORK: list = []


def _pin_pipelines() -> None:
    _PINNED_FOR_FORK.extend(_LIVE_PIPELINES)


def _unpin_pipelines() -> None:
    _PINNED_FOR_FORK.clear()


def _keep_inherited_pipelines() -> None:
    _INHERITED_PIPELINES.extend(_PINNED_FOR_FORK)
    _PINNED_FOR_FORK.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_pin_pipelines, after_in_parent=_unpin_pipelines,
                        after_in_child=_keep_inherited_pipelines)


@dataclass(frozen=True)
class BatchFeed:
    """One task as the feeder queued it (in :attr:`Feeder.pending`, in the loader's order): what the
    per-sample core made of it, and ``tail``: each kept sample's concrete parameters for the torch tail
    (the steps after the graph), computed with the rest of its draws."""
    outcome: BatchOutcome
    tail: list[list]

    @property
    def fed(self) -> bool:
        """Whether the batch went to the graph: one with no sample left (every one skipped, or a sample
        error under ``raise``) is answered without DALI, which cannot run an empty batch."""
        return self.outcome.kept > 0


class Feeder:
    """The external source: yields the inputs of each batch in the loader's order.

    DALI calls it ahead of consumption (prefetch); ``pending`` keeps, in order, which samples
    each batch holds so outputs can be matched to indices. A batch with nothing to feed (every
    sample skipped, or a sample error under ``raise``) goes into ``pending`` unfed and the next
    batch is fed in its place: DALI cannot run an empty batch, and a stand-in image would have to
    fit every step of the plan. Thread-safe: DALI may call from its own thread.
    """

    def __init__(self, spec: PipelineSpec, listing: Listing, plan: Plan, *, gpu: bool):
        self.spec, self.listing, self.plan = spec, listing, plan
        self.tasks: list[BatchTask] = []
        self.position = 0
        self.stopped = True
        self.pending: deque[BatchFeed] = deque()
        self.core = SampleCore(spec, listing, plan)
        self.lock = threading.Lock()
        self.columns = ArgumentColumns(plan, gpu=gpu)  # fixed per plan: not recomputed per batch
        # With views: every view's columns, after the one encoded image each (backends/dali/views.py).
        self.views = ViewColumns(plan, [ArgumentColumns(view, gpu=gpu) for view in plan.views]) if plan.views else None

    def start(self, tasks: list[BatchTask]) -> None:
        with self.lock:
            self.tasks, self.position, self.stopped = tasks, 0, False
            self.pending.clear()

    def stop(self) -> None:
        with self.lock:
            self.stopped = True

    def __iter__(self) -> "Feeder":
        return self

    def __next__(self) -> list[list[np.ndarray]]:
        while True:
            with self.lock:
                if self.stopped or self.position >= len(self.tasks):
                    raise StopIteration
                task = self.tasks[self.position]
                # this thread feeds every batch: its next ones are the loader's, read ahead while this one is prepared
                ahead = dealt_ahead(self.tasks, self.position, stride=1, depth=self.listing.reads_ahead)
                self.position += 1
            inputs, batch = self.prepare(task, ahead)
            with self.lock:
                self.pending.append(batch)
            if batch.fed:
                return inputs

    def prepare(self, task: BatchTask, ahead: tuple = ()) -> tuple[list, BatchFeed]:
        """One batch through the per-sample core (the encoded bytes of each kept sample; ``ahead``, the
        sample indices of the next batches, read ahead), then its argument columns. The inputs are
        empty when no sample is left to feed (not :attr:`BatchFeed.fed`)."""
        batch = self.core.prepare(task, _encoded, ahead)
        if self.views is not None:  # each view's columns, and its torch tail's parameters per sample
            columns, tails = self.views.build(batch.steps) if batch.items else ([], [])
            fed = BatchFeed(batch.outcome, tails)
            return ([batch.items] + columns if fed.fed else []), fed
        # The torch tail's concrete parameters travel with the batch, computed here with the rest.
        tail = [steps[len(self.columns.dali.steps):] for steps in batch.steps]
        windows: list[np.ndarray] = []
        if self.columns.window and batch.items:
            windows, tail = tail_windows(self.plan, tail)
        fed = BatchFeed(batch.outcome, tail)
        if not fed.fed:  # nothing for DALI: the executor answers this batch without it
            return [], fed
        return [batch.items] + self.columns.build(batch.steps) + windows, fed

    def decoder_input(self, task: BatchTask, row: int) -> tuple[bytes, tuple[np.ndarray, np.ndarray] | None] | None:
        """Sample ``row`` of ``task`` as the graph's decoder gets it, prepared as :meth:`prepare` prepares
        it (the same read, draws and columns): its bytes, and the (anchor, shape) of the region the decoder
        decodes (``fn.decoders.image_slice``), or None where it decodes the whole image. None where the
        sample never reaches the decoder (refused before it)."""
        one = BatchTask(task.epoch, task.number, task.indices[row:row + 1], task.valid[row:row + 1],
                        task.repeats[row:row + 1])
        inputs, batch = self.prepare(one)
        if not batch.fed:
            return None
        if self.views is not None:  # one whole decode feeds every view
            return bytes(inputs[0][0]), None
        window = self.columns.dali.window_columns or self.columns.window
        named = dict(zip(self.columns.names, inputs))
        region = None if not window else tuple(np.asarray(named[name])[0] for name in window)
        return bytes(inputs[0][0]), region


def tail_windows(plan: Plan, tail: list[list]) -> tuple[list[np.ndarray], list[list]]:
    """The decoder's window of each sample when the torch tail's first step crops one
    (:meth:`~dali_bridge.backends.dali.plan.DaliPlan.tail_window_columns`): the (anchor, shape)
    columns, and each sample's tail steps over its decoded window
    (:func:`~dali_bridge.pipeline.region_decode.steps_over_window`). A crop that does not lie inside the
    image (none does) keeps the whole image as its window and its steps unchanged."""
    anchors, shapes, steps_over = [], [], []
    for steps in tail:
        window = decoded_window(plan, steps)
        if window is None:
            height, width = steps[0][1]
            window = Crop(0, 0, height, width)
        else:
            steps = steps_over_window(steps, window)
        anchors.append((window.top, window.left))
        shapes.append((window.height, window.width))
        steps_over.append(steps)
    return [np.array(anchors, dtype=np.int32), np.array(shapes, dtype=np.int32)], steps_over


def _encoded(data: bytes, info: ImageInfo, steps: list) -> np.ndarray:
    """What the graph's decoder takes of a kept sample: its bytes, as the external source's uint8 array."""
    return np.frombuffer(data, dtype=np.uint8)


class ArgumentColumns:
    """The external source's columns: the encoded images, then every step's declared argument
    columns (:meth:`~dali_bridge.ops.dali_op.DaliOp.dali_columns`), each named ``<step position>.<name>``.

    The graph builder and the feeder both go through this one list, so a step's columns are
    matched by name — the order of the external source's outputs is an internal detail. It holds
    the plan's :class:`~dali_bridge.backends.dali.plan.DaliPlan` (``dali``), built here once for the
    executor: the builder reads its decisions from there.
    """

    def __init__(self, plan: Plan, *, gpu: bool = False):
        self.plan = plan
        self.dali: DaliPlan = dali_plan(plan)
        # The window a torch tail's first crop keeps, decoded alone: two columns after the declared ones.
        self.window = self.dali.tail_window_columns(gpu=gpu)
        self.context = self.dali.context("cpu")
        self.declared: list[tuple[int, Column]] = []
        ctx = self.context
        for ctx.position, step in enumerate(self.dali.steps):
            self.declared += [(ctx.position, column) for column in step.op.dali_columns(step, ctx)]
        self.names_of = {position: {column.name for p, column in self.declared if p == position}
                         for position in range(len(self.dali.steps))}

    @property
    def names(self) -> list[str]:
        return (["encoded"] + [f"{position}.{column.name}" for position, column in self.declared]
                + list(self.window or ()))

    def dali_types(self, types: Any) -> list:
        numpy_to_dali = {"uint8": types.UINT8, "int32": types.INT32, "float32": types.FLOAT}
        return ([types.UINT8] + [numpy_to_dali[column.dtype] for _, column in self.declared]
                + [types.INT32] * len(self.window or ()))

    def build(self, per_sample: list[list]) -> list[np.ndarray | list[np.ndarray]]:
        """The argument columns of a batch from each sample's :func:`~dali_bridge.pipeline.sampling.sample_steps`,
        in the declared order. A column whose samples all have one shape is a single array with the
        batch first: DALI's external source converts it once, where a list costs a conversion per
        sample on the feeding thread."""
        built: dict[int, dict[str, Any]] = {}
        ctx = replace(self.context)  # its own position: DALI may call the feeder from its thread
        for ctx.position, step in enumerate(self.dali.steps):
            entries = [sample[ctx.position] for sample in per_sample]
            built[ctx.position] = step.op.dali_arguments(step, [concrete for concrete, _ in entries],
                                                         [size for _, size in entries], ctx)
            if set(built[ctx.position]) != self.names_of[ctx.position]:
                raise RuntimeError(f"op {step.name!r} (step {ctx.position}) built DALI columns "
                                   f"{sorted(built[ctx.position])}, declared {sorted(self.names_of[ctx.position])}")
        columns = []
        for position, column in self.declared:
            problem = column.problem(built[position][column.name])
            if problem:
                raise RuntimeError(f"op {self.plan.steps[position].name!r} (step {position}): {problem}")
            columns.append(built[position][column.name])
        return columns


def build_pipeline(spec: PipelineSpec, plan: Plan, feeder: Feeder, *, gpu: bool, device_id: int | None,
                   threads: int):
    """Compile the plan into a DALI pipeline (its planning and stage devices from the feeder's
    ``DaliPlan``): the decoder, then each step's own fragment, then the finish, every fragment
    reading its columns by name; with views, each view's branch from the one decode."""
    from nvidia.dali import fn, pipeline_def, types

    dali = feeder.columns.dali
    devices = {stage: device for stage, _, device in dali.stages(gpu=gpu)}
    columns = feeder.views or feeder.columns
    names, column_types = columns.names, columns.dali_types(types)
    if feeder.views is not None:
        feeder.views.arity.clear()  # each view's outputs, counted as this build lays its branches

    @pipeline_def(batch_size=spec.batch_size, num_threads=threads, device_id=device_id,
                  prefetch_queue_depth=spec.loader.prefetch, py_start_method="spawn",
                  exec_dynamic=True)  # outputs stay valid after the next run: zero-copy DLPack
    def graph():
        outputs = fn.external_source(source=feeder, num_outputs=len(column_types), dtype=column_types,
                                     batch=True, no_copy=False)
        named = dict(zip(names, outputs))
        decoder_args: dict[str, Any] = dict(device=devices["decode"], output_type=types.RGB)
        if devices["decode"] == "mixed":
            decoder_args.update(mixed_decoder_arguments())
        window = dali.window_columns or feeder.columns.window  # the first step's crop window, in the graph or the tail
        if window:
            anchor, shape = (named[name] for name in window)
            images = fn.decoders.image_slice(named["encoded"], anchor, shape, axis_names="HW",
                                             normalized_anchor=False, normalized_shape=False, **decoder_args)
        else:
            images = fn.decoders.image(named["encoded"], **decoder_args)
        if gpu and devices["decode"] == "cpu":
            images = images.gpu()
        if feeder.views is not None:  # the one decode feeds each view's branch
            return tuple(view_branches(feeder.views, named, images, device="gpu" if gpu else "cpu",
                                       arity=feeder.views.arity))
        ctx = dali.context("gpu" if gpu else "cpu")
        for ctx.position, step in enumerate(dali.steps):
            images = step.op.dali_graph(step, images, _step_columns(named, ctx.position), ctx)
        if dali.finish_step is None:  # the decoder's uint8 HWC images go to the torch tail as they are
            return images
        return dali.finish_step.op.dali_graph(dali.finish_step, images, {}, ctx)

    pipe = graph()
    pipe.build()
    _LIVE_PIPELINES.add(pipe)
    return pipe


def _step_columns(named: dict[str, Any], position: int) -> dict[str, Any]:
    """Step ``position``'s columns under the names its op declared."""
    prefix = f"{position}."
    return {name[len(prefix):]: node for name, node in named.items() if name.startswith(prefix)}
