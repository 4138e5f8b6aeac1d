"""The node's shard cache in a folder others can write: nothing it writes or opens goes through a
link planted at one of its names, and a cached shard changed while a process runs is checked
against the manifest again before its bytes are used."""
from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import pytest

from dali_bridge.data.shards.cache import CacheError, CachedShard, ShardCache
from dali_bridge.data.shards.remote import CachedShardSamples
from dali_bridge.data.shards.tar import scan_shard
from dali_bridge.data.storage.listing import FetchError
from dali_bridge.data.storage.store import ObjectStore
from dali_bridge.tools.convert import convert

URL = "s3://bucket/train-000000.tar"


class FolderStore:
    """The part of an :class:`ObjectStore` the cache uses, serving one local file at :data:`URL`,
    counting the bytes it serves."""

    timeout = 2.0

    def __init__(self, path: Path):
        self.data = path.read_bytes()
        self.served = 0

    def fetch(self, ranges):
        out = []
        for request in ranges:
            chunk = self.data[request.start:request.start + request.size]
            self.served += len(chunk)
            out.append(chunk if request.url == URL else FetchError(f"GET {request.url}: not found", missing=True))
        return out

    def download(self, url, path, size, etag=None):   # the store's own, over this fetch
        ObjectStore.download(self, url, path, size, etag)


@pytest.fixture(scope="module")
def shard_file(sample_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("cache-shards")
    convert(sample_root, str(out / "train-%06d.tar"), shard_size=10)
    return out / "train-000000.tar"


def _setup(shard_file: Path, folder: Path, *, digest: bool = True) -> tuple[ShardCache, CachedShard, FolderStore]:
    store = FolderStore(shard_file)
    sha = hashlib.sha256(store.data).hexdigest() if digest else None
    return ShardCache(folder, 10 * len(store.data), store), CachedShard(URL, len(store.data), "etag", sha), store


def _victim(tmp_path: Path, size: int = 7) -> Path:
    victim = tmp_path / "outside" / "precious.bin"
    victim.parent.mkdir(exist_ok=True)
    victim.write_bytes(b"keep me" + bytes(size - 7))
    return victim


def _samples(shard_file: Path, cache: ShardCache, shard: CachedShard) -> tuple[CachedShardSamples, list]:
    scan = scan_shard(str(shard_file), ("jpg",), "cls")
    samples = CachedShardSamples((URL,), [0] * len(scan.offsets), scan.offsets, scan.sizes, ("etag",), cache.store,
                                 cache, (shard.size,), (shard.sha256,))
    data = shard_file.read_bytes()
    return samples, [data[o:o + s] for o, s in zip(scan.offsets, scan.sizes)]


def test_links_planted_at_the_partial_download_names_are_never_written_through(shard_file, tmp_path):
    cache, shard, _ = _setup(shard_file, tmp_path / "c")
    victim = _victim(tmp_path)
    cache.folder.mkdir()
    final = cache.path_for(shard)
    for pid in {os.getpid(), os.getppid(), 1, 99999}:   # every name a process id would make
        os.symlink(victim, f"{final}.partial-{pid}")
    path = cache.ensure(shard)
    assert victim.read_bytes() == b"keep me"
    assert not path.is_symlink() and path.read_bytes() == shard_file.read_bytes()
    assert all(Path(f"{final}.partial-{pid}").is_symlink() for pid in {os.getpid(), 1})   # not ours: left alone


def test_a_partial_download_is_a_new_file_of_an_unpredictable_name(shard_file, tmp_path, monkeypatch):
    cache, shard, _ = _setup(shard_file, tmp_path / "c")
    seen = []
    real_open = os.open

    def watching(path, flags, *args, **kwargs):
        if ".partial-" in os.fspath(path):
            seen.append((os.path.basename(path), flags))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", watching)
    cache.ensure(shard)
    assert seen, "the partial download was not created by os.open"
    for name, flags in seen:
        assert flags & os.O_CREAT and flags & os.O_EXCL and flags & os.O_NOFOLLOW, name
        assert not name.endswith(f".partial-{os.getpid()}"), name


@pytest.mark.parametrize("which", ["shard", "eviction"])
def test_a_link_planted_at_a_lock_name_is_refused_never_written_through(shard_file, tmp_path, which):
    cache, shard, _ = _setup(shard_file, tmp_path / "c")
    victim = _victim(tmp_path)
    cache.folder.mkdir()
    lock = Path(f"{cache.path_for(shard)}.lock") if which == "shard" else cache.folder / ".eviction.lock"
    os.symlink(victim, lock)
    with pytest.raises(CacheError, match=rf"cannot open the cache's lock file {lock}: .*a link stands at its name"):
        cache.ensure(shard)
    assert victim.read_bytes() == b"keep me" and lock.is_symlink()


@pytest.mark.parametrize("digest", [True, False])
def test_a_link_planted_at_the_shard_name_is_removed_and_the_shard_fetched(shard_file, tmp_path, caplog, digest):
    cache, shard, store = _setup(shard_file, tmp_path / "c", digest=digest)
    victim = _victim(tmp_path, size=shard.size)   # the shard's size: a size check alone would take it
    before = victim.stat()
    cache.folder.mkdir()
    os.symlink(victim, cache.path_for(shard))
    samples, expected = _samples(shard_file, cache, shard)
    with caplog.at_level(logging.WARNING, logger="dali_bridge"):
        assert samples.read(0) == expected[0]
    path = cache.path_for(shard)
    assert not path.is_symlink() and path.read_bytes() == shard_file.read_bytes()
    assert victim.read_bytes()[:7] == b"keep me" and victim.stat().st_mtime_ns == before.st_mtime_ns
    assert "a link stands at the cached shard's name" in caplog.text


def test_a_fifo_at_the_shard_name_neither_blocks_nor_is_read(shard_file, tmp_path):
    cache, shard, _ = _setup(shard_file, tmp_path / "c")
    cache.folder.mkdir()
    os.mkfifo(cache.path_for(shard))
    path = cache.ensure(shard)
    assert path.is_file() and path.read_bytes() == shard_file.read_bytes()


def test_links_in_the_folder_are_not_counted_or_evicted_through(shard_file, tmp_path):
    cache, shard, _ = _setup(shard_file, tmp_path / "c")
    big = tmp_path / "outside" / "big.bin"
    big.parent.mkdir()
    big.write_bytes(bytes(20 * shard.size))   # counted through the link, it would leave no room
    cache.folder.mkdir()
    os.symlink(big, cache.folder / "0123456789.tar")
    assert cache.ensure(shard).is_file()
    assert big.stat().st_size == 20 * shard.size


def test_bytes_changed_in_a_verified_cached_shard_are_detected_and_fetched_again(shard_file, tmp_path, caplog):
    cache, shard, store = _setup(shard_file, tmp_path / "c")
    samples, expected = _samples(shard_file, cache, shard)
    assert samples.read(1) == expected[1]
    path = cache.path_for(shard)
    offset = int(samples.offset[1]) + 200
    status = path.stat()
    with open(path, "r+b") as handle:   # eight flipped bytes of image data, same size
        handle.seek(offset)
        flipped = bytes(b ^ 0xFF for b in handle.read(8))
        handle.seek(offset)
        handle.write(flipped)
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns))   # and its modification time put back
    with caplog.at_level(logging.WARNING, logger="dali_bridge"):
        assert samples.read(1) == expected[1]
    assert "changed since it was verified" in caplog.text and "is damaged: deleted" in caplog.text
    assert path.read_bytes() == shard_file.read_bytes()


