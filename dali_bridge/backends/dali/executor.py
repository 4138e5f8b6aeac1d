"""The DALI backend: the plan compiled once into a DALI pipeline, fed in the bridge's order.

One graph builder serves ``dali`` (nvJPEG ``mixed`` decode, ops on the GPU) and ``dali-cpu``
(every op on the CPU); the only difference is the device each stage gets from the plan's
:class:`~dali_bridge.backends.dali.plan.DaliPlan`, built once per executor (and listed by
:func:`dali_bridge.loader.placement.placement`). Samples enter through an external source in the order and
with the geometry the loader decided: the feeder reads each file, probes its size, and computes
torchvision-exact crop windows, resize sizes and flips, which DALI applies as per-sample
arguments (ROI decode of the crop window, then resize) — DALI draws no randomness of its own.

This module holds the executor (runs, recovery, the hand-over to torch); the feeder, its argument
columns and the graph builder are in :mod:`dali_bridge.backends.dali.feed`.
"""
from __future__ import annotations

import logging
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Iterator

import numpy as np
import torch

from ...errors import ImageError, SampleError
from ...data.sources.images import decode_rgb
from ..base import RawBatch, Topology, default_workers
from ...pipeline.plan import Plan
from ...pipeline.sampling import BatchTask
from ...util.dtypes import torch_dtype
from .feed import ArgumentColumns, Feeder, build_pipeline  # noqa: F401
from ..finishing import FinishedBuffers, finish_batch
from ...util.intra_op import single_intra_op_thread
from .tail import run_tail
from .tail_processes import TailProcesses, tail_processes_possible
from ..thread_pool import abandon
from ..device import (InFlightCopies, TailStream, dali_threads, gpu_target, host_tail_split, keep_alive,
    mixed_decoder_arguments, move_output)
from ...data.sources.listing import Listing
from ...spec.pipeline import PipelineSpec
from ...ops.facets import Batching, facet

