"""The torchvision backend: the CPU fallback on torch's DataLoader.

Workers take each sample through the per-sample core (:mod:`dali_bridge.backends.per_sample`:
read, size, draws, the error policy), decode it with torchvision.io (libjpeg-turbo, the decoder
DALI's CPU path also uses; only a first crop's window where it can be decoded alone:
:mod:`dali_bridge.pipeline.region_decode`) at one decode point (:meth:`BatchDataset.load`), apply each step's kernel
with the parameters the core computed (``transforms.v2.functional`` on uint8 tensors) and ship
whole uint8 batches — a quarter of the bytes of float32 — through the worker queue into
shared-memory buffers they reuse. Dtype conversion and normalisation run on the
batch: on the GPU when the loader targets one (copy on a side stream, overlapped with the
consumer's work), else in the main process.

A worker that dies (killed, out of memory, a bus error when ``/dev/shm`` is full) ends the
iteration with a :class:`WorkerError` that says why and what to do; its workers are shut down and
the next iteration starts new ones. Workers that deliver nothing for :data:`STALL_SECONDS` (one
stopped by SIGSTOP, a hung file system) are reported in a warning naming each worker's state.
"""
from __future__ import annotations

import contextlib
import functools
import math
import multiprocessing
import os
import shutil
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from ..data.sources.formats import ImageInfo
from ..data.sources.images import decode_checked
from ..errors import SampleError
from .base import RawBatch, Topology, default_workers
from .device import gpu_target, on_side_stream, ready_on_consumer
from .finishing import FinishedBuffers, finish_batch
from ..util.intra_op import single_intra_op_thread
from .per_sample import PreparedBatch, SampleCore
from .stages import StageTimes
from .thread_pool import OrderedPool
from ..pipeline.plan import Plan
from ..pipeline.region_decode import decode_steps
from ..pipeline.sampling import BatchTask, dealt_ahead
from ..data.sources.listing import Listing
from ..spec.pipeline import PipelineSpec
from ..spec.problems import Problem, SpecError
from ..util.messages import package_log

log = package_log()

# Output buffers each worker cycles through. The DataLoader keeps at most `prefetch` batches in
# flight per worker and the main process finishes one batch before it asks for another, so a
# buffer is reused only after its batch was converted; two spare buffers keep a safe margin.
_SPARE_BUFFERS = 2
# Seconds without a batch from the workers before a warning names their state (then again each
# time as long): far above any batch's decode time, short enough that a stopped worker is noticed.
STALL_SECONDS = 60.0
# Where torch's workers share batch memory: a bus error in a worker usually means it is full.
SHARED_MEMORY = "/dev/shm"


class WorkerError(RuntimeError):
    """A DataLoader worker died, or cannot go on (shared memory full): which, why, and what to do."""


def apply_steps(image: torch.Tensor, plan: Plan, per_step: list) -> torch.Tensor:
    """Apply one sample's steps (:func:`~dali_bridge.pipeline.sampling.sample_steps`) to a CHW uint8 tensor,
    each with its op's torchvision kernel."""
    for step, (concrete, _) in zip(plan.steps, per_step):
        image = step.op.torchvision_kernel(image, concrete, step.params)
    return image


def apply_views(image: torch.Tensor, plan: Plan, per_view: list) -> list[torch.Tensor]:
    """A sample of a pipeline with views, decoded once (``image``): each view's steps
    (:class:`~dali_bridge.backends.per_sample.ViewSteps`) on that one image, in output order."""
    return [apply_steps(image, view, steps) for view, steps in zip(plan.views, per_view)]


def batch_buffers(shapes: list[tuple[int, ...]], flat: torch.Tensor) -> list[torch.Tensor]:
    """One uint8 tensor of each shape, side by side in ``flat`` (uint8, at least their total size): a batch
    of every view in one buffer (one shared-memory segment for a worker)."""
    out, offset = [], 0
    for shape in shapes:
        size = math.prod(shape)
        out.append(flat[offset:offset + size].view(shape))
        offset += size
    return out


