"""The loader contract shared by every backend.

``build_loader`` turns a spec into a :class:`Loader`. The loader owns everything that must be
identical across backends — the epoch's order, the rank's share, the last-batch policy, the
per-sample random parameters, resumption and error accounting — and asks a backend executor to
turn each :class:`~dali_bridge.pipeline.sampling.BatchTask` into pixels.
"""
from __future__ import annotations

import logging
import os
import threading
import weakref
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import torch

from ..backends.base import Executor, RawBatch, SkippedSample, Topology, resolve_topology
from .dataloader_keywords import unexpected_keywords_message
from .limits import check_loader_limits
from ..pipeline.plan import Plan, build_plan, unsupported_places
from .post_finish import PostFinish
from ..util.quoting import safe_name
from ..pipeline.resume import STATE_FORMAT, Identity, check_identity, listing_fingerprint, merge_states, read_state
from ..pipeline.sampling import EPOCH_LIMIT, BatchTask, batch_count, check_epoch, entries_consumed, rank_batches
from ..data.shards.order import windows_of
from ..data.shards.read_ahead import ShardReadAhead, read_ahead_for
from ..data.sources.listing import Listing
from ..data.sources.local import list_source
from .stats import StepClock
from ..spec.pipeline import PipelineSpec, coerce_spec
from ..spec.problems import Problem, SpecError
from ..util.wording import plural
from ..util.messages import package_log

log = package_log()


