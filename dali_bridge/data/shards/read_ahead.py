"""Read-ahead into the node's shard cache: the next shards of a rank's batches are downloaded
while the current ones are read (``loader.shuffle: shards`` with ``source.cache``).

The rank's batches are known before the epoch starts, so each shard's first and last batch are
too. After each batch the consumer takes, a background thread of the loader's process downloads
the shards first needed from that batch on, up to ``loader.shuffle_window`` of them, together (a
thread each). A read-ahead never evicts a shard the rank still needs before the one it
fetches (from the current batch up to that shard's first batch), never waits for room and never
exceeds ``source.cache.max_bytes``: a shard that does not fit is left for its first touch. A
read-ahead that fails (the store keeps failing, the shard is damaged) is logged and counted,
never fatal: the first touch fetches the shard again, as it would without a read-ahead, and its
error, if it persists, is that sample's error.

Once fewer than ``loader.shuffle_window`` of the epoch's shards remain ahead, the window is filled
with the first shards of the epoch that follows (this one's number + 1, the usual next one), so a
next epoch whose shards were evicted does not wait a round trip before its first batch. That
read-ahead spares every shard the rest of this epoch needs; a guess that proves wrong (the loop
stops, or sets another epoch) costs those downloads and nothing else.

The other ranks of the node read the same window of shards at the same time (the order deals
every window to every rank), so the shards one rank spares are those the others read too.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import numpy as np

from .remote import CachedShardSamples
from .cache import CacheFull
from ...util.urls import redact
from ...util.messages import package_log

log = package_log()


class ShardReadAhead:
    """Downloads into the cache, ahead of their first touch, the shards of ``batches`` (the rank's
    batches of an epoch, each an array of sample indices), at most ``ahead`` shards beyond the
    batch the consumer is at. :meth:`advance` tells it where that is. ``following``: the batches of
    the epoch expected next (called once, in the read-ahead's thread, when this epoch's last shards
    are in the window); None reads nothing beyond this epoch."""

    def __init__(self, samples: CachedShardSamples, batches: Sequence[np.ndarray], ahead: int,
                 following: Callable[[], Sequence[np.ndarray]] | None = None):
        self.samples = samples
        self.ahead = max(1, ahead)
        first, last = _first_and_last(samples, batches)
        # the shards in the order the rank first needs them (ties by shard number: deterministic)
        self.order = sorted(first, key=lambda shard: (first[shard], shard))
        self.first, self.last = first, last
        self.fetched: list[int] = []   # shards brought into the cache (or found there) ahead of use
        self.failed: list[int] = []    # shards whose read-ahead failed: fetched again at first touch
        self.fetched_following: list[int] = []   # the next epoch's first shards, brought in (or found)
        self._following = following
        self._following_order: list[int] | None = None
        self._attempted: set[int] = set()
        self._attempted_following: set[int] = set()
        self._position = 0
        self._busy = False
        self._closed = False
        self._condition = threading.Condition()
        self._thread: threading.Thread | None = None

    def advance(self, done: int) -> None:
        """``done`` batches of the epoch are behind the consumer: read ahead of the next one."""
        with self._condition:
            self._position = done
            self._busy = True   # until the thread has looked at this position
            if self._thread is None and not self._closed:
                # Started after the first batch, not before: the DataLoader's workers are forked by
                # then, and a fork never copies a thread halfway through a download.
                self._thread = threading.Thread(target=self._run, name="dali-bridge-read-ahead", daemon=True)
                self._thread.start()
            self._condition.notify_all()

    def wait(self) -> None:
        """Until the read-ahead for the current position is done (or given up): for tests and
        benchmarks, which look at the cache without depending on timing."""
        with self._condition:
            while self._busy and not self._closed:
                self._condition.wait()

    def close(self) -> None:
        """Stop reading ahead; a download in progress finishes (within ``source.timeout`` per piece)."""
        with self._condition:
            self._closed = True
            self._condition.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.samples.store.timeout)

    def targets(self, position: int) -> list[int]:
        """The shards to have in the cache at ``position``: those first needed from that batch on,
        the next ``ahead`` of them in the order of need."""
        return [shard for shard in self.order if self.first[shard] >= position][:self.ahead]

    def in_use(self, position: int, shard: int) -> list[int]:
        """The shards needed from batch ``position`` up to ``shard``'s first batch: a read-ahead of
        ``shard`` must not evict them."""
        until = self.first[shard]
        return [s for s in self.order if self.last[s] >= position and self.first[s] <= until]

    def following_targets(self, position: int) -> list[int]:
        """The next epoch's first shards to have in the cache at ``position``: as many as this epoch's
        targets leave room for in the window (none while ``ahead`` of this epoch's remain)."""
        current = self.targets(position)
        room = self.ahead - len(current)
        if room <= 0 or self._following is None:
            return []
        if self._following_order is None:
            self._following_order = _first_needed(self.samples, self._following(), self.ahead)
        return [shard for shard in self._following_order if shard not in current][:room]

    def following_in_use(self, position: int, shard: int) -> list[int]:
        """The shards a read-ahead of the next epoch's ``shard`` must not evict: every shard the rest
        of this epoch needs, and the next epoch's needed before it."""
        order = self._following_order or [shard]
        before = order[:order.index(shard) + 1]
        return list(dict.fromkeys([s for s in self.order if self.last[s] >= position] + before))

    def _run(self) -> None:
        while True:
            with self._condition:
                while not self._busy and not self._closed:
                    self._condition.wait()
                if self._closed:
                    return
                position = self._position
            try:
                self._read_ahead(position)
            except BaseException:
                with self._condition:  # a waiter must not wait for a thread that is gone
                    self._closed = True
                    self._condition.notify_all()
                raise
            with self._condition:
                if self._position == position:  # nothing new arrived meanwhile
                    self._busy = False
                    self._condition.notify_all()

    def _read_ahead(self, position: int) -> None:
        """Download the targets at ``position`` not tried yet, together: one after the other, a window
        of shards would cost a round trip each, and readers that run ahead of the consumer (DataLoader
        workers, DALI's feeder) would reach the second before it arrives. Each spares the shards needed
        up to the last target's first batch, which covers every target's own."""
        with self._condition:
            if self._closed or self._position != position:
                return   # the consumer moved on: look again from there
        shards = [shard for shard in self.targets(position) if shard not in self._attempted]
        following = [shard for shard in self.following_targets(position) if shard not in self._attempted_following]
        if not shards and not following:
            return
        samples = self.samples
        spared = self.in_use(position, shards[-1]) if shards else []
        if following:
            spared = list(dict.fromkeys(spared + self.following_in_use(position, following[-1])))
        keep = [samples.cached_shard(s) for s in spared]
        jobs = [(shard, False) for shard in shards] + [(shard, True) for shard in following]   # apart already
        if len(jobs) == 1:
            outcomes = [self._fetch(jobs[0][0], keep)]
        else:
            with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="dali-bridge-read-ahead") as pool:
                outcomes = list(pool.map(lambda job: self._fetch(job[0], keep), jobs))
        for (shard, next_epoch), outcome in zip(jobs, outcomes):
            self._record(shard, outcome, next_epoch=next_epoch)

    def _record(self, shard: int, outcome: OSError | None, *, next_epoch: bool) -> None:
        if isinstance(outcome, CacheFull):
            return   # no room without evicting shards in use: try again after the next batch
        (self._attempted_following if next_epoch else self._attempted).add(shard)
        if outcome is None:
            (self.fetched_following if next_epoch else self.fetched).append(shard)
        else:
            self.failed.append(shard)
            log.info("dali-bridge: reading %s ahead%s failed (%s); it is fetched again when first read",
                     self.samples.shards[shard], " for the next epoch" if next_epoch else "", redact(str(outcome)))

    def _fetch(self, shard: int, keep: list) -> OSError | None:
        """Bring ``shard`` into the cache; the error instead of raising it (StorageError, CacheError,
        CacheFull, a full disk)."""
        try:
            self.samples.cache.ensure(self.samples.cached_shard(shard), wait=False, keep=keep)
        except OSError as exc:
            return exc
        return None


