"""What the loader and the backend executors share: the executor protocol and its data types.

Below both ``loader.py`` and the backends (imports run one way: loader → backends.base ←
backends.*), as DALI's ``plugin/base_iterator.py`` keeps the contract below its framework
adapters.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterator, Protocol

import numpy as np
import torch

from ..errors import SampleError
from ..pipeline.sampling import BatchTask


@dataclass(frozen=True)
class SkippedSample:
    """A sample left out under ``on_error: skip``: where, which epoch, and the decoder's reason."""
    index: int
    path: str
    epoch: int
    reason: str


@dataclass
class RawBatch:
    """What an executor hands back: images of the kept samples (with views, a list of each view's
    batch, in output order) and which samples they are."""
    image: torch.Tensor | list[torch.Tensor]
    indices: np.ndarray
    valid: np.ndarray
    skipped: list[SkippedSample] = field(default_factory=list)
    repeats: np.ndarray | None = None  # int64 [N]: which repeat of its sample each row is (None: all 0)


@dataclass(frozen=True)
class BatchOutcome:
    """What the per-sample core made of one task before any pixels: the kept samples (``rows``:
    their positions in the task, in order), the skipped ones with their reasons (what the loader
    logs and counts), or under ``on_error: raise`` the sample error that stops the epoch at this
    batch (no rows then). Every executor carries it from the core to the batch it hands back, so the
    loader's accounting reads the same record whichever backend ran the batch."""
    task: BatchTask
    rows: list[int] = field(default_factory=list)
    skipped: list[SkippedSample] = field(default_factory=list)
    error: SampleError | None = None

    @property
    def kept(self) -> int:
        """How many of the task's samples the batch holds."""
        return len(self.rows)

    def raw_batch(self, image: torch.Tensor | None) -> RawBatch:
        """The batch handed back, ``image`` holding the kept samples' rows in order — every executor
        builds its :class:`RawBatch` here. Raises the batch's sample error instead, under ``raise``:
        the consumer meets it at this batch, after every batch before it."""
        if self.error is not None:
            raise self.error
        task, rows = self.task, self.rows
        return RawBatch(image, task.indices[rows], task.valid[rows], self.skipped, repeats=task.repeats[rows])


class Executor(Protocol):
    """A backend: applies a plan to the samples of each task, in order. Never draws randomness."""
    device: torch.device

    def run(self, tasks: list[BatchTask]) -> Iterator[RawBatch]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Topology:
    """This process's place in a (possibly distributed) job."""
    rank: int
    world_size: int
    local_rank: int


def resolve_topology(rank: int | None = None, world_size: int | None = None) -> Topology:
    """Rank/world from the arguments, else an initialised torch.distributed, else torchrun's
    RANK/WORLD_SIZE/LOCAL_RANK environment, else 0/1."""
    env = os.environ
    rank_from, world_from = "rank=", "world_size="
    if rank is None or world_size is None:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            if rank is None:
                rank, rank_from = torch.distributed.get_rank(), "torch.distributed's rank "
            if world_size is None:
                world_size, world_from = torch.distributed.get_world_size(), "torch.distributed's world size "
        else:
            if rank is None:
                rank, rank_from = _environment_integer("RANK", 0), "RANK="
            if world_size is None:
                world_size, world_from = _environment_integer("WORLD_SIZE", 1), "WORLD_SIZE="
    for value, source in ((rank, rank_from), (world_size, world_from)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{source}{value!r} is not an integer")
    rank, world_size = int(rank), int(world_size)
    if world_size < 1:
        raise ValueError(f"{world_from}{world_size}: the world size must be at least 1")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not within world size {world_size} ({rank_from}{rank}, "
                         f"{world_from}{world_size}): a rank runs from 0 to world size - 1")
    if "LOCAL_RANK" in env:
        local_rank = _environment_integer("LOCAL_RANK", 0)
    else:  # one process per GPU on a single node
        local_rank = rank % torch.cuda.device_count() if torch.cuda.is_available() else 0
    return Topology(rank, world_size, local_rank)


def _environment_integer(name: str, default: int) -> int:
    """The environment variable ``name`` (set by torchrun) as a non-negative int, ``default`` if unset."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"environment variable {name}={raw!r} is not a non-negative integer (torchrun sets it "
                         f"for each process it starts): unset it, set it to an integer, or pass rank= and "
                         f"world_size= to build_loader")
    return value


def available_cores() -> int:
    """CPU cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class WorkerShare:
    """What ``workers: auto`` resolves to here: the available cores split among this node's ranks."""
    workers: int
    cores: int
    local_world_size: int
    note: str = ""  # why the local world size was read as it was, when the environment was unusable

    def reason(self) -> str:
        """``"16 cores ÷ 4 processes on this node (LOCAL_WORLD_SIZE)"``: why auto is this figure."""
        source = "LOCAL_WORLD_SIZE" if "LOCAL_WORLD_SIZE" in os.environ else "LOCAL_WORLD_SIZE unset"
        processes = f"{self.local_world_size} process{'es' if self.local_world_size != 1 else ''}"
        text = f"{self.cores} core{'s' if self.cores != 1 else ''} ÷ {processes} on this node ({source})"
        if self.cores < self.local_world_size:
            text += ", at least 1"
        return text + (f"; {self.note}" if self.note else "")

    def explain(self) -> str:
        """``"4 = 16 cores ÷ 4 processes on this node (LOCAL_WORLD_SIZE)"``: the figure and why."""
        return f"{self.workers} = {self.reason()}"


def worker_share() -> WorkerShare:
    """``workers: auto``: available cores ÷ local world size (torchrun's LOCAL_WORLD_SIZE, else 1), at least 1.

    Every rank of a node sees the same cores, so each taking all of them would start
    ranks × cores workers (768 on a 96-core node with 8 ranks) that fight over the CPUs.
    """
    cores = available_cores()
    raw = os.environ.get("LOCAL_WORLD_SIZE")
    local_world_size, note = 1, ""
    if raw is not None:
        try:
            local_world_size = int(raw)
        except ValueError:
            local_world_size = 0
        if local_world_size < 1:
            local_world_size, note = 1, f"LOCAL_WORLD_SIZE={raw!r} is not a positive integer, read as 1"
    return WorkerShare(max(1, cores // local_world_size), cores, local_world_size, note)


def default_workers() -> int:
    """Worker processes/threads when the spec says auto: see :func:`worker_share`."""
    return worker_share().workers