class Loader:
    """Iterate for one epoch of batches: ``for image, label in loader``.

    Each batch is a tuple in the order of the spec's ``outputs``: ``image`` (NCHW or NHWC, the
    declared dtype, on ``loader.device``), ``label`` (int64 [N]), ``index`` (int64 [N], position in
    the source listing), ``valid`` (bool [N], False for ``pad`` repeats) and ``target`` (float32
    [N, number of classes]: soft targets, label smoothing and batch mixing folded in); with views,
    ``views`` in place of ``image``: a list of [N, C, H, W] batches, one per view. Ops after
    the finish run on each batch here (:mod:`dali_bridge.loader.post_finish`), the same for every backend.

    Each ``iter()`` runs the next epoch unless :meth:`set_epoch` chose one; :meth:`state_dict`
    after k batches and :meth:`load_state_dict` on a fresh loader continue with batch k+1 — on
    any world size (:mod:`dali_bridge.pipeline.resume`).
    """

    def __init__(self, spec: PipelineSpec, listing: Listing, plan: Plan, executor: Executor, backend: str,
                 topology: Topology, reason: str = ""):
        self.spec = spec
        self.listing = listing
        self.plan = plan
        self.backend = backend
        self.backend_reason = reason
        self.rank = topology.rank
        self.world_size = topology.world_size
        self._executor = executor
        self._next_epoch = 0
        self._resume = (0, 0)              # (batch, position) the next iteration starts at
        self._epoch: int | None = None     # epoch of the iteration in progress / last one
        self._start = (0, 0)               # its (batch, position) at iter()
        self._batches_done = 0             # its batches behind it, counted from the epoch's start
        self._epoch_batches = 0            # ... this rank has in it
        self._job_batches = 0              # ... the job has in it (rank 0's, the most)
        self._exhausted = False            # it ran to its end
        self._fingerprint: str | None = None
        self.skipped: list[SkippedSample] = []
        # One iteration at a time, in the process that built the loader (see _claim_iteration).
        self._pid = os.getpid()
        self._iteration_lock = threading.Lock()
        self._iteration: tuple[int, weakref.ref] | None = None   # (thread id, its generator)
        self._post_finish = PostFinish(plan, spec.seed, topology.rank, num_classes=len(listing.classes),
                                       label_smoothing=spec.label_smoothing, wants_target="target" in spec.outputs)
        self._clock = StepClock(backend=backend, workers=spec.loader.workers, report=spec.loader.report_starvation)
        # The iteration's downloads of the next shards into source.cache (shuffle: shards), or None.
        self.read_ahead: ShardReadAhead | None = None

    # ---- properties users read
    @property
    def device(self) -> torch.device:
        return self._executor.device

    @property
    def batch_size(self) -> int:
        return self.spec.batch_size

    @property
    def epoch(self) -> int:
        """The epoch the next iteration runs (while one runs: the epoch after it)."""
        return self._next_epoch

    @property
    def num_samples(self) -> int:
        return len(self.listing)

    def __len__(self) -> int:
        """Batches this rank has in the epoch being iterated (else the one the next iteration runs),
        those before a resume point included, as a DataLoader counts them."""
        if self._iterating():
            return self._epoch_batches
        batch, position = self._resume
        return batch + self._count(self.rank, position)

    @property
    def batches_done(self) -> int:
        """Batches of that epoch behind this rank: those yielded so far while iterating, else where
        the next iteration starts (a resume point, or 0)."""
        return self._batches_done if self._iterating() else self._resume[0]

    @property
    def batches_remaining(self) -> int:
        """``len(loader) - loader.batches_done``: what is left of the epoch on this rank (the same on
        every rank under ``pad`` and ``drop``, after an elastic resume too)."""
        return len(self) - self.batches_done

    def _iterating(self) -> bool:
        return self._epoch is not None and not self._exhausted and self._next_epoch == self._epoch + 1

    def _count(self, rank: int, position: int) -> int:
        """Batches ``rank`` takes of an epoch dealt from ``position`` over this world size."""
        loader = self.spec.loader
        return batch_count(len(self.listing), self.spec.batch_size, self.world_size, rank, loader.last_batch,
                           repeats=loader.repeated_augmentations, start=position)

    def stats(self) -> dict[str, Any]:
        """How long the consumer waited for batches and held them, since the loader was built, and
        the verdict (data-bound or compute-bound): see :mod:`dali_bridge.loader.stats`; on the
        ``torchvision`` backend also ``stages``, where the batches' CPU went, stage by stage (the
        workers' per-sample Python, decode, kernels and collate, the transfer and the finish here):
        see :mod:`dali_bridge.backends.stages`; an executor's own waits under ``executor`` (executor:
        ray: the waits for the cluster)."""
        figures = self._clock.figures()
        stages = getattr(self._executor, "stages", None)
        if stages is not None:
            figures["stages"] = stages.figures()
        executor_stats = getattr(self._executor, "stats", None)
        if executor_stats is not None:
            figures["executor"] = executor_stats()
        return figures

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch of the next iteration (its order and random parameters): 0 <= epoch < 2^32.

        Setting the epoch a :meth:`load_state_dict` resumes keeps the resume point, so the usual
        ``loader.set_epoch(epoch)`` at the top of a resumed training loop does not replay the epoch.
        """
        epoch = check_epoch(epoch)
        if epoch != self._next_epoch:
            self._resume = (0, 0)
        self._next_epoch = epoch

    def tasks(self, epoch: int, *, batch: int = 0, position: int = 0) -> list[BatchTask]:
        """The batches this rank yields in ``epoch`` (what the loader will ask the backend for); from a
        resume point: ``batch`` batches taken, the first ``position`` entries of the epoch behind the job."""
        loader = self.spec.loader
        return rank_batches(len(self.listing), self.spec.batch_size, self.spec.seed, check_epoch(epoch), self.rank,
                            self.world_size, loader.last_batch, loader.shuffle,
                            repeats=loader.repeated_augmentations, shards=windows_of(self.listing, loader),
                            start=position, first_number=batch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        with self._iteration_lock:
            self._claim_iteration()
            epoch, (batch, position) = self._next_epoch, self._resume
            tasks = self.tasks(epoch, batch=batch, position=position)
            self._next_epoch, self._resume = epoch + 1, (0, 0)
            self._epoch, self._start, self._batches_done, self._exhausted = epoch, (batch, position), batch, False
            self._epoch_batches, self._job_batches = batch + len(tasks), batch + self._count(0, position)
            batches = self._generate(tasks)
            self._iteration = (threading.get_ident(), weakref.ref(batches))
            return batches

    def _claim_iteration(self) -> None:
        """Refuse an iteration the backend cannot serve correctly; end an abandoned one.

        The executor feeds one stream of batches: a second iteration running beside the first
        (another thread) would take the first one's batches and pixels. A forked child holds a
        copy of the parent's DALI pipeline or DataLoader workers without their threads or
        processes, and would wait forever. A new iteration on the thread of an unfinished one
        closes that one first, as dropping it would.
        """
        if os.getpid() != self._pid:
            raise RuntimeError(f"this loader was built in process {self._pid}; it cannot be iterated in process "
                               f"{os.getpid()} (a fork of it), where its backend's threads and workers do not "
                               f"exist: build a new loader in this process")
        if self._iteration is None:
            return
        owner, reference = self._iteration
        running = reference()
        if running is None or running.gi_frame is None:  # dropped or finished
            return
        if owner != threading.get_ident():
            raise RuntimeError(f"this loader is already being iterated by another thread ({_thread_name(owner)}); "
                               f"a loader serves one iteration at a time: build one loader per thread, or let "
                               f"one thread iterate and hand the batches over")
        running.close()

    def _generate(self, tasks: list[BatchTask]) -> Iterator[tuple[torch.Tensor, ...]]:
        epoch = self._epoch
        self._clock.asked(name=self.spec.name, epoch=epoch)
        batches = self._executor.run(tasks)
        self.read_ahead = ahead = read_ahead_for(self.listing, self.spec.loader, [t.indices for t in tasks],
                                                 following=self._following_batches(epoch))
        try:
            for taken, raw in enumerate(batches, start=1):
                self._batches_done += 1
                if ahead is not None:
                    ahead.advance(taken)
                if raw.skipped:
                    self._record_skips(raw.skipped)
                if len(raw.indices) == 0:
                    log.warning("epoch %d batch %d: every sample was skipped; no batch yielded",
                                self._epoch, self._batches_done - 1)
                    continue
                # tasks run in order, one raw batch each: this is the batch's position in the rank's epoch
                out = self._outputs(raw, epoch=epoch, number=self._batches_done - 1)
                self._clock.handed(len(raw.indices), last=self._batches_done == self._epoch_batches)
                yield out
                self._clock.returned()
            self._exhausted = self._epoch == epoch
            self._clock.ended()
        except GeneratorExit:
            if self._epoch == epoch and self._batches_done < self._epoch_batches:
                # Abandoned mid-epoch by the consumer (break, close): the next iteration runs the next
                # epoch, and a state saved from now on must say so, or a resumed run would replay the
                # rest of this one. (A failing sample instead keeps the state at the failed batch.)
                self._epoch = None
            elif self._epoch == epoch:
                self._exhausted = True   # closed after its last batch: as good as run to the end
            raise
        finally:
            if ahead is not None:
                ahead.close()
            close = getattr(batches, "close", None)
            if close:
                close()
            self.listing.stop_reading_ahead()  # this process's GETs for batches no one will take

    def _following_batches(self, epoch: int) -> Callable[[], list[np.ndarray]] | None:
        """The batches of the epoch after ``epoch`` (the one a loop takes next unless it sets another),
        for the shard read-ahead to bring in that epoch's first shards while this one ends."""
        if epoch + 1 >= EPOCH_LIMIT:
            return None
        return lambda: [task.indices for task in self.tasks(epoch + 1)]

    def _record_skips(self, skipped: list[SkippedSample]) -> None:
        for item in skipped:
            log.warning("skipped sample %d (%s) in epoch %d: %s", item.index, safe_name(item.path), item.epoch,
                        item.reason)
        self.skipped.extend(skipped)

    def _outputs(self, raw: RawBatch, *, epoch: int, number: int) -> tuple[torch.Tensor, ...]:
        device = self.device
        values: dict[str, Any] = {}
        labels = torch.from_numpy(self.listing.labels[raw.indices]).to(device, non_blocking=True)
        image, target = raw.image, None
        if self._post_finish.active:
            image, target = self._post_finish.apply(raw.image, labels, raw.indices, epoch=epoch, number=number,
                                                    repeats=raw.repeats)
        for name in self.spec.outputs:
            if name in ("image", "views"):  # views: the list of each view's batch, in declared order
                values[name] = image
            elif name == "target":
                values[name] = target
            elif name == "label":
                values[name] = labels
            elif name == "index":
                values[name] = torch.from_numpy(np.asarray(raw.indices, dtype=np.int64)).to(device, non_blocking=True)
            elif name == "valid":
                values[name] = torch.from_numpy(np.asarray(raw.valid, dtype=bool)).to(device, non_blocking=True)
        return tuple(values[name] for name in self.spec.outputs)

    # ---- resumption
    def state_dict(self) -> dict[str, Any]:
        """Where the job stands: load it into a fresh loader, of this or another world size, to continue
        with the next batch. Ranks that step together hold the same dict, so rank 0's is enough."""
        if self._iterating() and self._batches_done < self._job_batches:
            (first, start), epoch, batch = self._start, self._epoch, self._batches_done
            position = start + entries_consumed(batch - first, remaining=self._entries(start),
                                                batch_size=self.spec.batch_size, world_size=self.world_size)
        else:
            epoch, (batch, position) = self._next_epoch, self._resume
        return {"format": STATE_FORMAT, "epoch": epoch, "batch": batch, "position": position,
                "world_size": self.world_size, **vars(self._identity())}

    def load_state_dict(self, state: Mapping[str, Any] | list[Mapping[str, Any]]) -> None:
        """Continue from ``state`` (or from the states every rank saved, which must agree), on this
        loader's world size and rank whatever the state's were; refuses a state from another dataset,
        seed, order, batch size, last-batch policy or repeat count. A state saved before elastic resume
        (format 1) loads at the world size and rank it was saved with."""
        saved = merge_states(state) if isinstance(state, (list, tuple)) else read_state(state)
        check_identity(saved, self._identity())
        if saved.rank is not None and (saved.world_size, saved.rank) != (self.world_size, self.rank):
            raise ValueError(f"this loader state holds one rank's place (rank {saved.rank} of world size "
                             f"{saved.world_size}; format 1, saved before elastic resume) and loads only there, "
                             f"not at rank {self.rank} of world size {self.world_size}: resume on the world size it "
                             f"was saved at, or pass the states of all {saved.world_size} ranks as a list")
        if saved.rank is not None and saved.batch > self._count(self.rank, 0):
            raise ValueError(f"loader state batch {saved.batch} is outside this epoch's {self._count(self.rank, 0)} "
                             f"batches")
        if saved.position > self._entries(0):
            raise ValueError(f"loader state position {saved.position} is outside this epoch's {self._entries(0)} "
                             f"entries")
        self._next_epoch, self._resume = saved.epoch, (saved.batch, saved.position)
        if self._count(0, saved.position) == 0:  # nothing left of the epoch for the job at this world size
            self._next_epoch, self._resume = self._next_epoch + 1, (0, 0)
        self._epoch = None

    def _entries(self, position: int) -> int:
        """Entries of the epoch's sequence (samples × repeats) from ``position`` on."""
        return len(self.listing) * self.spec.loader.repeated_augmentations - position

    def _identity(self) -> Identity:
        if self._fingerprint is None:  # computed once: a pass over the listing's names
            self._fingerprint = listing_fingerprint(self.listing)
        loader = self.spec.loader
        return Identity(seed=self.spec.seed, num_samples=len(self.listing), dataset=self._fingerprint,
                        batch_size=self.spec.batch_size, last_batch=loader.last_batch, shuffle=loader.shuffle,
                        repeated_augmentations=loader.repeated_augmentations,
                        shuffle_window=loader.shuffle_window if loader.shuffle == "shards" else None)

    # ---- lifecycle
    def close(self) -> None:
        """Stop the backend's workers and threads now (also done when the loader is collected)."""
        executor, self._executor = self._executor, _Closed(self._executor.device)
        if os.getpid() != self._pid:
            # A forked child's copy: stopping it would wait on the parent's threads and workers.
            _INHERITED_EXECUTORS.append(executor)
            return
        executor.close()
        self.listing.stop_reading_ahead()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (f"Loader(name={self.spec.name!r}, backend={self.backend!r}, device={str(self.device)!r}, "
                f"samples={len(self.listing)}, batch_size={self.batch_size}, rank={self.rank}/{self.world_size})")


