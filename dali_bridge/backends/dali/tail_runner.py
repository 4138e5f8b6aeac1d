"""Where and how the DALI executor runs its torch tail: the plan's steps after the graph
(:func:`~dali_bridge.backends.dali.tail.run_tail`) on the graph's outputs, then the finish.

Decided once per executor, from where DALI and the loader's device are:

* ``dali`` with a tail of GPU kernels: on DALI's GPU, on a side stream (:class:`TailStream`), with the
  batch kernels (launches per operation drawn), on the consumer's thread;
* a tail with a PIL kernel, or any tail on ``dali-cpu``: on the host, with torchvision's per-sample
  kernels (about half the cost of the batch kernels there: backends/dali/tail.py);
* ``dali-cpu`` with a host target: besides, in a tail thread of its own — batch k's tail and finish
  there while DALI runs batch k+1, both releasing the GIL — over chunks of the batch in worker
  processes (``loader.executor: processes``, where this process may fork: threads sharing one GIL scale
  badly on the tail's kernels, backends/dali/tail_processes.py) or in helper threads beside it. The
  loader's threads are then split between DALI and the tail (:func:`host_tail_split`).
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Sequence

import torch

from ...ops.facets import Batching, facet
from ...ops.base import Step
from ...pipeline.plan import Plan
from ...spec.pipeline import PipelineSpec
from ...util.intra_op import single_intra_op_thread
from ..base import RawBatch
from ..device import InFlightCopies, TailStream, copy_batch_to_host, host_tail_split, images_to_host, move_output
from ..finishing import FinishedBuffers, finish_batch
from .outputs import as_chw, graph_batch
from .tail import run_tail
from .tail_processes import TailProcesses, tail_processes_possible
from ...util.messages import package_log

log = package_log()

# What the executor hands the runner to make a batch's RawBatch: called with the future of the batch's
# send to the tail processes (None where it was not sent), where the tail runs.
Conversion = Callable[["Future | None"], RawBatch]


class TailRunner:
    """The torch tail ``steps`` of an executor whose graph runs on DALI's GPU ``device_id`` (``gpu``) or
    on the CPU, for a loader on ``target``; ``threads``: the loader's, which a tail thread shares with DALI
    (:attr:`dali_threads` is DALI's part). ``in_flight``: the executor's copies still under way."""

    def __init__(self, steps: Sequence[Step], spec: PipelineSpec, plan: Plan, *, gpu: bool, target: torch.device,
                 device_id: int | None, threads: int, in_flight: InFlightCopies):
        self.steps, self.finish, self.target, self._in_flight = list(steps), plan.finish, target, in_flight
        pil = any(facet(step.op, Batching).kernel_on_host(step.params) for step in self.steps)
        # Where the steps' kernels run: DALI's GPU, or the host where DALI is on the CPU or a kernel is PIL's.
        self.device = torch.device("cpu") if not gpu or pil else torch.device("cuda", device_id)
        self._stream = TailStream(torch.device("cuda", device_id)) if gpu and self.steps else None
        self.batched = self.device.type == "cuda"  # batch kernels on a GPU; torchvision's per sample on the host
        # A CUDA target is finished on the consumer's thread, where its current stream is: no tail thread.
        self.in_thread = not gpu and bool(self.steps) and target.type == "cpu"
        self.dali_threads, workers = host_tail_split(threads) if self.in_thread else (threads, 1)
        # The graph hands a host tail CHW views of HWC memory (DaliPlan.finish_step): torchvision's uint8
        # resize and the PIL conversions are fastest on those, its other kernels on CHW memory (timed on
        # the tail alone, for each recipe). So contiguous after the first step unless a later one is PIL's.
        self.contiguous_after_first = self.in_thread and not pil
        self._chunks = workers  # the tail thread's batch in this many chunks, one per worker
        # Each tail thread runs torch's kernels on one thread, as a DataLoader worker does (intra_op.py).
        self._thread = (ThreadPoolExecutor(1, thread_name_prefix="dali-bridge-tail", initializer=single_intra_op_thread)
                        if self.in_thread else None)
        self._helpers: ThreadPoolExecutor | None = None
        self._sender: ThreadPoolExecutor | None = None
        self.processes: TailProcesses | None = None
        self._finished = FinishedBuffers()  # the host finish's output memory, reused (backends/finishing.py)
        self.runs_in = self._start_workers(spec, plan, workers) if self.in_thread else None

    def _start_workers(self, spec: PipelineSpec, plan: Plan, workers: int) -> str:
        """The tail thread's chunks in ``workers`` worker processes under loader.executor: processes (the
        default), where this process may fork; else in the tail thread and helper threads. Says which."""
        why_not = tail_processes_possible() if spec.loader.executor == "processes" else None
        if why_not is not None:
            log.info("dali-bridge %s: the torch tail runs in threads, not processes: %s", spec.name, why_not)
        elif spec.loader.executor == "processes":
            self.processes = TailProcesses(self.steps, workers=workers, batch_size=spec.batch_size,
                                           size=plan.output_size, contiguous_after_first=self.contiguous_after_first)
            # Copies a batch in and sends it while the tail thread finishes the one before.
            self._sender = ThreadPoolExecutor(1, thread_name_prefix="dali-bridge-tail-send",
                                              initializer=single_intra_op_thread)
            return "processes"
        if workers > 1:
            self._helpers = ThreadPoolExecutor(workers - 1, thread_name_prefix="dali-bridge-tail-chunk",
                                               initializer=single_intra_op_thread)
        return "threads"

    @property
    def side_stream(self) -> Any:
        """The CUDA stream a GPU tail runs on (DALI binds the graph's outputs to it), else None."""
        return self._stream.stream if self._stream is not None else None

    def schedule(self, convert: Conversion, outputs: Any,
                 tail: list[list]) -> "Future[RawBatch] | Callable[[], RawBatch]":
        """A fed batch's conversion to come: in the tail thread (after its send to the processes, where they
        run the tail) when there is one, its future; else a callable that converts it when called."""
        if self._thread is None:
            return lambda: convert(None)
        if self.processes is not None:
            sent = self._sender.submit(self._send, outputs, tail)
            return self._thread.submit(convert, sent)
        return self._thread.submit(convert, None)

    def finished(self, outputs: Any, tail: list[list], sent: "Future | None") -> torch.Tensor:
        """The batch after the tail and the finish, on the loader's device: collected from the processes
        where ``sent`` there (a new tensor: the processes' output slot is reused), else run here."""
        if sent is not None:
            return finish_batch(self.processes.collect(sent.result()), self.finish, self.target,
                                buffers=self._finished)
        if self._stream is None:
            tensor = self.run(outputs, tail)
        else:
            tensor = self._stream.run(lambda: self.run(outputs, tail), outputs, self._in_flight)
        return move_output(tensor, self.target, self._in_flight)

    def run(self, outputs: Any, tail: list[list]) -> torch.Tensor:
        """The steps on the graph's uint8 output, each on the batch (:func:`run_tail`) with the feeder's
        concrete parameters (Python values: nothing per sample crosses between host and device), then the
        finish on the batch (the torchvision backend's own)."""
        done = self._in_chunks(self._tail_inputs(outputs), tail)
        # A host tail's batch goes to the loader's device as uint8, in one copy; a GPU one is finished there.
        return finish_batch(done, self.finish, self.target if self.device.type == "cpu" else self.device,
                            buffers=self._finished)

    def _tail_inputs(self, outputs: Any) -> Any:
        """The graph's uint8 HWC output as the tail's CHW images on the tail's device: one N x C x H x W
        tensor, or a list where sizes differ (until a later step sets the output size). The tail runs
        where DALI does, or on the host (a PIL kernel): then the batch comes there in one copy, by
        :func:`~dali_bridge.backends.device.copy_batch_to_host` in both branches (the device check
        excuses that copy's host sync by that function: benchmarks/device_check.py)."""
        images = outputs[0]
        if images.is_dense_tensor():  # one size: a zero-copy view, border lines patched as without a tail
            batch = graph_batch(outputs, "HWC")
            return as_chw(batch if batch.device == self.device else copy_batch_to_host(batch))
        samples = [torch.from_dlpack(images[n]) for n in range(len(images))]
        if samples and samples[0].device != self.device:
            samples = images_to_host(samples)
        return [as_chw(sample) for sample in samples]

    def _in_chunks(self, samples: Any, tail: list[list]) -> torch.Tensor:
        """:func:`run_tail` on the batch, as consecutive chunks of samples: the first in this thread, the
        others in the helper threads at the same time. The same pixels: a sample's steps read only its own
        image and parameters, in a batch kernel as in a per-sample one (tests/backends/dali/test_batched_tail.py)."""
        steps, count, batched, contiguous = self.steps, len(tail), self.batched, self.contiguous_after_first
        chunks = min(self._chunks, count)
        if chunks < 2:
            return run_tail(steps, samples, tail, batched=batched, contiguous_after_first=contiguous)
        bounds = [count * k // chunks for k in range(chunks + 1)]
        others = [self._helpers.submit(run_tail, steps, samples[a:b], tail[a:b], batched=batched,
                                       contiguous_after_first=contiguous)
                  for a, b in zip(bounds[1:-1], bounds[2:])]
        try:
            first = run_tail(steps, samples[:bounds[1]], tail[:bounds[1]], batched=batched,
                             contiguous_after_first=contiguous)
        finally:
            wait(others)  # none may still read DALI's outputs once this returns or raises
        return torch.cat([first] + [other.result() for other in others])

    def _send(self, outputs: Any, tail: list[list]) -> Any:
        """A fed batch's images and tail parameters to the tail processes (in the sender thread)."""
        images, *border = outputs
        if border:  # one size then: the lines written in DALI's memory, which the processes' copy reads
            graph_batch(outputs, "HWC")
        return self.processes.send(images, tail)

    def wait_for_sends(self) -> None:
        """Return once no send still reads DALI's outputs (under way or queued): before they are dropped."""
        if self._sender is not None:
            self._sender.submit(lambda: None).result()

    def close(self) -> None:
        """The tail thread first (a conversion under way still reads the graph's outputs), then the
        sender and helpers, then the processes, once nothing is sent or collected any more."""
        for pool in ("_thread", "_sender", "_helpers"):
            if getattr(self, pool) is not None:
                getattr(self, pool).shutdown(wait=True, cancel_futures=True)
                setattr(self, pool, None)
        if self.processes is not None:
            self.processes.close()