def as_item(batch: PreparedBatch, out: Callable[[int], torch.Tensor | list[torch.Tensor]]) -> dict[str, Any]:
    """A prepared batch as the item an executor hands on: its images copied into ``out(count)`` and
    its outcome (a dict, so that DataLoader's pin-memory thread pins the images; with views, ``out`` gives
    one tensor per view and each item holds one image per view); or the sample error
    under ``raise`` as data (a worker's exception would reach the main process as torch's traceback
    text, not as a SampleError, and a SampleError does not unpickle from its message alone)."""
    error = batch.outcome.error
    if error is not None:
        return {"error": (error.index, error.path, error.reason)}
    try:
        image = out(len(batch.items))
    except _SharedMemoryFull as exc:  # as data, not raised: the main process says it without a traceback
        return {"fatal": str(exc)}
    if isinstance(image, list):   # views: each view's batch in the layout most of its images have
        image = [in_layout_of([item[v] for item in batch.items], view) for v, view in enumerate(image)]
    else:
        image = in_layout_of(batch.items, image)
    for slot, item in enumerate(batch.items):
        if isinstance(image, list):
            for buffer, view in zip(image, item):
                buffer[slot].copy_(view)
        else:
            image[slot].copy_(item)
    return {"image": image, "outcome": batch.outcome}


def in_layout_of(items: list[torch.Tensor], batch: torch.Tensor) -> torch.Tensor:
    """``batch`` (a contiguous N x C x H x W block) viewed in the memory layout most of ``items`` have:
    as it is, or channels-last (the same bytes as N x H x W x C). A uint8 resize of a decoded image
    (HWC memory) gives an image in HWC memory, and copying one into CHW memory is a transpose that
    cost about as much as the resize's own pass; copied in its own layout it is a plain copy. The
    finish reads either layout and writes the same contiguous batch (backends/finishing.py)."""
    last = sum(item.permute(1, 2, 0).is_contiguous() and not item.is_contiguous() for item in items)
    if 2 * last <= len(items):
        return batch
    count, channels, height, width = batch.shape
    return batch.view(count, height, width, channels).permute(0, 3, 1, 2)


class BatchDataset(Dataset):
    """Indexed by :class:`BatchTask`: returns the uint8 NCHW batch of the task's samples."""

    def __init__(self, spec: PipelineSpec, listing: Listing, plan: Plan, spare_buffers: int):
        self.core = SampleCore(spec, listing, plan)
        self.plan = plan
        self.batch_size = spec.batch_size
        self.ring_size = spare_buffers
        self._ring: list[torch.Tensor | list[torch.Tensor]] = []
        self._next = 0

    def __len__(self) -> int:  # the sampler decides; DataLoader only needs the protocol
        return 0

    def _buffer(self, count: int) -> torch.Tensor | list[torch.Tensor]:
        if not self._ring:
            in_worker = torch.utils.data.get_worker_info() is not None
            shapes = [(self.batch_size, 3, *view.output_size) for view in self.plan.view_plans]
            nbytes = sum(math.prod(shape) for shape in shapes)
            for _ in range(self.ring_size if in_worker else 1):
                try:
                    storage = _shared_storage(nbytes, self.ring_size) if in_worker else torch.UntypedStorage(nbytes)
                except _SharedMemoryFull:
                    self._ring.clear()  # a short ring would reuse a buffer still in flight: all or none
                    raise
                flat = torch.empty(0, dtype=torch.uint8).set_(storage)
                self._ring.append(batch_buffers(shapes, flat) if self.plan.views else flat.view(shapes[0]))
        buffer = self._ring[self._next % len(self._ring)]
        self._next += 1
        return [view[:count] for view in buffer] if isinstance(buffer, list) else buffer[:count]

    def __getitem__(self, item: BatchTask | DealtTask) -> dict[str, Any]:
        if isinstance(item, DealtTask):
            return self.batch(item.task, self._buffer, ahead=item.ahead)
        return self.batch(item, self._buffer)

    def batch(self, task: BatchTask, buffer: Callable[[int], torch.Tensor], ahead: tuple = ()) -> dict[str, Any]:
        """The task's batch as an item (see :func:`as_item`), its images in ``buffer(count)``;
        ``ahead``: the sample indices of the batches this worker makes next, read ahead (see
        :class:`DealtTask`). The item carries the CPU seconds of its stages in this thread
        (``stages``: :class:`~dali_bridge.backends.stages.StageTimes`)."""
        stages = {"decode": 0.0, "kernels": 0.0}
        start = time.thread_time()
        prepared = self.core.prepare(task, functools.partial(self.load, stages=stages), ahead)
        prepared_at = time.thread_time()
        item = as_item(prepared, buffer)
        item["stages"] = {"sample_python": prepared_at - start - stages["decode"] - stages["kernels"], **stages,
                          "collate": time.thread_time() - prepared_at}
        return item

    def load(self, data: bytes, info: ImageInfo, steps: list, *,
             stages: dict[str, float] | None = None) -> torch.Tensor | list[torch.Tensor]:
        """The per-sample core's ``load`` on this backend: decode (only the first step's window where
        it can be decoded alone: :func:`~dali_bridge.pipeline.region_decode.decode_steps`), then every step's
        kernel (with views: one whole decode and each view's steps, :func:`apply_views`); adds the CPU
        seconds of each to ``stages``. A method, not a closure: the dataset is pickled for workers started
        by spawn or forkserver."""
        start = time.thread_time()
        if self.plan.views:
            image = decode_checked(data)
            decoded = time.thread_time()
            image = apply_views(image, self.plan, steps)
        else:
            image, steps = decode_steps(data, info=info, plan=self.plan, per_step=steps)
            decoded = time.thread_time()
            image = apply_steps(image, self.plan, steps)
        if stages is not None:
            stages["decode"] += decoded - start
            stages["kernels"] += time.thread_time() - decoded
        return image