def test_an_unchanged_cached_shard_is_hashed_once_and_not_fetched_again(shard_file, tmp_path, monkeypatch):
    from dali_bridge.data.shards import cache as cache_module

    cache, shard, store = _setup(shard_file, tmp_path / "c")
    samples, expected = _samples(shard_file, cache, shard)
    hashed = []
    real = cache_module.hashlib.sha256
    # A file's content is hashed from an empty sha256 (a name's from its key, at once).
    monkeypatch.setattr(cache_module.hashlib, "sha256", lambda *a: (hashed.append(a) if not a else None) or real(*a))
    assert [samples.read(i) for i in range(len(expected))] * 2 == expected * 2
    assert store.served == shard.size and len(hashed) == 1


def test_a_shard_replaced_by_another_file_of_the_same_size_is_verified_again(shard_file, tmp_path):
    cache, shard, store = _setup(shard_file, tmp_path / "c")
    samples, expected = _samples(shard_file, cache, shard)
    assert samples.read(0) == expected[0]
    path = cache.path_for(shard)
    forged = bytearray(path.read_bytes())
    forged[int(samples.offset[0]) + 100] ^= 0x55
    replacement = path.with_name("elsewhere")
    replacement.write_bytes(bytes(forged))
    os.replace(replacement, path)
    assert samples.read(0) == expected[0]
    assert store.served == 2 * shard.size


def test_a_shard_evicted_and_fetched_again_by_this_process_is_not_reported_as_changed(shard_file, tmp_path, caplog):
    cache, shard, store = _setup(shard_file, tmp_path / "c")
    samples, expected = _samples(shard_file, cache, shard)
    for _ in range(3):   # verified, evicted (as another process's trim does), fetched and verified again
        assert samples.read(0) == expected[0]
        with caplog.at_level(logging.INFO, logger="dali_bridge"):
            cache.path_for(shard).unlink()
            assert samples.read(0) == expected[0]
    assert store.served == 4 * shard.size
    assert "changed since it was verified" not in caplog.text and "WARNING" not in [r.levelname for r in caplog.records]


def test_a_shard_fetched_again_by_another_process_into_a_reused_inode_is_not_reported_as_changed(
        shard_file, tmp_path, caplog):
    from dali_bridge.data.shards.cache import _generation

    cache, shard, _ = _setup(shard_file, tmp_path / "c")
    other, _, _ = _setup(shard_file, tmp_path / "c")   # another rank's loader: a table of its own
    samples, expected = _samples(shard_file, cache, shard)
    assert samples.read(0) == expected[0]
    path = cache.path_for(shard)
    before = path.stat()
    with open(path, "rb") as handle:
        if not _generation(handle.fileno()):
            pytest.skip(f"{tmp_path} keeps no inode generations: a reused inode number looks like the same file")
    for _ in range(20):   # evicted and fetched again by the other rank, until its file gets the same inode number
        path.unlink()
        os.close(other.open(shard))
        if path.stat().st_ino == before.st_ino:
            break
    else:
        pytest.skip(f"{tmp_path}'s file system gave the new file another inode number in 20 tries")
    with caplog.at_level(logging.INFO, logger="dali_bridge"):
        assert samples.read(0) == expected[0]
    assert "is another file than the one verified" in caplog.text
    assert "changed since it was verified" not in caplog.text
