"""``dali-cpu``'s host torch tail in worker processes: each runs :func:`~dali_bridge.backends.dali.tail.run_tail`
on its chunk of a batch, with an interpreter (and a GIL) of its own.

In threads of the loader's process the tail's kernels scale badly: each per-sample kernel call takes
the GIL to start and end, and timm's PIL policies hold it longer, so two tail threads on two cores
gave well under twice one thread's images/s (timm's recipe: none more at all) for more CPU per image.
DataLoader's worker processes do not share a GIL, which is where the ``torchvision`` backend got
ahead on the recipes.

The hand-over costs one copy each way, through memory the processes share:

* the parent copies the batch (uint8 HWC, as DALI decoded it) into the slot's input buffer in one
  call, and sends each worker where each image of its chunk lies and its concrete parameters (small
  Python values, pickled);
* the worker views each image as CHW over that HWC memory, as the tail in a thread does, runs the
  tail, and writes the chunk's rows of the batch's uint8 output buffer;
* the parent's finish reads the output buffer into the batch it hands over (a new tensor).

A worker keeps the sampling grids of the policies' affine operations (shear, translate, rotate) it
has made, up to :data:`GRID_BYTES`: torchvision builds each call's grid anew, which cost more than
the sampling, and a worker meets every magnitude bin of a policy many times per epoch.

Two batches may be in flight (the executor takes two from DALI ahead: one being finished while the
workers run the next), so each buffer has two slots, used in turn. Replies carry the batch's
sequence number: after a discarded batch (an error, the consumer leaving) the stale replies are read
and dropped. Workers are forked when the executor is built, before its DALI pipeline starts
threads, and end when it closes, when their pipe closes, or with the loader's process.
"""
from __future__ import annotations

import ctypes
import mmap
import multiprocessing
import pickle
import signal
import traceback
import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ...ops.base import Step
from ...ops.policy_kernels import keep_affine_grids
from .tail import run_tail

__all__ = ["TailProcesses", "TailProcessError", "tail_processes_possible"]

# Batches in flight at once: see the module's docstring and DaliExecutor._ahead.
SLOTS = 2
# The affine operations' grids a worker keeps (ops/policy_kernels.py: AffineGrids): every bin of
# TrivialAugmentWide's shear, translate and rotate at 176 x 176 is about 75 MB.
GRID_BYTES = 96 << 20
# Input memory mapped per image of a batch, per slot, before the fork: a 1,400 x 1,000 RGB window. Only
# what is written takes memory (pages are touched on first use); a larger batch is sent in a buffer shared then.
RESERVED_PER_IMAGE = 4 << 20


class TailProcessError(RuntimeError):
    """A tail worker process ended, or could not be reached, while the loader needed it."""


def tail_processes_possible() -> str | None:
    """None where this process may fork tail workers, else why not: a daemonic process (a DataLoader
    worker of the training script, say) may not have children, and fork is POSIX's."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return "this platform cannot fork"
    if multiprocessing.current_process().daemon:
        return "this process is daemonic (a worker process itself), and may not start processes"
    return None


@dataclass
class _Sent:
    """What the parent sent for one batch: its sequence number, slot and the chunks' row bounds."""
    sequence: int
    slot: int
    bounds: list[int]


