"""A batch's shards that are not cached yet are downloaded together: a batch of the shard-aware
order draws from a window of shards, and downloading them one after the other would cost a round
trip each before the batch, at the start of every epoch that finds the cache empty."""
from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import numpy as np
import pytest

from dali_bridge.data.shards.cache import ShardCache
from dali_bridge.data.shards.remote import CachedShardSamples
from dali_bridge.data.shards.tar import scan_shard
from dali_bridge.data.storage.listing import FetchError
from dali_bridge.tools.convert import convert

URLS = ("s3://bucket/train-000000.tar", "s3://bucket/train-000001.tar")


class MeetingStore:
    """The part of an :class:`ObjectStore` the cache uses, serving two local shards. A GET of one shard
    answers only once a GET of the other has arrived too (within ``timeout``): downloads made one
    after the other fail, made together they succeed."""

    timeout = 5.0

    def __init__(self, files: list[Path]):
        self.data = {url: path.read_bytes() for url, path in zip(URLS, files)}
        self.meeting = threading.Barrier(2, timeout=self.timeout)
        self.met: set[str] = set()

    def fetch(self, ranges):
        out = []
        for request in ranges:
            if request.url not in self.met:   # the first piece of each shard waits for the other shard's
                try:
                    self.meeting.wait()
                except threading.BrokenBarrierError:
                    out.append(FetchError(f"GET {request.url}: the other shard's GET never came alongside"))
                    continue
                self.met.add(request.url)
            data = self.data[request.url]
            out.append(data[request.start:request.start + request.size])
        return out


