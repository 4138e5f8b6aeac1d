"""A node's bounded cache of whole shards (``source.cache: {dir, max_bytes}``).

A shard is downloaded whole on its first touch, into ``<name>.partial-<pid>``, checked against
the manifest's size and sha256, then renamed into place: a reader never sees half a shard. The
processes of a node share the folder; a lock file per shard makes one of them download while
the others wait for it (one download per shard per node). Before a download the folder is
trimmed, least recently used first, so that the shards and every partial download together
stay within ``max_bytes``. A cached file whose size is wrong, or whose sha256 differs the first
time a process uses it, is deleted and fetched again. Cache file names are a hash of the URL,
size and ETag: no bucket, path or credential shows in the file system.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from filelock import FileLock

from ...util.sizes import parse_size  # noqa: F401

from ..storage.store import ObjectStore
from ...util.urls import StorageError
from ...util.messages import package_log

log = package_log()

_SHARD_SUFFIX = ".tar"
_PARTIAL = ".partial-"
_LOCK_SUFFIX = ".lock"
_EVICTION_LOCK = ".eviction.lock"


class CacheError(StorageError):
    """A shard cannot be cached: larger than the bound, or damaged every time it is fetched."""


class CacheFull(CacheError):
    """A shard does not fit now without evicting shards that must stay (a read-ahead gives up on it)."""


@dataclass(frozen=True)
class CachedShard:
    """What the cache needs to know of a shard: where it is, what it must hold."""
    url: str
    size: int
    etag: str | None
    sha256: str | None   # from the converter's manifest; None: size checked only


class ShardCache:
    """Whole shards in ``folder``, at most ``max_bytes`` of them (partial downloads included)."""

    def __init__(self, folder: str | Path, max_bytes: int, store: ObjectStore):
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self.store = store
        self._checked: set[str] = set()   # files whose sha256 this process has verified
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __getstate__(self) -> dict:
        return {"folder": self.folder, "max_bytes": self.max_bytes, "store": self.store}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["folder"], state["max_bytes"], state["store"])

    def path_for(self, shard: CachedShard) -> Path:
        key = f"{shard.url}\n{shard.size}\n{shard.etag}".encode()
        return self.folder / (hashlib.sha256(key).hexdigest()[:40] + _SHARD_SUFFIX)

    def ensure(self, shard: CachedShard, *, keep: Iterable[CachedShard] = (), wait: bool = True) -> Path:
        """The local path of ``shard``, downloaded (once per node) if it is not cached yet.

        ``keep``: shards that must not be evicted to make room for it (a read-ahead spares the shards
        still in use); ``wait=False``: raise :class:`CacheFull` at once, instead of waiting for other
        downloads, when it does not fit without evicting them."""
        if self._pid != os.getpid():
            self._checked, self._lock, self._pid = set(), threading.Lock(), os.getpid()
        path = self.path_for(shard)
        if self._usable(path, shard):
            os.utime(path)  # recently used: the last to be evicted
            return path
        if shard.size > self.max_bytes:
            raise CacheError(f"{shard.url} is {shard.size:,} bytes, more than source.cache.max_bytes "
                             f"({self.max_bytes:,}): raise the bound or use ranged reads (no source.cache)")
        self.folder.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + _LOCK_SUFFIX):
            if self._usable(path, shard):  # another process fetched it while this one waited
                return path
            spared = {self.path_for(kept) for kept in keep}
            for _ in range(2):
                self._download(shard, path, spared, wait)
                if self._usable(path, shard):
                    return path
                log.warning("dali-bridge: %s was damaged after download (sha256 or size); fetching it again",
                            shard.url)
        raise CacheError(f"{shard.url}: the downloaded shard does not match the manifest's size "
                         f"{shard.size:,} and sha256 {shard.sha256}: re-run `dali-bridge verify` on it")

    def _usable(self, path: Path, shard: CachedShard) -> bool:
        """Whether ``path`` holds the shard; a damaged file is deleted (and fetched again by the caller)."""
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return False
        if size == shard.size and (shard.sha256 is None or str(path) in self._checked
                                   or _sha256(path) == shard.sha256):
            with self._lock:
                self._checked.add(str(path))
            return True
        log.warning("dali-bridge: cached shard %s (%s) is damaged: deleted, fetching it again", path.name, shard.url)
        path.unlink(missing_ok=True)
        return False

    def _download(self, shard: CachedShard, path: Path, spared: set[Path], wait: bool) -> None:
        partial = Path(f"{path}{_PARTIAL}{os.getpid()}")
        try:
            self._reserve(partial, shard.size, keep=spared | {path}, wait=wait)
            self.store.download(shard.url, str(partial), shard.size, shard.etag)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)

    def _reserve(self, partial: Path, size: int, keep: set[Path], wait: bool) -> None:
        """Make room for ``size`` bytes and claim it: ``partial`` is created at its full size (sparse),
        so every process that trims the folder counts it. Least recently used shards are evicted
        first, never those in ``keep``; partial downloads are never evicted (their owners are
        writing them) — when only they stand in the way, wait for them up to ``source.timeout``
        (or, without ``wait``, raise :class:`CacheFull`)."""
        deadline = time.monotonic() + self.store.timeout
        while True:
            with FileLock(str(self.folder / _EVICTION_LOCK)):  # one process trims and claims at a time
                if self._trim(size, keep) + size <= self.max_bytes:
                    with open(partial, "wb") as handle:
                        handle.truncate(size)
                    return
            if not wait:
                raise CacheFull(f"source.cache.max_bytes ({self.max_bytes:,}) cannot hold {size:,} more bytes "
                                f"without evicting shards in use")
            if time.monotonic() > deadline:
                raise CacheError(f"source.cache.max_bytes ({self.max_bytes:,}) cannot hold {size:,} more bytes "
                                 f"while other downloads fill {self.folder}: raise the bound")
            time.sleep(0.1)

    def _trim(self, incoming: int, keep: set[Path]) -> int:
        """Evict least recently used shards (not those in ``keep``) until ``incoming`` more bytes fit;
        the bytes then used. Nothing is evicted when even that would not make room."""
        entries = []
        for entry in os.scandir(self.folder):
            if entry.name.endswith(_LOCK_SUFFIX) or not entry.is_file():
                continue
            try:
                status = entry.stat()
            except FileNotFoundError:
                continue
            entries.append((status.st_mtime, entry.path, status.st_size, _PARTIAL in entry.name))
        used = sum(size for _, _, size, _ in entries)
        kept = {str(path) for path in keep}
        victims = []
        for _, victim, size, partial in sorted(entries):
            if used + incoming <= self.max_bytes:
                break
            if partial or victim in kept:
                continue
            victims.append((victim, size))
            used -= size
        if used + incoming > self.max_bytes:
            # Evicting would not make room (partial downloads or kept shards stand in the way):
            # keep every shard rather than lose some for nothing.
            return used + sum(size for _, size in victims)
        for victim, _ in victims:
            Path(victim).unlink(missing_ok=True)  # a reader holding it open keeps its bytes
        return used


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_usage(folder: str | Path) -> int:
    """Bytes the cache's shards and partial downloads take on disk now."""
    try:
        return sum(e.stat().st_size for e in os.scandir(folder) if e.is_file() and not e.name.endswith(_LOCK_SUFFIX))
    except FileNotFoundError:
        return 0