log = logging.getLogger("dali_bridge")

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
    """Decodes one encoded sample at a time with the ``mixed`` decoder the pipelines use: finds
    which sample of a failed GPU batch nvJPEG rejects. Built on first use, rebuilt after a failure."""

    def __init__(self, *, device_id: int | None):
        self.device_id = device_id
        self.pipe = None

    def _build(self):
        from nvidia.dali import fn, pipeline_def, types

        arguments = {k: v for k, v in mixed_decoder_arguments().items() if not k.endswith("memory_padding")}

        @pipeline_def(batch_size=1, num_threads=1, device_id=self.device_id, prefetch_queue_depth=1,
                      exec_dynamic=True)
        def graph():
            encoded = fn.external_source(name="encoded", dtype=types.UINT8)
            return fn.decoders.image(encoded, device="mixed", output_type=types.RGB, **arguments)

        pipe = graph()
        pipe.build()
        return pipe

    def rejects(self, data: bytes) -> str | None:
        """None when nvJPEG decodes ``data``, else DALI's reason (the operator's message)."""
        if self.pipe is None:
            self.pipe = self._build()
        try:
            self.pipe.run(encoded=[np.frombuffer(data, dtype=np.uint8)])
        except Exception as exc:
            self.pipe = None  # a pipeline that failed a run is not reused
            return dali_message(exc)
        return None


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
        # The torch tail runs on DALI's GPU (on a side stream: TailStream), or on the host where DALI is
        # on the CPU or a step's kernel is PIL's; the finish then on the loader's device.
        self.feeder = Feeder(spec, listing, plan, gpu=gpu)
        self.torch_tail = self.feeder.columns.dali.torch_tail  # the feeder's DaliPlan: built once per executor
        on_host = not gpu or any(facet(step.op, Batching).kernel_on_host(step.params) for step in self.torch_tail)
        self._tail_device = torch.device("cpu") if on_host else torch.device("cuda", self.device_id)
        self._tail_stream = TailStream(torch.device("cuda", self.device_id)) if gpu and self.torch_tail else None
        # The tail's batch kernels on a GPU (launches per operation drawn); torchvision's per-sample kernels
        # on the host, where they cost about half as much (backends/tail.py).
        self._batched_tail = self._tail_device.type == "cuda"
        self.pipe = None
        self._held: Any = None  # see _next_batch
        self._open_runs = 0
        self._in_flight = InFlightCopies()
        self._gpu_decode_check: Any = None  # built on the first batch that fails on the GPU
        # dali-cpu with a torch tail: the tail (and the finish) of batch k runs in a thread of its own while
        # DALI runs batch k+1, both releasing the GIL. Only for a host target: a CUDA one is finished on
        # the consumer's thread, where its current stream is.
        host_tail = not gpu and bool(self.torch_tail) and self.device.type == "cpu"
        # ... which then shares the loader's threads with DALI's (host_tail_split).
        self.threads, tail_threads = host_tail_split(threads) if host_tail else (threads, 1)
        # Each tail thread runs torch's kernels on one thread, as a DataLoader worker does (intra_op.py).
        self._tail_thread = (ThreadPoolExecutor(1, thread_name_prefix="dali-bridge-tail",
                                                initializer=single_intra_op_thread) if host_tail else None)
        # ... over chunks of the batch, one per tail thread: the tail's kernels and PIL's release the GIL,
        # and one thread alone cannot keep pace with DALI's threads.
        self._tail_chunks = tail_threads
        # The graph hands a host tail CHW views of HWC memory (DaliPlan.finish_step): torchvision's uint8
        # resize and the PIL conversions are fastest on those, its other kernels on CHW memory (timed on
        # the tail alone, for each recipe). So contiguous after the first step unless a later one is PIL's.
        self._contiguous_after_first = host_tail and not any(facet(step.op, Batching).kernel_on_host(step.params)
                                                              for step in self.torch_tail)
        self._tail_helpers = self._tail_processes = self._tail_sender = None
        self._finished = FinishedBuffers()  # the host finish's output memory, reused (backends/finishing.py)
        self.tail_runs_in = self._start_tail_workers(spec, tail_threads) if host_tail else None

    def _start_tail_workers(self, spec: PipelineSpec, workers: int) -> str:
        """The host tail's chunks in ``workers`` worker processes under loader.executor: processes (the
        default), where this process may fork: threads sharing this one's GIL scale badly on the tail's
        kernels (backends/tail_processes.py). Else in threads: the tail thread and helpers. Says which."""
        why_not = tail_processes_possible() if spec.loader.executor == "processes" else None
        if why_not is not None:
            log.info("dali-bridge %s: the torch tail runs in threads, not processes: %s", spec.name, why_not)
        elif spec.loader.executor == "processes":
            self._tail_processes = TailProcesses(self.torch_tail, workers=workers, batch_size=spec.batch_size,
                                                 size=self.plan.output_size,
                                                 contiguous_after_first=self._contiguous_after_first)
            # Copies a batch in and sends it while the tail thread finishes the one before.
            self._tail_sender = ThreadPoolExecutor(1, thread_name_prefix="dali-bridge-tail-send",
                                                   initializer=single_intra_op_thread)
            return "processes"
        if workers > 1:
            self._tail_helpers = ThreadPoolExecutor(workers - 1, thread_name_prefix="dali-bridge-tail-chunk",
                                                    initializer=single_intra_op_thread)
        return "threads"

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
                            meta, outputs = self._next_batch(pipe)
                        except StopIteration:  # the feeder ended early: should not happen
                            raise RuntimeError("DALI pipeline ended before the epoch's batches were produced") from None
                        except Exception as exc:  # DALI failed the batch at ``fetched``
                            failure = exc
                            break
                        converting.append(self._start_converting(outputs, meta))
                        fetched += 1
                    if not converting:  # the batches before the failed one are all yielded
                        break
                    # Not DALI's: a failure converting (the torch tail, DLPack, a CUDA allocation) is raised as it is.
                    pending = converting.popleft()
                    batch = pending.result() if isinstance(pending, Future) else pending()
                    position, retries = position + 1, 0  # counted once it converted: a failure blames this batch
                    yield batch
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
        return 2 if self._tail_thread is not None else 1

    def _start_converting(self, outputs: Any, meta: dict[str, Any]) -> "Future | Callable[[], RawBatch]":
        """The batch's RawBatch to come: the tail thread's future when there is one, else a callable that
        converts it; either raises its sample error (under ``raise``) or the conversion's failure."""
        if meta["error"] is not None:
            error = meta["error"]

            def raise_error() -> RawBatch:
                raise error
            return raise_error
        if self._tail_thread is None or not meta["fed"]:
            return lambda: self._convert(outputs, meta)
        if self._tail_processes is not None:
            sent = self._tail_sender.submit(self._send_to_tail, outputs, meta["tail"])
            return self._tail_thread.submit(self._convert, outputs, meta, sent)
        return self._tail_thread.submit(self._convert, outputs, meta)

    def _next_batch(self, pipe) -> tuple[dict[str, Any], Any]:
        """The next batch's meta and DALI outputs, in the loader's order. An unfed batch (see
        :class:`Feeder`) has no outputs; the outputs of a fed batch DALI ran while feeding it are
        held until the unfed ones before it are answered, and so is its failure."""
        pending = self.feeder.pending
        if self._held is None and not (pending and not pending[0]["fed"]):
            try:
                self._held = pipe.run(self._consumer_stream())  # outputs on the consumer's stream: no host wait
            except StopIteration:
                if not (pending and not pending[0]["fed"]):
                    raise
            except Exception as exc:
                if not (pending and not pending[0]["fed"]):
                    raise
                self._held = exc
        if not pending[0]["fed"]:
            return pending.popleft(), None
        outputs, self._held = self._held, None
        if isinstance(outputs, Exception):
            raise outputs
        return pending.popleft(), outputs

    def _recover(self, task: BatchTask, failure: Exception, retries: int) -> None:
        """After DALI failed ``task``: find the samples that cannot be decoded; raise the first under
        ``raise``, else remember them so the rebuilt pipeline skips them. A failure with no culprit
        it did not already know of is raised: rebuilding could not change it, so retries are bounded."""
        known = self.feeder.bad
        culprits = [(index, reason) for index, reason in self._find_culprits(task) if index not in known]
        where = f"epoch {task.epoch} batch {task.number} (samples {task.indices.tolist()})"
        if not culprits:
            raise DaliBatchError(f"DALI failed on {where}, yet each of them reads and decodes on its own: "
                                 f"{dali_message(failure)}") from failure
        if retries > len(task.indices):
            raise DaliBatchError(f"DALI failed on {where} {retries} times, each time with a new sample that "
                                 f"cannot be decoded; stopped: {dali_message(failure)}") from failure
        index, reason = culprits[0]
        if self.spec.loader.on_error == "raise":
            raise SampleError(index, self.listing.paths[index], reason) from failure
        known.update((index, (reason, self.listing.signature(index))) for index, reason in culprits)

    def _consumer_stream(self) -> Any:
        """The stream DALI binds a GPU pipeline's outputs to: the torch tail's side stream, else the
        consumer's current one on DALI's device."""
        if not self.gpu:
            return None
        return self._tail_stream.stream if self._tail_stream else torch.cuda.current_stream(self.device_id)

    def _convert(self, outputs: Any, meta: dict[str, Any], sent: Future | None = None) -> RawBatch:
        """The RawBatch of DALI's ``outputs``; ``sent``: the batch is in the tail processes already."""
        task: BatchTask = meta["task"]
        rows = meta["rows"]
        if not meta["fed"]:
            tensor = torch.empty((0,) + tuple(self.plan.output_shape(0)[1:]),
                                 dtype=torch_dtype(self.plan.finish.dtype), device=self.device)
        elif sent is not None:  # a new tensor: the finish reads the processes' output slot, which is reused
            tensor = finish_batch(self._tail_processes.collect(sent.result()), self.plan.finish, self.device,
                                  buffers=self._finished)
        elif self.torch_tail:
            images, *border = outputs
            if self._tail_stream is None:
                tensor = self._run_torch_tail(images, meta["tail"], border)
            else:
                tensor = self._tail_stream.run(lambda: self._run_torch_tail(images, meta["tail"], border), outputs,
                                               self._in_flight)
            tensor = move_output(tensor, self.device, self._in_flight)
        else:
            tensor = self._hand_over(outputs)
        return RawBatch(tensor, task.indices[rows], task.valid[rows], meta["skipped"], repeats=task.repeats[rows])

    def _hand_over(self, outputs: Any) -> torch.Tensor:
        """The graph's finished batch as a tensor on the loader's device: DALI's own buffer when it is
        there already (the dynamic executor never reuses a returned buffer, so DLPack needs no copy),
        kept alive as long as the tensor; else a copy (see move_output)."""
        images, *border = outputs
        view = torch.from_dlpack(images.as_tensor())
        if border:
            write_border(view, *(torch.from_dlpack(lines.as_tensor()) for lines in border), self.plan.finish.layout)
        tensor = move_output(view, self.device, self._in_flight)
        return keep_alive(tensor, outputs) if tensor is view else tensor

    def _tail_inputs(self, images, border: list) -> Any:
        """The graph's uint8 HWC output as the tail's CHW images on the tail's device: one N x C x H x W
        tensor, or a list where sizes differ."""
        where = self._tail_device
        if images.is_dense_tensor():  # one size: a zero-copy view, border lines patched as without a tail
            batch = torch.from_dlpack(images.as_tensor())
            if border:
                write_border(batch, *(torch.from_dlpack(lines.as_tensor()) for lines in border), "HWC")
            return _as_chw(move_output(batch, where, self._in_flight))  # one copy for the batch, if any
        # sizes differ until a later step sets the output size (a border patch is only for a last step)
        return [_as_chw(move_output(torch.from_dlpack(images[n]), where, self._in_flight)) for n in range(len(images))]

    def _send_to_tail(self, outputs: Any, tail: list[list]) -> Any:
        """A fed batch's images and tail parameters to the tail processes (in the sender thread)."""
        images, *border = outputs
        if border:  # one size then: the lines patched in DALI's memory, which the processes' copy reads
            write_border(torch.from_dlpack(images.as_tensor()),
                         *(torch.from_dlpack(lines.as_tensor()) for lines in border), "HWC")
        return self._tail_processes.send(images, tail)

    def _run_torch_tail(self, images, tail: list[list], border: list) -> torch.Tensor:
        """The plan's torch tail on the graph's uint8 CHW output: each step on the batch (:func:`run_tail`),
        with the feeder's concrete parameters (Python values: nothing per sample crosses between host and
        device), then the finish on the batch (the torchvision backend's own)."""
        where = self._tail_device
        samples = self._tail_inputs(images, border)
        done = self._tail_in_chunks(samples, tail, batched=self._batched_tail)  # each step (backends/tail.py)
        # A host tail's batch goes to the loader's device as uint8, in one copy; a GPU one is finished there.
        return finish_batch(done, self.plan.finish, self.device if where.type == "cpu" else where,
                            buffers=self._finished)

    def _tail_in_chunks(self, samples, tail: list[list], *, batched: bool) -> torch.Tensor:
        """:func:`run_tail` on the batch, as consecutive chunks of samples: the first in this thread, the
        others in the tail helpers at the same time. The same pixels: a sample's steps read only its own
        image and parameters, in a batch kernel as in a per-sample one (tests/backends/dali/test_batched_tail.py)."""
        steps, count = self.torch_tail, len(tail)
        chunks = min(self._tail_chunks, count)
        contiguous = self._contiguous_after_first
        if chunks < 2:
            return run_tail(steps, samples, tail, batched=batched, contiguous_after_first=contiguous)
        bounds = [count * k // chunks for k in range(chunks + 1)]
        others = [self._tail_helpers.submit(run_tail, steps, samples[a:b], tail[a:b], batched=batched,
                                            contiguous_after_first=contiguous)
                  for a, b in zip(bounds[1:-1], bounds[2:])]
        try:
            first = run_tail(steps, samples[:bounds[1]], tail[:bounds[1]], batched=batched,
                             contiguous_after_first=contiguous)
        finally:
            wait(others)  # none may still read DALI's outputs once this returns or raises
        return torch.cat([first] + [other.result() for other in others])

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
        no conversion still reads its outputs in the tail thread."""
        self.feeder.stop()
        abandon(pending for pending in converting or () if isinstance(pending, Future))
        if self._tail_sender is not None:  # its sends read DALI's outputs too: wait for those under way or queued
            self._tail_sender.submit(lambda: None).result()
        pipe, self.pipe = self.pipe, None
        del pipe

    def _find_culprits(self, task: BatchTask) -> list[tuple[int, str]]:
        """The samples of a failed batch that cannot be decoded: by the CPU decoder, or — on the
        GPU pipeline with ``mixed`` decode — by nvJPEG alone (it rejects some files libjpeg-turbo reads)."""
        found = []
        for index in task.indices.tolist():
            try:
                data = self.listing.read(index)
                decode_rgb(data)
            except ImageError as exc:
                found.append((index, str(exc)))
                continue
            if self.gpu and self.plan.decode_device == "mixed":
                reason = self._gpu_decoder_rejects(data)
                if reason is not None:
                    found.append((index, f"the GPU decoder (nvJPEG) cannot decode it, though the CPU decoder can: "
                                         f"{reason}"))
        return found

    def _gpu_decoder_rejects(self, data: bytes) -> str | None:
        if self._gpu_decode_check is None:
            self._gpu_decode_check = GpuDecodeCheck(device_id=self.device_id)
        return self._gpu_decode_check.rejects(data)

    def close(self) -> None:
        if self._tail_thread is not None:  # first: a conversion under way still reads the pipeline's outputs
            self._tail_thread.shutdown(wait=True, cancel_futures=True)
            self._tail_thread = None
        for pool in ("_tail_sender", "_tail_helpers"):
            if getattr(self, pool) is not None:
                getattr(self, pool).shutdown(wait=True, cancel_futures=True)
                setattr(self, pool, None)
        if self._tail_processes is not None:  # once nothing is sent or collected any more
            self._tail_processes.close()
        self._discard()


def _as_chw(images: torch.Tensor) -> torch.Tensor:
    """The graph's HWC output before a torch tail (an image, or a batch) as CHW: on the host a view of
    the HWC memory, as torchvision's decoder returns; on a GPU contiguous, the layout its batch
    kernels were measured on (see :attr:`~dali_bridge.backends.dali.plan.DaliPlan.finish_step`)."""
    chw = images.permute(0, 3, 1, 2) if images.dim() == 4 else images.permute(2, 0, 1)
    return chw if chw.device.type == "cpu" else chw.contiguous()


def write_border(images: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, layout: str) -> None:
    """Write a ``border_patch`` resize's exact outermost lines over the batch, in place.

    ``rows``: the first and last row of each image ([N, C, 2, W] for CHW, [N, 2, W, C] for HWC);
    ``cols``: the first and last column of the rows in between ([N, C, H-2, 2] / [N, H-2, 2, C]).
    Both went through the same crop_mirror_normalize as the images, flip included.
    """
    if layout == "HWC":  # as CHW with the channel axis moved: views, no copies
        images, rows, cols = (t.permute(0, 3, 1, 2) for t in (images, rows, cols))
    height, width = images.shape[-2:]
    # One strided pass each (first and last together): the column writes touch every row of the
    # batch, so both ends of a row are written while its memory is at hand.
    images[:, :, ::height - 1, :] = rows
    images[:, :, 1:-1, ::width - 1] = cols