@pytest.fixture(scope="module")
def two_shards(sample_root: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    out = tmp_path_factory.mktemp("first-touch")
    folder = out / "images"
    for source in sorted(p for p in sample_root.iterdir() if p.is_dir())[:2]:   # ten images of two classes
        (folder / source.name).mkdir(parents=True)
        for image in sorted(source.iterdir())[:10]:
            (folder / source.name / image.name).write_bytes(image.read_bytes())
    convert(folder, str(out / "train-%06d.tar"), shard_size=10)
    return sorted(out.glob("train-*.tar"))


def _samples(files: list[Path], cache: ShardCache) -> CachedShardSamples:
    shard, offsets, sizes = [], [], []
    for number, path in enumerate(files):
        scan = scan_shard(str(path), ("jpg",), "cls")
        shard += [number] * len(scan.offsets)
        offsets += list(scan.offsets)
        sizes += list(scan.sizes)
    data = [path.read_bytes() for path in files]
    return CachedShardSamples(URLS, np.array(shard), np.array(offsets), np.array(sizes), ("e0", "e1"), cache.store,
                              cache, tuple(len(d) for d in data), tuple(hashlib.sha256(d).hexdigest() for d in data))


def test_a_batch_drawing_from_two_uncached_shards_downloads_them_together(two_shards, tmp_path):
    store = MeetingStore(two_shards)
    samples = _samples(two_shards, ShardCache(tmp_path / "cache", 1 << 30, store))
    batch = [0, len(samples) - 1, 1]   # samples of both shards
    samples.prefetch(batch)
    assert store.met == set(URLS)
    for index in batch:   # both cached: read from the local copies, no GET
        assert samples.read(index) == store.data[URLS[int(samples.shard[index])]][
            int(samples.offset[index]):int(samples.offset[index] + samples.size[index])]


def test_a_batch_whose_other_shard_is_cached_downloads_the_missing_one_alone(two_shards, tmp_path):
    store = MeetingStore(two_shards)
    cache = ShardCache(tmp_path / "cache", 1 << 30, store)
    samples = _samples(two_shards, cache)
    store.met.add(URLS[0])   # shard 0 served at once, and cached first
    cache.ensure(samples.cached_shard(0))
    store.met.discard(URLS[0])
    store.meeting = threading.Barrier(1)   # a lone GET goes through
    samples.prefetch([0, len(samples) - 1])
    assert store.met == {URLS[1]}   # only the missing shard was fetched


class MeetingCache:
    """A shard cache whose downloads each wait for another to start alongside (within 5 s)."""

    def __init__(self, parties: int):
        self.meeting = threading.Barrier(parties, timeout=5.0)
        self.kept: list[list] = []

    def ensure(self, shard, *, keep=(), wait=True):
        self.kept.append(list(keep))
        self.meeting.wait()   # BrokenBarrierError (not an OSError) if the downloads come one at a time
        return Path("/unused")


class WindowSamples:
    """Four shards of two batches each, as the read-ahead sees a listing read through a cache."""

    def __init__(self, cache: MeetingCache):
        self.shard = np.repeat(np.arange(4), 4)
        self.shards = tuple(f"s3://bucket/train-{n:06d}.tar" for n in range(4))
        self.cache = cache
        self.store = type("Store", (), {"timeout": 5.0})()

    def cached_shard(self, shard: int) -> int:
        return shard


def test_the_read_ahead_downloads_its_window_of_shards_together():
    from dali_bridge.data.shards.read_ahead import ShardReadAhead

    cache = MeetingCache(parties=2)
    samples = WindowSamples(cache)
    batches = [np.arange(k * 2, k * 2 + 2) * 2 for k in range(4)]   # batch k: samples of shard k
    ahead = ShardReadAhead(samples, batches, ahead=2)
    ahead.advance(1)
    ahead.wait()
    ahead.close()
    assert ahead.fetched == [1, 2] and ahead.failed == []
    # each spares every shard needed until the later target's first batch (shard 0's batch is behind)
    assert [sorted(kept) for kept in cache.kept] == [[1, 2], [1, 2]]


class RecordingCache:
    """A shard cache that records each download (the shard and what it had to spare), in order."""

    def __init__(self):
        self.ensured: list[tuple[int, list]] = []
        self.lock = threading.Lock()

    def ensure(self, shard, *, keep=(), wait=True):
        with self.lock:
            self.ensured.append((shard, sorted(keep)))
        return Path("/unused")


def test_the_next_epochs_first_shards_are_read_ahead_once_this_epochs_last_are_in_the_window():
    from dali_bridge.data.shards.read_ahead import ShardReadAhead

    cache = RecordingCache()
    samples = WindowSamples(cache)
    batches = [np.arange(k * 2, k * 2 + 2) * 2 for k in range(4)]   # batch k: samples of shard k
    following = [batches[2], batches[0], batches[3], batches[1]]    # the next epoch: shards 2, 0, 3, 1
    asked = []
    ahead = ShardReadAhead(samples, batches, ahead=2, following=lambda: asked.append(1) or following)
    ahead.advance(1)   # shards 1 and 2 ahead: the window is this epoch's
    ahead.wait()
    assert [shard for shard, _ in cache.ensured] == [1, 2] and asked == []
    ahead.advance(3)   # only shard 3 left ahead: the next epoch's first shard fills the window
    ahead.wait()
    ahead.advance(4)   # the epoch's last batch taken: the next epoch's first two
    ahead.wait()
    ahead.close()
    assert ahead.fetched == [1, 2, 3] and ahead.fetched_following == [2, 0] and asked == [1]
    by_shard = dict(cache.ensured)
    assert sorted(shard for shard, _ in cache.ensured) == [0, 1, 2, 2, 3]
    # next to shard 3 the next epoch's shard 2 spares shard 3 (this epoch still needs it); then its 0 spares 2
    assert by_shard[3] == [2, 3] and by_shard[0] == [0, 2]


def test_without_a_following_epoch_nothing_beyond_the_epoch_is_read_ahead():
    from dali_bridge.data.shards.read_ahead import ShardReadAhead

    cache = RecordingCache()
    batches = [np.arange(k * 2, k * 2 + 2) * 2 for k in range(4)]
    ahead = ShardReadAhead(WindowSamples(cache), batches, ahead=2)
    for done in range(1, 5):
        ahead.advance(done)
        ahead.wait()
    ahead.close()
    assert [shard for shard, _ in cache.ensured] == [1, 2, 3] and ahead.fetched_following == []
