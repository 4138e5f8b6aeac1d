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

The other ranks of the node read the same window of shards at the same time (the order deals
every window to every rank), so the shards one rank spares are those the others read too.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import numpy as np

from .remote import CachedShardSamples
from .cache import CacheFull
from ...util.urls import redact
from ...util.messages import package_log

log = package_log()


class ShardReadAhead:
    """Downloads into the cache, ahead of their first touch, the shards of ``batches`` (the rank's
    batches of an epoch, each an array of sample indices), at most ``ahead`` shards beyond the
    batch the consumer is at. :meth:`advance` tells it where that is."""

    def __init__(self, samples: CachedShardSamples, batches: Sequence[np.ndarray], ahead: int):
        self.samples = samples
        self.ahead = max(1, ahead)
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for number, indices in enumerate(batches):
            for shard in np.unique(samples.shard[np.asarray(indices, dtype=np.int64)]).tolist():
                first.setdefault(shard, number)
                last[shard] = number
        # the shards in the order the rank first needs them (ties by shard number: deterministic)
        self.order = sorted(first, key=lambda shard: (first[shard], shard))
        self.first, self.last = first, last
        self.fetched: list[int] = []   # shards brought into the cache (or found there) ahead of use
        self.failed: list[int] = []    # shards whose read-ahead failed: fetched again at first touch
        self._attempted: set[int] = set()
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
        if not shards:
            return
        samples = self.samples
        keep = [samples.cached_shard(s) for s in self.in_use(position, shards[-1])]
        if len(shards) == 1:
            outcomes = [self._fetch(shards[0], keep)]
        else:
            with ThreadPoolExecutor(max_workers=len(shards), thread_name_prefix="dali-bridge-read-ahead") as pool:
                outcomes = list(pool.map(lambda shard: self._fetch(shard, keep), shards))
        for shard, outcome in zip(shards, outcomes):
            if isinstance(outcome, CacheFull):
                continue   # no room without evicting shards in use: try again after the next batch
            self._attempted.add(shard)
            if outcome is None:
                self.fetched.append(shard)
            else:
                self.failed.append(shard)
                log.info("dali-bridge: reading %s ahead failed (%s); it is fetched again when first read",
                         samples.shards[shard], redact(str(outcome)))

    def _fetch(self, shard: int, keep: list) -> OSError | None:
        """Bring ``shard`` into the cache; the error instead of raising it (StorageError, CacheError,
        CacheFull, a full disk)."""
        try:
            self.samples.cache.ensure(self.samples.cached_shard(shard), wait=False, keep=keep)
        except OSError as exc:
            return exc
        return None


def read_ahead_for(listing: Any, loader: Any, batches: Sequence[np.ndarray]) -> ShardReadAhead | None:
    """The read-ahead of an epoch's ``batches`` (their sample indices) for a listing read through a
    shard cache in the shard-aware order (``loader`` a LoaderSpec); None otherwise."""
    if loader.shuffle != "shards" or not isinstance(listing.shards, CachedShardSamples):
        return None
    return ShardReadAhead(listing.shards, batches, loader.shuffle_window)