def _first_and_last(samples: Any, batches: Sequence[np.ndarray]) -> tuple[dict[int, int], dict[int, int]]:
    """Each shard's first and last batch among ``batches``."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for number, indices in enumerate(batches):
        for shard in np.unique(samples.shard[np.asarray(indices, dtype=np.int64)]).tolist():
            first.setdefault(shard, number)
            last[shard] = number
    return first, last


def _first_needed(samples: Any, batches: Sequence[np.ndarray], count: int) -> list[int]:
    """The first ``count`` shards ``batches`` need, in the order of need (ties by shard number)."""
    out: list[int] = []
    for indices in batches:
        out += [s for s in np.unique(samples.shard[np.asarray(indices, dtype=np.int64)]).tolist() if s not in out]
        if len(out) >= count:
            break
    return out[:count]


def read_ahead_for(listing: Any, loader: Any, batches: Sequence[np.ndarray],
                   following: Callable[[], Sequence[np.ndarray]] | None = None) -> ShardReadAhead | None:
    """The read-ahead of an epoch's ``batches`` (their sample indices) for a listing read through a
    shard cache in the shard-aware order (``loader`` a LoaderSpec); None otherwise. ``following``:
    the next epoch's batches, when asked (:class:`ShardReadAhead`)."""
    if loader.shuffle != "shards" or not isinstance(listing.shards, CachedShardSamples):
        return None
    return ShardReadAhead(listing.shards, batches, loader.shuffle_window, following)
