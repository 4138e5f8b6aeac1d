"""Reading ahead at a URL: each reading thread (a DataLoader worker, DALI's feeding thread) starts
the ranged GETs of its next batches before it decodes the current one, without changing a batch;
a read-ahead that fails is fetched again when read, and closing the loader cancels what is still
on the wire. Shards are served over HTTP on 127.0.0.1 behind a proxy that delays and logs each
ranged GET (tests/helpers/s3_fixtures.py)."""
from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path
from urllib.parse import urlsplit

import fsspec.asyn
import pytest

from tests.helpers.backends import CPU_BACKENDS
from tests.helpers.paths import TRAIN
from dali_bridge import build_loader
from dali_bridge.data.shards.remote import READ_AHEAD_BATCHES, RemoteShardSamples
from dali_bridge.data.sources.webdataset import list_webdataset
from dali_bridge.data.storage.store import ObjectStore
from dali_bridge.errors import ImageError
from dali_bridge.spec.model import DEFAULT_IMAGE_KEYS
from tests.helpers import object_storage, s3_fixtures
from tests.helpers.object_storage import SHARDS, assert_same_batches, batches, local_batches, overrides

pytestmark = pytest.mark.slow  # loopback HTTP servers and delayed requests

# The fixtures, used by name below.
http_folder, fault_proxy = s3_fixtures.http_folder, s3_fixtures.fault_proxy
local_shards, private_listing_cache = object_storage.local_shards, object_storage.private_listing_cache

IN_ORDER = {"loader.shuffle": False}


@pytest.fixture
def served(local_shards: Path, http_folder) -> str:
    """The local shards served over HTTP; the server's base URL."""
    root, base = http_folder
    for path in local_shards.iterdir():
        shutil.copy2(path, root / path.name)
    return base


def requested(samples: RemoteShardSamples, indices) -> set[tuple[str, str]]:
    """The (path, Range header) of each of these samples' ranged GETs."""
    out = set()
    for index in indices:
        start, size = int(samples.offset[index]), int(samples.size[index])
        url = samples.shards[int(samples.shard[index])]
        out.add((urlsplit(url).path, f"bytes={start}-{start + size - 1}"))
    return out


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("workers", [0, 2])
def test_batches_are_the_same_with_and_without_read_ahead_and_each_sample_is_fetched_once(
        backend, workers, local_shards, served, fault_proxy, monkeypatch):
    if backend == "dali-cpu" and workers == 2:
        pytest.skip("dali-cpu feeds from one thread whatever loader.workers says")
    proxy = fault_proxy(served)
    extra = {"loader.workers": workers}
    read_ahead = batches(build_loader(TRAIN, backend, overrides=overrides(f"{proxy.endpoint}/{SHARDS}", **extra)))
    # Every GET the epoch made was one sample's, once: each worker read ahead only the batches dealt to it.
    assert proxy.ranged == 37
    monkeypatch.setattr(RemoteShardSamples, "reads_ahead", 0)
    plain = batches(build_loader(TRAIN, backend, overrides=overrides(f"{served}/{SHARDS}", **extra)))
    assert_same_batches(read_ahead, plain)
    assert_same_batches(read_ahead, local_batches(local_shards, backend, **extra))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_the_next_batches_are_requested_before_the_first_is_returned(backend, served, fault_proxy):
    proxy = fault_proxy(served, latency=1.0)  # each GET waits in the server: the read-ahead's are on the wire
    # prefetch 1: DALI asks its feeder for no batch beyond the one it runs, so only a read-ahead asks for more
    loader = build_loader(TRAIN, backend, overrides=overrides(f"{proxy.endpoint}/{SHARDS}", **{
        "loader.workers": 0, "loader.prefetch": 1, **IN_ORDER}))
    next(iter(loader))
    arrived = set(proxy.arrived)
    samples = loader.listing.shards
    loader.close()
    # batch_size 5 in the listing's order: batch k is samples 5k..5k+4; the two batches after the first
    assert READ_AHEAD_BATCHES == 2 and requested(samples, range(5, 15)) <= arrived