class TailProcesses:
    """``workers`` processes that run ``steps`` (the torch tail) on consecutive chunks of each batch of
    at most ``batch_size`` images, each ``channels`` x ``size`` after the tail."""

    def __init__(self, steps: Sequence[Step], *, workers: int, batch_size: int, size: tuple[int, int],
                 channels: int = 3, contiguous_after_first: bool = False):
        context = multiprocessing.get_context("fork")
        self._outputs = [_shared(batch_size * channels * size[0] * size[1]).view(batch_size, channels, *size)
                         for _ in range(SLOTS)]
        self._inputs = [_shared(batch_size * RESERVED_PER_IMAGE) for _ in range(SLOTS)]
        self._sequence = 0
        self._broken: str | None = None
        self._connections, self._processes = [], []
        for number in range(workers):
            parent, child = context.Pipe()
            process = context.Process(target=_serve, name=f"dali-bridge-tail-{number}", daemon=True,
                                      args=(steps, child, self._inputs, self._outputs, contiguous_after_first,
                                            [*self._connections, parent]))
            process.start()
            child.close()  # the worker's end: its exit then closes the pipe for the parent's recv
            self._connections.append(parent)
            self._processes.append(process)
        self._finalizer = weakref.finalize(self, _stop, self._connections, self._processes)

    @property
    def workers(self) -> int:
        return len(self._processes)

    def send(self, images: Any, tail: list[list]) -> _Sent:
        """Copy a batch into the next slot and send each worker its chunk with ``tail``, each sample's
        concrete parameters per step. ``images``: DALI's uint8 HWC TensorList (``shape()`` and
        ``copy_to_external``), copied in one call, its samples back to back, where a copy per sample
        from Python cost several times the memory copy itself."""
        self._check()
        sequence, self._sequence = self._sequence, self._sequence + 1
        slot = sequence % SLOTS
        layout, fresh = self._copy_in(slot, images)
        count = len(layout)
        chunks = min(self.workers, count)
        bounds = [count * k // chunks for k in range(chunks + 1)]
        for worker, (a, b) in enumerate(zip(bounds, bounds[1:])):
            self._post(worker, (sequence, slot, fresh, layout[a:b], tail[a:b], a, b))
        return _Sent(sequence, slot, bounds)

    def collect(self, sent: _Sent) -> torch.Tensor:
        """The batch ``sent`` after the tail: a view of its slot's output rows, valid until the slot is
        sent to again (two sends later). Raises what a worker raised, as it was raised there."""
        failure = None
        for worker in range(len(sent.bounds) - 1):
            reply = self._reply(worker, sent.sequence)
            failure = failure or reply
        if failure is not None:
            raise failure
        return self._outputs[sent.slot][:sent.bounds[-1]]

    def close(self) -> None:
        self._finalizer()

    def _copy_in(self, slot: int, images: Any) -> tuple[list[tuple[int, int, int, int]], torch.Tensor | None]:
        """The batch's HWC memory into the input buffer for ``slot`` (mapped before the fork, so the workers
        have it), replaced by one twice the size, and sent, when the batch does not fit; returns
        (offset, height, width, channels) of each image, and the new buffer or None."""
        layout, offset = [], 0
        for height, width, channels in images.shape():
            layout.append((offset, height, width, channels))
            offset += height * width * channels
        buffer, fresh = self._inputs[slot], None
        if buffer.numel() < offset:  # larger images than reserved for: a buffer shared now, and sent (slow, rare)
            buffer = fresh = torch.empty(2 * offset, dtype=torch.uint8).share_memory_()
            self._inputs[slot] = buffer
        images.copy_to_external(ctypes.c_void_p(buffer.data_ptr()))
        return layout, fresh

    def _post(self, worker: int, message: tuple) -> None:
        try:
            self._connections[worker].send(message)
        except (OSError, EOFError) as exc:
            self._fail(worker, exc)

    def _reply(self, worker: int, sequence: int) -> BaseException | None:
        """Worker ``worker``'s outcome for ``sequence``: None, or the exception it raised; replies to
        earlier batches (discarded ones) are dropped on the way."""
        while True:
            try:
                answered, outcome = self._connections[worker].recv()
            except (OSError, EOFError) as exc:
                self._fail(worker, exc)
            if answered == sequence:
                return None if outcome is None else _rebuilt(outcome)

    def _fail(self, worker: int, exc: BaseException) -> None:
        process = self._processes[worker]
        process.join(timeout=1.0)
        code = process.exitcode
        how = (f"was killed by signal {-code}" if code is not None and code < 0 else
               f"exited with code {code}" if code is not None else "stopped answering")
        self._broken = (f"dali-bridge's torch tail worker process {process.pid} {how} "
                        f"(out of memory? the system log says); rebuild the loader")
        raise TailProcessError(self._broken) from exc

    def _check(self) -> None:
        if self._broken is not None:
            raise TailProcessError(self._broken)
        if not self._finalizer.alive:
            raise TailProcessError("the loader's torch tail worker processes were closed")


def _shared(nbytes: int) -> torch.Tensor:
    """``nbytes`` of memory a forked child shares with this process, as a flat uint8 tensor: an anonymous
    shared mapping, reserved without committing swap, whose pages are made on first touch. Torch's own
    ``share_memory_`` writes every page of a new buffer, which took longer than a batch's tail."""
    mapping = mmap.mmap(-1, max(1, nbytes), flags=mmap.MAP_SHARED | getattr(mmap, "MAP_NORESERVE", 0))
    return torch.frombuffer(mapping, dtype=torch.uint8)


def _serve(steps: Sequence[Step], connection, inputs: list[torch.Tensor], outputs: list[torch.Tensor],
           contiguous_after_first: bool, parents: list) -> None:
    """A worker's loop: each message's chunk through the tail, its rows into the output slot; one reply
    per message (None, or the pickled exception). Ends at None, or when the parent's end closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it closes the workers
    for end in parents:  # the parent's ends: with them closed here, a parent's exit ends the recv below
        end.close()
    torch.set_num_threads(1)  # a process of its own: one intra-op thread, as a DataLoader worker
    # A policy's shear, translate and rotate on its grids made before: a worker sees every bin many times.
    keep_affine_grids(GRID_BYTES)
    inputs = list(inputs)  # the input buffer of each slot; a larger one arrives with its message
    while True:
        try:
            message = connection.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        sequence, slot, fresh, layout, tail, start, stop = message
        if fresh is not None:
            inputs[slot] = fresh
        try:
            buffer = inputs[slot]
            images = [buffer[offset:offset + height * width * channels].view(height, width, channels)
                      .permute(2, 0, 1) for offset, height, width, channels in layout]
            run_tail(steps, images, tail, batched=False, contiguous_after_first=contiguous_after_first,
                     out=outputs[slot][start:stop])
            outcome = None
        except Exception as exc:  # raised in the parent's collect
            outcome = _picklable(exc)
        try:
            connection.send((sequence, outcome))
        except OSError:  # the parent is gone (its end closed): nobody to answer
            return


def _picklable(exc: Exception) -> bytes:
    try:
        return pickle.dumps(exc)
    except Exception:
        text = "".join(traceback.format_exception(exc))
        return pickle.dumps(RuntimeError(f"{type(exc).__name__} in a torch tail worker process: {exc}\n{text}"))


def _rebuilt(outcome: bytes) -> BaseException:
    try:
        return pickle.loads(outcome)
    except Exception as exc:
        return RuntimeError(f"a torch tail worker process raised an error that cannot be rebuilt here: {exc}")


def _stop(connections: list, processes: list) -> None:
    """Ask each worker to end, then make sure it has (at close, garbage collection or exit)."""
    for connection in connections:
        try:
            connection.send(None)
        except (OSError, EOFError, ValueError):
            pass
    for process in processes:
        process.join(timeout=2.0)
        if process.is_alive():
            process.terminate()
            process.join(timeout=2.0)
    for connection in connections:
        connection.close()
