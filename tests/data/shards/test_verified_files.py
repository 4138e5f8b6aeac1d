"""A loader's processes share which cached files they verified: a DataLoader worker forked from the
loader's process does not hash a shard again that the loader's process (or another worker) already
verified, and a file changed since is still verified again in every process."""
from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path

import pytest

from dali_bridge.data.shards import cache as cache_module
from dali_bridge.data.shards.cache import CachedShard, ShardCache
from dali_bridge.data.shards.verified import VerifiedFiles
from dali_bridge.tools.convert import convert

URL = "s3://bucket/train-000000.tar"


class OneShardStore:
    timeout = 2.0

    def __init__(self, data: bytes):
        self.data = data

    def fetch(self, ranges):
        return [self.data[r.start:r.start + r.size] for r in ranges]


@pytest.fixture(scope="module")
def shard_bytes(sample_root: Path, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    out = tmp_path_factory.mktemp("verified")
    folder = out / "images" / "a"
    folder.mkdir(parents=True)
    for image in sorted((sample_root / "class_000").iterdir())[:5]:
        (folder / image.name).write_bytes(image.read_bytes())
    convert(out / "images", str(out / "train-%06d.tar"), shard_size=10)
    return (out / "train-000000.tar").read_bytes()


def _cache(data: bytes, folder: Path) -> tuple[ShardCache, CachedShard]:
    return (ShardCache(folder, 10 * len(data), OneShardStore(data)),
            CachedShard(URL, len(data), "etag", hashlib.sha256(data).hexdigest()))


def _in_a_fork(work) -> int:
    """Run ``work()`` in a forked child, as a DataLoader worker runs; its exit status (0: returned True)."""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(0 if work() else 1)
        except BaseException:
            os._exit(2)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _hashes(monkeypatch) -> list[int]:
    hashed: list[int] = []
    real = cache_module._sha256
    monkeypatch.setattr(cache_module, "_sha256", lambda descriptor: hashed.append(os.getpid()) or real(descriptor))
    return hashed


def test_a_forked_worker_uses_a_shard_its_parent_verified_without_hashing_it(shard_bytes, tmp_path, monkeypatch):
    cache, shard = _cache(shard_bytes, tmp_path / "cache")
    hashed = _hashes(monkeypatch)
    os.close(cache.open(shard))   # downloaded and verified here
    assert hashed == [os.getpid()]

    def worker() -> bool:
        os.close(cache.open(shard))
        return hashed == [os.getppid()]   # nothing hashed in the child
    assert _in_a_fork(worker) == 0


def test_what_a_forked_worker_verifies_serves_its_parent_and_the_other_workers(shard_bytes, tmp_path, monkeypatch):
    cache, shard = _cache(shard_bytes, tmp_path / "cache")
    hashed = _hashes(monkeypatch)
    assert _in_a_fork(lambda: os.close(cache.open(shard)) is None and len(hashed) == 1) == 0
    assert _in_a_fork(lambda: os.close(cache.open(shard)) is None and hashed == []) == 0
    os.close(cache.open(shard))
    assert hashed == []


def test_a_shard_changed_after_the_parent_verified_it_is_verified_again_in_the_worker(shard_bytes, tmp_path,
                                                                                       monkeypatch):
    cache, shard = _cache(shard_bytes, tmp_path / "cache")
    os.close(cache.open(shard))
    path = cache.path_for(shard)
    status = path.stat()
    with open(path, "r+b") as handle:   # a byte flipped in place, its modification time put back
        handle.seek(len(shard_bytes) // 2)
        byte = handle.read(1)
        handle.seek(len(shard_bytes) // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))
    hashed = _hashes(monkeypatch)

    def worker() -> bool:
        descriptor = cache.open(shard)   # hashed, found damaged, fetched again, hashed again
        try:
            return len(hashed) == 2 and os.pread(descriptor, len(shard_bytes), 0) == shard_bytes
        finally:
            os.close(descriptor)
    assert _in_a_fork(worker) == 0


def test_a_slot_torn_by_two_writers_is_not_trusted():
    verified = VerifiedFiles(slots=16)
    verified.put("/cache/a.tar", (1, 2, 3, 4, 5, 6))
    assert verified.get("/cache/a.tar") == (1, 2, 3, 4, 5, 6)
    slot = verified._slots(verified._key("/cache/a.tar"))[0]
    verified._table[slot, 4] = 99   # one field of another write
    assert verified.get("/cache/a.tar") is None


def test_a_full_table_forgets_an_entry_and_never_answers_another_files_identity():
    verified = VerifiedFiles(slots=8)
    paths = [f"/cache/{n}.tar" for n in range(40)]
    for n, path in enumerate(paths):
        verified.put(path, (n, n, n, n, n, n))
    answers = [verified.get(path) for path in paths]
    assert all(answer in (None, (n,) * 6) for n, answer in enumerate(answers))
    assert answers[-1] == (39,) * 6 and answers.count(None) >= 40 - 8


def test_a_pickled_cache_a_spawned_process_gets_starts_with_nothing_verified(shard_bytes, tmp_path):
    cache, shard = _cache(shard_bytes, tmp_path / "cache")
    os.close(cache.open(shard))
    copy = pickle.loads(pickle.dumps(cache))
    assert copy._verified.get(str(cache.path_for(shard))) is None
    assert cache._verified.get(str(cache.path_for(shard))) is not None