# Executors a forked child inherited with its loaders: kept, never closed, in the child.
_INHERITED_EXECUTORS: list = []


def _thread_name(ident: int) -> str:
    thread = next((t for t in threading.enumerate() if t.ident == ident), None)
    return thread.name if thread is not None else f"thread {ident}"


class _Closed:
    def __init__(self, device: torch.device):
        self.device = device

    def run(self, tasks: list[BatchTask]) -> Iterator[RawBatch]:
        raise RuntimeError("this loader was closed")

    def close(self) -> None:
        pass


def check_epoch_has_batches(spec: PipelineSpec, *, num_samples: int, topology: Topology) -> None:
    """Refuse a loader whose epoch would yield no batch on this rank: a training loop over it would
    silently do nothing (and in a distributed job, wait forever for this rank's collectives)."""
    batch_size, last_batch = spec.batch_size, spec.loader.last_batch
    world_size, rank = topology.world_size, topology.rank
    repeats = spec.loader.repeated_augmentations
    if batch_count(num_samples, batch_size, world_size, rank, last_batch, repeats=repeats) > 0:
        return
    where = f"rank {rank} of world size {world_size}" if world_size > 1 else "this process (world size 1)"
    if repeats > 1:  # each sample counts r times below
        where += f" ({plural(num_samples, 'sample')} × repeated_augmentations {repeats})"
        num_samples *= repeats
    if last_batch == "drop":
        share = num_samples // world_size
        message = (f"an epoch has no batches on {where}: {plural(num_samples, 'sample')} ÷ world size "
                   f"{world_size} = {plural(share, 'sample')} per rank, fewer than batch_size {batch_size}, and "
                   f"loader.last_batch: drop discards an incomplete batch; set batch_size to at most {share} "
                   f"(--set batch_size={max(share, 1)}), or loader.last_batch: partial or pad")
    else:
        share = len(range(rank, num_samples, world_size))
        message = (f"an epoch has no batches on {where}: {plural(num_samples, 'sample')} dealt over world size "
                   f"{world_size} give this rank {plural(share, 'sample')}; use fewer ranks or more samples, or "
                   f"loader.last_batch: pad (every rank then fills its batches by repeating samples)")
    raise SpecError([Problem(spec.origin, "batch_size", message)], spec.origin)