class _SharedMemoryFull(RuntimeError):
    """A worker cannot allocate its batch buffers in shared memory."""


def _shared_storage(nbytes: int, buffers: int) -> torch.UntypedStorage:
    """``nbytes`` of shared memory for a worker's batch buffer; :class:`_SharedMemoryFull` saying
    what to do when ``/dev/shm`` cannot hold it. torch leaves the segment of a failed allocation
    behind (it unlinks a segment only once mapped): this worker's are removed here."""
    try:
        return torch.UntypedStorage._new_shared(nbytes)
    except RuntimeError as exc:
        removed = _remove_leaked_segments()
        raise _SharedMemoryFull(
            f"a DataLoader worker cannot allocate its batch buffers ({buffers} x {nbytes / 2**20:.1f} MiB) in "
            f"{SHARED_MEMORY} ({_free_shared_memory()}; {exc}); {removed} half-made segment(s) removed. Free "
            f"space there or give the container more (docker --shm-size), or lower loader.workers, "
            f"loader.prefetch or batch_size") from None


def _remove_leaked_segments() -> int:
    """Remove this process's ``torch_<pid>_*`` segments from ``/dev/shm``. Only under torch's
    ``file_descriptor`` strategy, where a segment still named there was never mapped (the others
    are unlinked at once); under ``file_system`` the names are live, and are left alone."""
    if torch.multiprocessing.get_sharing_strategy() != "file_descriptor":
        return 0
    prefix, removed = f"torch_{os.getpid()}_", 0
    try:
        names = [name for name in os.listdir(SHARED_MEMORY) if name.startswith(prefix)]
    except OSError:
        return 0
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(SHARED_MEMORY, name))
            removed += 1
    return removed


@dataclass(frozen=True)
class DealtTask:
    """A task as the sampler hands it to a worker, with ``ahead``: the sample indices of the batches
    that worker makes next, which it reads ahead (shards at a URL: their GETs wait out the round trip
    while this batch decodes). DataLoader deals a map-style dataset's tasks to its workers in turn,
    from the first worker at each pass, so a worker's next batches are every ``workers``-th task
    after this one; were they dealt otherwise, a read-ahead would only go unused, never change a batch."""
    task: BatchTask
    ahead: tuple[np.ndarray, ...]


class _TaskSampler:
    """The current epoch's tasks; the executor swaps them before each pass of the DataLoader. With
    ``depth`` > 0 each is a :class:`DealtTask` naming the next ``depth`` batches of the worker it goes to
    (``stride`` workers: one for batches made in the calling thread)."""

    def __init__(self, *, stride: int = 1, depth: int = 0) -> None:
        self.tasks: list[BatchTask] = []
        self.stride, self.depth = max(1, stride), depth

    def __iter__(self) -> Iterator[BatchTask | DealtTask]:
        if self.depth <= 0:
            return iter(self.tasks)
        tasks = self.tasks
        return (DealtTask(task, dealt_ahead(tasks, position, stride=self.stride, depth=self.depth))
                for position, task in enumerate(tasks))

    def __len__(self) -> int:
        return len(self.tasks)


