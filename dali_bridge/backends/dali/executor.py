"""The DALI backend: the plan compiled once into a DALI pipeline, fed in the bridge's order.

One graph builder serves ``dali`` (nvJPEG ``mixed`` decode, ops on the GPU) and ``dali-cpu``
(every op on the CPU); the only difference is the device each stage gets from the plan's
:class:`~dali_bridge.backends.dali.plan.DaliPlan`, built once per executor (and listed by
:func:`dali_bridge.loader.placement.placement`). Samples enter through an external source in the order and
with the geometry the loader decided: the feeder reads each file, probes its size, and computes
torchvision-exact crop windows, resize sizes and flips, which DALI applies as per-sample
arguments (ROI decode of the crop window, then resize) — DALI draws no randomness of its own.

This module holds the executor (runs, recovery, the hand-over to torch); the feeder, its argument
columns and the graph builder are in :mod:`dali_bridge.backends.dali.feed`, the torch tail's runner in
:mod:`dali_bridge.backends.dali.tail_runner`. What each batch became (its kept and skipped samples, or
its sample error) travels from the feeder to the batch handed back as one :class:`BatchFeed`.
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import Future
from typing import Any, Callable, Iterator

import numpy as np
import torch

from ...errors import ImageError, SampleError
from ...data.sources.images import decode_rgb
from ..base import RawBatch, Topology, default_workers
from ...pipeline.plan import Plan
from ...pipeline.sampling import BatchTask
from ...util.dtypes import torch_dtype
from .feed import ArgumentColumns, BatchFeed, Feeder, build_pipeline  # noqa: F401
from .outputs import graph_batch
from .tail_runner import TailRunner
from .views import ViewOutputs
from ..thread_pool import abandon
from ..device import InFlightCopies, dali_threads, gpu_target, keep_alive, mixed_decoder_arguments, move_output
from ...data.sources.listing import Listing
from ...spec.pipeline import PipelineSpec


class DaliBatchError(RuntimeError):
    """DALI failed a batch, and no sample of it could be blamed (or blaming them did not help)."""


def dali_message(exc: BaseException) -> str:
    """DALI's own message for a failed run, without the pipeline definition's traceback and the
    closing "no longer valid" lines: the operator that failed and what it encountered. Another
    exception (one the feeder raised, say) keeps its type."""
    text = str(exc).strip()
    if not isinstance(exc, RuntimeError) or "Critical error in pipeline" not in text:
        return f"{type(exc).__name__}: {' '.join(line.strip() for line in text.splitlines() if line.strip())}" \
            if text else repr(exc)
    lines = [line for line in text.splitlines()
             if line.strip() and line.strip() not in ("Critical error in pipeline:",
                                                      "Current pipeline object is no longer valid.")]
    operator = next((line.rstrip(",") for line in lines if line.startswith("Error in ")), None)
    found = text.rsplit("encountered:", 1)
    detail = [line for line in found[1].splitlines() if line.strip()
              and line.strip() != "Current pipeline object is no longer valid."] if len(found) == 2 else lines
    message = " ".join(line.strip() for line in detail) or "no message"
    return f"{operator}: {message}" if operator else message


class GpuDecodeCheck:
    """Decodes one encoded sample at a time with the ``mixed`` decoder the pipeline uses, as it uses it:
    the whole image, or (``region``) only the crop window it reads (``fn.decoders.image_slice``), whose
    decode may fail where the whole image's does not. Finds which sample of a failed GPU batch nvJPEG
    rejects. Built on first use, rebuilt after a failure."""

    def __init__(self, *, device_id: int | None, region: bool = False):
        self.device_id, self.region = device_id, region
        self.pipe = None

    def _build(self):
        from nvidia.dali import fn, pipeline_def, types

        arguments = {k: v for k, v in mixed_decoder_arguments().items() if not k.endswith("memory_padding")}
        arguments.update(device="mixed", output_type=types.RGB)
        region = self.region

        @pipeline_def(batch_size=1, num_threads=1, device_id=self.device_id, prefetch_queue_depth=1,
                      exec_dynamic=True)
        def graph():
            encoded = fn.external_source(name="encoded", dtype=types.UINT8)
            if not region:
                return fn.decoders.image(encoded, **arguments)
            anchor = fn.external_source(name="anchor", dtype=types.INT32)
            shape = fn.external_source(name="shape", dtype=types.INT32)
            return fn.decoders.image_slice(encoded, anchor, shape, axis_names="HW", normalized_anchor=False,
                                           normalized_shape=False, **arguments)

        pipe = graph()
        pipe.build()
        return pipe

    def rejects(self, data: bytes, region: tuple[Any, Any] | None = None) -> str | None:
        """None when nvJPEG decodes ``data`` (its ``region``: anchor and shape, where the check decodes
        one), else DALI's reason (the operator's message)."""
        if self.pipe is None:
            self.pipe = self._build()
        feed = {"encoded": [np.frombuffer(data, dtype=np.uint8)]}
        if self.region:
            feed.update(anchor=[np.asarray(region[0], dtype=np.int32)], shape=[np.asarray(region[1], dtype=np.int32)])
        try:
            self.pipe.run(**feed)
        except Exception as exc:
            self.pipe = None  # a pipeline that failed a run is not reused
            return dali_message(exc)
        return None


def region_said(region: tuple[Any, Any] | None) -> str:
    """The decoded region of interest in words (`` (decoding its crop window ...)``), or nothing for a whole image."""
    if region is None:
        return ""
    (top, left), (height, width) = (np.asarray(part).tolist() for part in region)
    return f" (decoding its crop window alone, as the pipeline does: {height}x{width} at row {top}, column {left})"


class DaliExecutor:
    """Runs tasks through a DALI pipeline built once (rebuilt only after a failed batch)."""

    def __init__(self, spec: PipelineSpec, listing: Listing, plan: Plan, *, gpu: bool, topology: Topology,
                 device: str | torch.device | None = None):
        self.spec, self.listing, self.plan, self.gpu = spec, listing, plan, gpu
        # workers: 0 means "in the calling process" on torchvision; DALI always needs a thread.
        if gpu:
            # DALI works on the target GPU when one is named (no copy across devices per batch),
            # else on the local rank's GPU among the visible ones.
            dali_device = gpu_target(device, topology.local_rank)
            self.device_id: int | None = dali_device.index
            # A CUDA target is DALI's device itself (a bare "cuda" resolved to its index); else the CPU.
            self.device = dali_device if device is None or torch.device(device).type == "cuda" else torch.device(device)
        else:
            self.device_id = None
            self.device = torch.device(device) if device is not None else torch.device("cpu")
        threads = dali_threads(spec.loader.workers, gpu=gpu, auto_cores=default_workers(), device=self.device_id)
        self.feeder = Feeder(spec, listing, plan, gpu=gpu)
        self.pipe = None
        self._held: Any = None  # see _next_batch
        self._in_flight = InFlightCopies()
        self._gpu_decode_check: Any = None  # built on the first batch that fails on the GPU
        # The steps after the graph (the feeder's DaliPlan: built once per executor), where they run; a host
        # tail's thread takes its share of the loader's threads from DALI's.
        # With views, each view's tail runs as the view's batch is handed over (backends/dali/views.py).
        tail = () if plan.views else self.feeder.columns.dali.torch_tail
        self.tail = TailRunner(tail, spec, plan, gpu=gpu, target=self.device,
                               device_id=self.device_id, threads=threads, in_flight=self._in_flight)
        self.threads = self.tail.dali_threads
        self.views = (ViewOutputs(plan, self.feeder.views, gpu=gpu, target=self.device, in_flight=self._in_flight,
                                  threads=threads) if plan.views else None)

    def _pipeline(self):
        if self.pipe is None:
            self.pipe = build_pipeline(self.spec, self.plan, self.feeder, gpu=self.gpu,
                                       device_id=self.device_id, threads=self.threads)
        return self.pipe

    def run(self, tasks: list[BatchTask]) -> Iterator[RawBatch]:
        position = 0
        retries = 0  # rebuilds for the batch at ``position``: each must have found a new culprit
        while position < len(tasks):
            pipe = self._pipeline()
            self.feeder.start(tasks[position:])
            self._held = None
            failure = None
            converting: deque = deque()  # batches DALI ran, in order: see _start_converting
            fetched = position
            try:
                while position < len(tasks):
                    # With a tail thread, batch k+1's DALI run overlaps batch k's conversion there.
                    while fetched < len(tasks) and failure is None and len(converting) < self._ahead:
                        try:
                            batch, outputs = self._next_batch(pipe)
                        except StopIteration:  # the feeder ended early: should not happen
                            raise RuntimeError("DALI pipeline ended before the epoch's batches were produced") from None
                        except Exception as exc:  # DALI failed the batch at ``fetched``
                            failure = exc
                            break
                        converting.append(self._start_converting(outputs, batch))
                        fetched += 1
                    if not converting:  # the batches before the failed one are all yielded
                        break
                    # Not DALI's: a failure converting (the torch tail, DLPack, a CUDA allocation) is raised as it is.
                    pending = converting.popleft()
                    raw = pending.result() if isinstance(pending, Future) else pending()
                    position, retries = position + 1, 0  # counted once it converted: a failure blames this batch
                    yield raw
            except BaseException:  # a sample error, a failure after DALI, or the consumer leaving
                self._discard(converting)
                raise
            if failure is None:
                self._end_epoch()
                return
            self._discard(converting)
            retries += 1
            self._recover(tasks[position], failure, retries)

    @property
    def _ahead(self) -> int:
        """Batches taken from DALI before the oldest is handed over: two with a tail thread (one converting
        there while DALI runs the next), else one, converted when it is handed over."""
        return 2 if self.tail.in_thread else 1

    def _start_converting(self, outputs: Any, batch: BatchFeed) -> "Future[RawBatch] | Callable[[], RawBatch]":
        """The batch's RawBatch to come: the tail thread's future when there is one, else a callable that
        converts it; either raises its sample error (under ``raise``) or the conversion's failure."""
        if not batch.fed:  # answered without DALI: no sample left (an empty batch), or its sample error
            return lambda: batch.outcome.raw_batch(self._empty_batch())
        return self.tail.schedule(lambda sent: self._convert(outputs, batch, sent), outputs, batch.tail)

    def _next_batch(self, pipe) -> tuple[BatchFeed, Any]:
        """The next batch's feed and DALI outputs, in the loader's order. An unfed batch (see
        :class:`Feeder`) has no outputs; the outputs of a fed batch DALI ran while feeding it are
        held until the unfed ones before it are answered, and so is its failure."""
        pending = self.feeder.pending
        if self._held is None and not (pending and not pending[0].fed):
            try:
                self._held = pipe.run(self._consumer_stream())  # outputs on the consumer's stream: no host wait
            except StopIteration:
                if not (pending and not pending[0].fed):
                    raise
            except Exception as exc:
                if not (pending and not pending[0].fed):
                    raise
                self._held = exc
        if not pending[0].fed:
            return pending.popleft(), None
        outputs, self._held = self._held, None
        if isinstance(outputs, Exception):
            raise outputs
        return pending.popleft(), outputs

    def _recover(self, task: BatchTask, failure: Exception, retries: int) -> None:
        """After DALI failed ``task``: find the samples that cannot be decoded and put the first to the
        ``on_error`` policy (:meth:`~dali_bridge.backends.per_sample.SampleCore.refusal`, as every sample
        that fails): its sample error is raised, DALI's failure as its cause; else the culprits are
        remembered, and the rebuilt pipeline's feed leaves them out and counts them, as the core refuses
        them. A failure with no culprit it did not already know of is raised: rebuilding could not
        change it, so retries are bounded."""
        core = self.feeder.core
        culprits = [(index, reason) for index, reason in self._find_culprits(task) if index not in core.bad]
        where = f"epoch {task.epoch} batch {task.number} (samples {task.indices.tolist()})"
        if not culprits:
            raise DaliBatchError(f"DALI failed on {where}, yet each of them reads and decodes on its own: "
                                 f"{dali_message(failure)}") from failure
        if retries > len(task.indices):
            raise DaliBatchError(f"DALI failed on {where} {retries} times, each time with a new sample that "
                                 f"cannot be decoded; stopped: {dali_message(failure)}") from failure
        refused = core.refusal(task, *culprits[0])
        if isinstance(refused, SampleError):
            raise refused from failure
        # A skip is not counted here: the retried batch's feed counts it, through the same refusal.
        core.bad.update((index, (reason, self.listing.signature(index))) for index, reason in culprits)

    def _consumer_stream(self) -> Any:
        """The stream DALI binds a GPU pipeline's outputs to: the torch tail's side stream, else the
        consumer's current one on DALI's device."""
        if not self.gpu:
            return None
        return self.tail.side_stream or torch.cuda.current_stream(self.device_id)

    def _convert(self, outputs: Any, batch: BatchFeed, sent: Future | None = None) -> RawBatch:
        """The RawBatch of a fed batch's DALI ``outputs``: after the torch tail where the plan has one
        (``sent``: the batch is in the tail processes already), else the graph's finished batch."""
        if self.views is not None:
            return batch.outcome.raw_batch(self.views.convert(outputs, batch.tail))
        image = self.tail.finished(outputs, batch.tail, sent) if self.tail.steps else self._hand_over(outputs)
        return batch.outcome.raw_batch(image)

    def _empty_batch(self) -> torch.Tensor | list[torch.Tensor]:
        """The images of a batch no sample of which is left: none, in the shape and dtype of a full one."""
        if self.views is not None:
            return self.views.empty()
        return torch.empty((0,) + tuple(self.plan.output_shape(0)[1:]), dtype=torch_dtype(self.plan.finish.dtype),
                           device=self.device)

    def _hand_over(self, outputs: Any) -> torch.Tensor:
        """The graph's finished batch as a tensor on the loader's device: DALI's own buffer when it is
        there already (the dynamic executor never reuses a returned buffer, so DLPack needs no copy),
        kept alive as long as the tensor; else a copy (see move_output)."""
        view = graph_batch(outputs, self.plan.finish.layout)
        tensor = move_output(view, self.device, self._in_flight)
        return keep_alive(tensor, outputs) if tensor is view else tensor

    def _end_epoch(self) -> None:
        """Consume DALI's end-of-epoch signal and rewind for the next run."""
        self.feeder.stop()
        try:
            while True:
                self.pipe.run(self._consumer_stream())
                self.feeder.pending.popleft()
        except StopIteration:
            pass
        self.pipe.reset()

    def _discard(self, converting: deque | None = None) -> None:
        """Throw the pipeline away after an error or an early exit (prefetched batches included), once
        no conversion (in the tail thread) or send (to the tail processes) still reads its outputs."""
        self.feeder.stop()
        abandon(pending for pending in converting or () if isinstance(pending, Future))
        self.tail.wait_for_sends()
        pipe, self.pipe = self.pipe, None
        del pipe

    def _find_culprits(self, task: BatchTask) -> list[tuple[int, str]]:
        """The samples of a failed batch that cannot be decoded: by the CPU decoder, or — on the
        GPU pipeline with ``mixed`` decode — by nvJPEG alone (it rejects some files libjpeg-turbo reads),
        decoding as the pipeline does: the crop window alone where the pipeline decodes only that."""
        found = []
        for row, index in enumerate(task.indices.tolist()):
            try:
                data = self.listing.read(index)
                decode_rgb(data)
            except ImageError as exc:
                found.append((index, str(exc)))
                continue
            if self.gpu and self.plan.decode_device == "mixed":
                given = self.feeder.decoder_input(task, row)
                reason = None if given is None else self._gpu_decoder_rejects(*given)
                if reason is not None:
                    found.append((index, f"the GPU decoder (nvJPEG) cannot decode it, though the CPU decoder can: "
                                         f"{reason}{region_said(given[1])}"))
        return found

    def _gpu_decoder_rejects(self, data: bytes, region: tuple[Any, Any] | None) -> str | None:
        if self._gpu_decode_check is None:
            self._gpu_decode_check = GpuDecodeCheck(device_id=self.device_id, region=region is not None)
        return self._gpu_decode_check.rejects(data, region)

    def close(self) -> None:
        self.tail.close()  # first: a conversion under way still reads the pipeline's outputs
        if self.views is not None:
            self.views.close()
        self._discard()