def build_loader(spec_or_path: PipelineSpec | str | Path | Mapping, backend: str = "auto", *,
                 overrides: Mapping[str, Any] | list[str] | None = None, rank: int | None = None,
                 world_size: int | None = None, device: str | torch.device | None = None,
                 **unexpected: Any) -> Loader:
    """Build the loader for a pipeline: a file, the name of a shipped one (``"imagenet_train"``, with
    ``overrides={"source.root": DIR}``), a :class:`PipelineSpec` or its raw data.

    ``backend``: ``dali`` | ``dali-cpu`` | ``torchvision`` forces a backend (an unusable one raises
    :class:`~dali_bridge.loader.select.BackendUnavailable` with the reason); ``auto`` defers to the
    spec's ``backend`` key, whose own ``auto`` picks ``dali`` with DALI and a CUDA device, else
    ``torchvision``. ``rank``/``world_size`` default to torch.distributed or torchrun's environment.
    ``device``: where batches land (default ``cuda:LOCAL_RANK`` for GPU backends, else the CPU).
    Loader settings (``batch_size``, ``loader.workers``, ``loader.shuffle`` ...) live in the pipeline:
    change them with ``overrides={"loader.workers": 4}``; DataLoader's keywords raise a TypeError
    naming the key to override.
    """
    from .select import BackendUnavailable, build_executor, check_device, choose_backend

    if unexpected:
        raise TypeError(unexpected_keywords_message(unexpected))
    spec = coerce_spec(spec_or_path, overrides)
    requested = spec.backend if backend == "auto" else backend
    choice = choose_backend(requested, executor=spec.loader.executor)
    log.info("dali-bridge %s: backend %s (%s)", spec.name, choice.backend, choice.reason)
    missing = unsupported_places(spec, choice.backend)
    if missing:
        details = "; ".join(f"{where} '{name}' runs only on {', '.join(b)}" for where, name, b in missing)
        raise BackendUnavailable(f"{spec.origin}: backend '{choice.backend}' cannot run this pipeline: {details}")
    device = check_device(device)
    topology = resolve_topology(rank, world_size)
    plan = build_plan(spec)
    check_loader_limits(spec, plan, backend=choice.backend)  # before listing: it may take a while
    listing = list_source(spec.source)
    # Ignored non-image files are a warning: a wrong `source.extensions` would otherwise drop data quietly.
    log.log(logging.WARNING if listing.ignored else logging.INFO, "dali-bridge %s: %s", spec.name, listing.describe())
    check_epoch_has_batches(spec, num_samples=len(listing), topology=topology)
    executor = build_executor(choice.backend, spec, listing, plan, topology=topology, device=device)
    return Loader(spec, listing, plan, executor, choice.backend, topology, choice.reason)