def prefetched(items: Iterable[Any], *, start: Callable[[Any], Any], ready: Callable[[Any], RawBatch],
               lookahead: int) -> Iterator[RawBatch]:
    """``ready(start(item))`` for each item, in order, with ``start`` run ``lookahead`` items ahead.

    ``start`` may fail (a bad sample under ``on_error: raise``, a worker's error): the items
    started before it are yielded first, then the error is raised — what the consumer sees is the
    same for every lookahead, only the overlap differs.
    """
    started: deque[Any] = deque()
    iterator = iter(items)
    while True:
        try:
            item = next(iterator)
        except StopIteration:
            break
        except Exception as exc:
            error = exc
        else:
            try:
                started.append(start(item))
                error = None
            except Exception as exc:
                error = exc
        if error is not None:
            while started:
                yield ready(started.popleft())
            raise error
        while len(started) > lookahead:
            yield ready(started.popleft())
    while started:
        yield ready(started.popleft())


def _pool_thread_setup(*, gpu: torch.device | None) -> None:
    """A sample thread's own state: one intra-op thread, and the loader's GPU current (the thread's
    ``torch.cuda.set_device``; a new thread has GPU 0)."""
    single_intra_op_thread()
    if gpu is not None:
        torch.cuda.set_device(gpu)