def test_a_workers_own_next_batches_are_requested_before_the_first_batch_is_returned(served, fault_proxy):
    proxy = fault_proxy(served, latency=1.0)
    loader = build_loader(TRAIN, "torchvision", overrides=overrides(f"{proxy.endpoint}/{SHARDS}",
                                                                    **{"loader.workers": 2, **IN_ORDER}))
    next(iter(loader))
    arrived = set(proxy.arrived)
    samples = loader.listing.shards
    loader.close()
    # Worker 0 makes batches 0, 2, 4, ...: batch 4 is dealt to it only after batch 0 is returned (two
    # workers x prefetch 2 hold batches 0-3), so only its read-ahead can have asked for it already.
    assert requested(samples, range(20, 25)) <= arrived


def test_a_failed_read_ahead_is_fetched_again_and_only_a_lasting_failure_is_the_samples(served, fault_proxy):
    proxy = fault_proxy(served)
    listing = list_webdataset(f"{proxy.endpoint}/{SHARDS}", DEFAULT_IMAGE_KEYS, store=ObjectStore("http", timeout=5.0))
    local = list_webdataset(f"{served}/{SHARDS}", DEFAULT_IMAGE_KEYS, store=ObjectStore("http"))
    samples = listing.shards
    (path, header), = requested(samples, [6])
    proxy.by_range[header] = "403"   # a permanent failure: the read-ahead's answer, not retried
    listing.prefetch([0], ahead=[[6]])
    assert listing.read(0) == local.read(0)
    deadline = time.monotonic() + 30
    while proxy.injected["403"] < 1 and time.monotonic() < deadline:   # the read-ahead was refused
        time.sleep(0.01)
    del proxy.by_range[header]
    assert listing.read(6) == local.read(6)   # fetched again, as without a read-ahead
    assert proxy.arrived.count((path, header)) == 2

    listing.stop_reading_ahead()
    proxy.by_range[header] = "403"   # and a failure that lasts is the sample's, named as before
    listing.prefetch([0], ahead=[[6]])
    with pytest.raises(ImageError, match=r"access to .*train-000000.tar denied \(403\)"):
        listing.read(6)
    assert proxy.arrived.count((path, header)) == 4   # the read-ahead's, then the read's own
    listing.stop_reading_ahead()


def waiting_fetches() -> list[asyncio.Task]:
    """The ranged GETs the process's client loop runs now and that have not finished."""
    async def look() -> list[asyncio.Task]:
        return [t for t in asyncio.all_tasks() if t.get_coro().__qualname__.endswith("_fetch_one")]

    return asyncio.run_coroutine_threadsafe(look(), fsspec.asyn.get_loop()).result()


def ended(tasks: list[asyncio.Task]) -> list[asyncio.Task]:
    """``tasks`` once each has ended (within 10 s)."""
    async def wait() -> list[asyncio.Task]:
        await asyncio.wait(tasks, timeout=10.0)
        return tasks

    return asyncio.run_coroutine_threadsafe(wait(), fsspec.asyn.get_loop()).result()


def stalled_loader(backend: str, served: str, fault_proxy):
    """A loader reading the shards in order, one batch at a time, whose batches 1 and 2 get no answer."""
    proxy = fault_proxy(served)
    loader = build_loader(TRAIN, backend, overrides=overrides(f"{proxy.endpoint}/{SHARDS}", **{
        "loader.workers": 0, "loader.prefetch": 1, **IN_ORDER}))
    proxy.stall_s = 20
    for _, header in requested(loader.listing.shards, range(5, 15)):
        proxy.by_range[header] = "stall"
    return loader


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_closing_the_loader_cancels_its_reads_ahead(backend, served, fault_proxy):
    loader = stalled_loader(backend, served, fault_proxy)
    epoch = iter(loader)   # held: an epoch's iterator dropped stops its reads ahead itself
    next(epoch)
    waiting = waiting_fetches()
    assert len(waiting) == 10   # the next two batches' GETs, read ahead
    loader.close()
    # Cancelled by the close: none left waiting in the background (for its timeout, or the server's answer)
    assert all(task.cancelled() for task in ended(waiting))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_an_epoch_iterator_dropped_after_one_batch_cancels_its_reads_ahead(backend, served, fault_proxy):
    loader = stalled_loader(backend, served, fault_proxy)
    next(iter(loader))   # the iterator is gone at once: no one will take batches 1 and 2
    deadline = time.monotonic() + 5.0
    while waiting_fetches() and time.monotonic() < deadline:
        time.sleep(0.05)
    # Not left on the wire for the server's 20 s stall or the request's timeout
    assert waiting_fetches() == []
    loader.close()