class TorchvisionExecutor:
    """DataLoader workers produce uint8 batches; finishing runs where the loader's device is."""

    def __init__(self, spec: PipelineSpec, listing: Listing, plan: Plan, *, topology: Topology,
                 device: str | torch.device):
        # ``device``: where the batches land; :func:`~dali_bridge.loader.select.build_executor` resolves
        # the loader's default (the local rank's GPU when the host has one) before building the executor.
        self.spec, self.listing, self.plan = spec, listing, plan
        self.device = torch.device(device)
        self.workers = spec.loader.workers if spec.loader.workers is not None else default_workers()
        self.sampler = _TaskSampler(stride=self.workers, depth=listing.reads_ahead)
        cuda = self.device.type == "cuda"
        self.dataset = BatchDataset(spec, listing, plan, spare_buffers=spec.loader.prefetch + _SPARE_BUFFERS)
        # loader.executor: threads runs the workers as threads of this process; with 0 workers both
        # executors prepare each batch in the calling thread, through the DataLoader's own loop.
        threads = spec.loader.executor == "threads" and self.workers > 0
        # Their pinned buffers are made with the loader's GPU current, as DataLoader's pin-memory thread's
        # are (a bare "cuda": the device current here, now; a pool thread's own would be GPU 0).
        # Each runs torch's kernels on one thread, as a DataLoader worker process does (intra_op.py).
        gpu = gpu_target(self.device, topology.local_rank) if cuda else None
        self.pool = (OrderedPool(self.workers, name="dali-bridge-sample",
                                 initializer=functools.partial(_pool_thread_setup, gpu=gpu)) if threads else None)
        self.dataloader = None if threads else self._dataloader(pin_memory=cuda)
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        # the host finish's output memory, reused (backends/finishing.py): four batches of every view
        self._finished = FinishedBuffers(keep=4 * len(plan.view_plans))
        self.stages = StageTimes()  # where each batch's CPU went, stage by stage (loader.stats())

    def _dataloader(self, *, pin_memory: bool) -> DataLoader:
        """The DataLoader whose worker processes (or, with 0 workers, the calling thread) make the batches."""
        spec = self.spec
        if self.workers > 0 and multiprocessing.current_process().daemon:
            raise SpecError([Problem(spec.origin, "loader.workers",
                                     f"{self.workers} worker processes cannot be started here: this loader is built "
                                     f"inside a daemonic process (a DataLoader worker, a multiprocessing pool), "
                                     f"which may not have children; set loader.workers: 0 for a loader built "
                                     f"there, or loader.executor: threads")], spec.origin)
        kwargs: dict[str, Any] = {}
        if self.workers > 0:
            kwargs.update(prefetch_factor=spec.loader.prefetch, persistent_workers=True)
        return DataLoader(self.dataset, batch_size=None, sampler=self.sampler, num_workers=self.workers,
                          collate_fn=_identity, pin_memory=pin_memory, **kwargs)

    def run(self, tasks: list[BatchTask]) -> Iterator[RawBatch]:
        if self.pool is not None:
            # As many batches in flight as DataLoader's workers would hold: prefetch per worker.
            items = self.pool.map(self._threaded_batch, tasks, in_flight=self.workers * self.spec.loader.prefetch)
        else:
            self.sampler.tasks = list(tasks)
            items = self._watched() if self.workers > 0 else self._started()
        try:
            if self.stream is None:
                yield from prefetched(items, start=self._finish_here,
                                      ready=lambda raw: raw, lookahead=0)
            else:
                # GPU: copy + finish batch k+1 on a side stream while the consumer works on batch k.
                yield from prefetched(items, start=self._finish_on_side_stream,
                                      ready=self._ready, lookahead=1)
        finally:
            close = getattr(items, "close", None)
            if close is not None:  # threads: the batches still in flight are cancelled or waited for now
                close()

    def _threaded_batch(self, task: BatchTask) -> dict[str, Any]:
        """One batch made in a pool thread, in a buffer of its own (several are in flight at once;
        pinned when the loader targets a GPU, as DataLoader's pin-memory thread would)."""
        pinned = self.stream is not None

        def buffer(count: int) -> torch.Tensor | list[torch.Tensor]:
            shapes = [(count, 3, *view.output_size) for view in self.plan.view_plans]
            if not self.plan.views:
                return torch.empty(shapes[0], dtype=torch.uint8, pin_memory=pinned)
            flat = torch.empty(sum(math.prod(shape) for shape in shapes), dtype=torch.uint8, pin_memory=pinned)
            return batch_buffers(shapes, flat)

        return self.dataset.batch(task, buffer)

    def _started(self) -> Iterator[dict[str, Any]]:
        """The DataLoader's iterator, started with the loader's GPU current: its pin-memory thread
        makes its CUDA context on the device current when it starts — GPU 0 on a rank > 0 that has
        not called ``torch.cuda.set_device``."""
        if self.device.type != "cuda":
            return iter(self.dataloader)
        with torch.cuda.device(self.device):
            return iter(self.dataloader)

    def _watched(self) -> Iterator[dict[str, Any]]:
        """The DataLoader's items under a :class:`_StallWatch`; a worker's death as a :class:`WorkerError`."""
        with _StallWatch(self._workers, STALL_SECONDS) as watch:
            iterator = self._started()
            while True:
                try:
                    # The thread's CPU time in here is the batch's receipt (waiting costs none): the
                    # transfer between processes, on this side.
                    start = time.thread_time()
                    item = next(iterator)
                    item.setdefault("stages", {})["transfer"] = time.thread_time() - start
                except StopIteration:
                    return
                except Exception as exc:
                    failure = self._worker_failure(exc)
                    if failure is None:
                        raise
                    raise failure from exc
                watch.progress()
                yield item

    def _worker_failure(self, exc: Exception) -> WorkerError | None:
        """The :class:`WorkerError` for ``exc`` when a worker died (torch says "DataLoader worker
        (pid ...) exited", or the batch of a worker killed while sending it did not arrive: a reset
        connection, a missing segment), with the workers shut down; None for any other error.

        torch's SIGCHLD handler raises its own "DataLoader worker" error at any point of the main
        thread until the workers are shut down, here too: that one restarts the handling."""
        while True:
            try:
                if not _is_worker_death(exc) and not _any_dead(self._workers()):
                    return None
                message = _death_message(self._workers(), f"{type(exc).__name__}: {exc}")
                self.close()  # the next iteration starts new workers
                return WorkerError(message)
            except RuntimeError as again:
                if not _is_worker_death(again):
                    raise
                exc = again

    def _workers(self) -> list[Any]:
        """The DataLoader's worker processes (empty before they start, and under threads)."""
        return list(getattr(getattr(self.dataloader, "_iterator", None), "_workers", None) or [])

    def _finished_batch(self, image: torch.Tensor | list[torch.Tensor],
                        **buffers: FinishedBuffers) -> torch.Tensor | list[torch.Tensor]:
        """The uint8 batch finished on the loader's device (``buffers``: where a host finish writes); with
        views, each view's by its group's finish."""
        if not self.plan.views:
            return finish_batch(image, self.plan.finish, self.device, **buffers)
        return [finish_batch(view_images, view.finish, self.device, **buffers)
                for view_images, view in zip(image, self.plan.views)]

    def _finish_here(self, item: dict[str, Any]) -> RawBatch:
        start = time.thread_time()
        image = self._finished_batch(item["image"], buffers=self._finished) if "image" in item else None
        self._count(item, finish=time.thread_time() - start)
        return self._raw(item, image)

    def _count(self, item: dict[str, Any], **here: float) -> None:
        """The batch's stage times (its worker's, and ``here``: this process's) into :attr:`stages`."""
        if "outcome" in item:
            self.stages.add({**item.get("stages", {}), **here}, images=item["outcome"].kept)

    def _finish_on_side_stream(self, item: dict[str, Any]) -> tuple[RawBatch, torch.cuda.Event]:
        raw = self._raw(item, None)  # a bad sample raises here, before any GPU work
        self._count(item)  # the finish is the GPU's work, not timed on the host
        raw.image, done = on_side_stream(self.stream, lambda: self._finished_batch(item["image"]))
        return raw, done

    def _ready(self, started: tuple[RawBatch, torch.cuda.Event]) -> RawBatch:
        """The consumer's stream waits for this batch's finishing only, not for later work on the side stream."""
        raw, done = started
        ready_on_consumer(self.device, raw.image, done)
        return raw

    def _raw(self, item: dict[str, Any], image: torch.Tensor | None) -> RawBatch:
        if "fatal" in item:
            raise WorkerError(item["fatal"])
        if "error" in item:
            index, path, reason = item["error"]
            raise SampleError(index, path, reason)
        return item["outcome"].raw_batch(image)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            return
        iterator = getattr(self.dataloader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        self.dataloader._iterator = None


_AFTER_DEATH = ("iterate the loader again to start new workers (it runs the next epoch; to resume at the failed "
                "batch instead, first loader.load_state_dict(loader.state_dict())), or build a new loader")


def _is_worker_death(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and str(exc).startswith("DataLoader worker (")


def _any_dead(workers: list[Any], wait: float = 1.0) -> bool:
    """Whether a worker has ended, waiting up to ``wait`` s for the exit of one that was just killed."""
    deadline = time.monotonic() + wait
    while not any(worker.exitcode is not None for worker in workers):
        if not workers or time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _death_message(workers: list[Any], original: str) -> str:
    """What a dead worker's exit says, and what to do about it."""
    dead = [worker for worker in workers if worker.exitcode is not None]
    if not dead:
        return f"a DataLoader worker died ({original}). The loader's workers were shut down: {_AFTER_DEATH}"
    causes = []
    for worker in dead:
        code = worker.exitcode
        if code < 0:
            name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
            cause = f"pid {worker.pid} was killed by {name}"
            if -code == signal.SIGKILL:
                cause += " (also what the kernel's out-of-memory killer sends: see dmesg)"
            elif -code == signal.SIGBUS:
                cause += f" (usually {SHARED_MEMORY} full: {_free_shared_memory()})"
        else:
            cause = f"pid {worker.pid} exited with status {code}"
        causes.append(cause)
    advice = ("free space in /dev/shm or give the container more (docker --shm-size), or lower "
              "loader.workers or loader.prefetch; " if any(w.exitcode == -signal.SIGBUS for w in dead) else "")
    return f"DataLoader worker {'; '.join(causes)}. The loader's workers were shut down: {advice}{_AFTER_DEATH}"


def _free_shared_memory() -> str:
    try:
        usage = shutil.disk_usage(SHARED_MEMORY)
    except OSError:
        return f"{SHARED_MEMORY} cannot be read"
    return f"{usage.free / 2**20:.0f} MiB free of {usage.total / 2**20:.0f} MiB"


def _process_state(pid: int) -> str:
    """A worker's state as ``/proc`` tells it, in words."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return f"pid {pid}: state unknown"
    if state in ("T", "t"):
        return f"pid {pid} is stopped (SIGSTOP, Ctrl-Z or a debugger): resume it with kill -CONT {pid}"
    words = {"R": "running", "S": "waiting", "D": "waiting on a device or file system (uninterruptible)",
             "Z": "dead (a zombie)"}
    return f"pid {pid} is {words.get(state, f'in state {state}')}"


class _StallWatch:
    """Warns when the workers deliver no batch for ``seconds``, and again after each further
    ``seconds``, naming each worker's state: the loader waits for its workers without a timeout (a
    slow batch is not an error), and a stopped worker would otherwise block it in silence."""

    def __init__(self, workers: Callable[[], list[Any]], seconds: float):
        self.workers, self.seconds = workers, seconds
        self.last = time.monotonic()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="dali-bridge-stall-watch", daemon=True)

    def __enter__(self) -> "_StallWatch":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.thread.join()

    def progress(self) -> None:
        self.last = time.monotonic()

    def _watch(self) -> None:
        warned = self.last
        while not self.done.wait(min(self.seconds / 4, 5.0)):
            now = time.monotonic()
            since = now - max(self.last, warned)
            if since < self.seconds:
                continue
            warned = now
            states = "; ".join(_process_state(worker.pid) for worker in self.workers() if worker.pid) or "none started"
            log.warning("no batch from the DataLoader workers for %.0f s; still waiting. Workers: %s",
                        now - self.last, states)


def _identity(batch: Any) -> Any:
    return batch
