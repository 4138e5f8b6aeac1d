"""A node's bounded cache of whole shards (``source.cache: {dir, max_bytes}``).

A shard is downloaded whole on its first touch, into ``<name>.partial-<random>`` (created with
``O_CREAT|O_EXCL|O_NOFOLLOW`` and written through that descriptor only), checked against the
manifest's size and sha256, then renamed into place: a reader never sees half a shard. The
processes of a node share the folder; a lock file per shard makes one of them download while
the others wait for it (one download per shard per node). Before a download the folder is
trimmed, least recently used first, so that the shards and every partial download together
stay within ``max_bytes``. Nothing in the folder is followed through a link: a link (or any
other non-file) at a shard's name is removed and the shard fetched again, one at a lock's name
is refused. A cached file whose size is wrong, or whose sha256 differs, is deleted and fetched
again; the sha256 is checked the first time the loader's processes use the file (its process and
its forked workers share what they verified: :mod:`dali_bridge.data.shards.verified`) and again
whenever the file's identity (device, inode and its generation, size, modification and change
times) differs from the one verified, before and after each read. Cache file names are a hash of
the URL, size and ETag: no bucket, path or credential shows in the file system.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from ...util.sizes import parse_size  # noqa: F401

from ..storage.store import ObjectStore, pieces
from ...util.urls import StorageError
from ...util.messages import package_log
from .verified import VerifiedFiles

log = package_log()

_SHARD_SUFFIX = ".tar"
_PARTIAL = ".partial-"
_LOCK_SUFFIX = ".lock"
_EVICTION_LOCK = ".eviction.lock"
# Never followed, never blocking (a FIFO planted at a name), never inherited by a child process.
_NO_LINK = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_PIECE = 16 << 20   # bytes per ranged GET of a download, four in flight


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


# FS_IOC_GETVERSION (Linux, _IOR('v', 1, long)): the inode's generation, which ext4, XFS and btrfs draw
# anew whenever they give a freed inode number to a new file (ext4 does so at once). File systems write
# an int or a long into the 8 bytes: either reads back the same for the same file, all that is compared.
_GET_GENERATION = 0x80087601


def _generation(descriptor: int) -> int:
    """The open file's inode generation; 0 where the file system keeps none (tmpfs) or this is not Linux."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        return struct.unpack("q", fcntl.ioctl(descriptor, _GET_GENERATION, bytes(8)))[0]
    except OSError:
        return 0


def _identity(status: os.stat_result, generation: int) -> tuple[int, ...]:
    """What changes when a file is replaced, rewritten, cut or has its times reset: its device, inode
    and inode ``generation`` (:func:`_generation`: tells a new file that reuses a freed inode number
    from the old one), size, modification and change times (the kernel sets the change time; no one
    can set it back)."""
    return status.st_dev, status.st_ino, generation, status.st_size, status.st_mtime_ns, status.st_ctime_ns


def _file_mode() -> int:
    """The mode a plain ``open()`` would give a new file (``mkstemp`` makes 0600): 0666 less the umask,
    read from ``/proc`` (setting and restoring the umask would change it for every thread)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o644


@contextlib.contextmanager
def _locked(lock: Path) -> Iterator[None]:
    """Hold ``lock`` (``flock``), opened without following a link and never truncated: a link planted
    at its name is refused, a file planted there is only locked, never written."""
    try:
        descriptor = os.open(lock, os.O_RDWR | os.O_CREAT | _NO_LINK, 0o644)
    except OSError as exc:
        link = " (a link stands at its name: remove it)" if exc.errno == errno.ELOOP else ""
        raise CacheError(f"cannot open the cache's lock file {lock}: {exc.strerror or exc}{link}") from None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise CacheError(f"the cache's lock file {lock} is not a regular file: remove it")
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)   # releases the lock


class ShardCache:
    """Whole shards in ``folder``, at most ``max_bytes`` of them (partial downloads included)."""

    def __init__(self, folder: str | Path, max_bytes: int, store: ObjectStore):
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self.store = store
        self._verified = VerifiedFiles()   # file → the identity whose sha256 a process of this loader verified
        self._paths: dict[CachedShard, Path] = {}   # path_for's answers: a sample's read asks twice

    def __getstate__(self) -> dict:
        return {"folder": self.folder, "max_bytes": self.max_bytes, "store": self.store}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["folder"], state["max_bytes"], state["store"])

    def path_for(self, shard: CachedShard) -> Path:
        path = self._paths.get(shard)
        if path is None:   # made once: otherwise a third of a cached sample's read
            key = f"{shard.url}\n{shard.size}\n{shard.etag}".encode()
            path = self._paths[shard] = self.folder / (hashlib.sha256(key).hexdigest()[:40] + _SHARD_SUFFIX)
        return path

    def ensure(self, shard: CachedShard, *, keep: Iterable[CachedShard] = (), wait: bool = True) -> Path:
        """The local path of ``shard``, downloaded (once per node) if it is not cached yet.

        ``keep``: shards that must not be evicted to make room for it (a read-ahead spares the shards
        still in use); ``wait=False``: raise :class:`CacheFull` at once, instead of waiting for other
        downloads, when it does not fit without evicting them."""
        os.close(self.open(shard, keep=keep, wait=wait))
        return self.path_for(shard)

    def open(self, shard: CachedShard, *, keep: Iterable[CachedShard] = (), wait: bool = True) -> int:
        """:meth:`ensure`, returning a read-only descriptor on the verified file (the caller closes it);
        read from it, then ask :meth:`unchanged` whether what was read is still what was verified."""
        path = self.path_for(shard)
        descriptor = self._open_verified(path, shard)
        if descriptor is not None:
            self._touch(path)  # recently used: the last to be evicted
            return descriptor
        if shard.size > self.max_bytes:
            raise CacheError(f"{shard.url} is {shard.size:,} bytes, more than source.cache.max_bytes "
                             f"({self.max_bytes:,}): raise the bound or use ranged reads (no source.cache)")
        self.folder.mkdir(parents=True, exist_ok=True)
        with _locked(Path(str(path) + _LOCK_SUFFIX)):
            descriptor = self._open_verified(path, shard)
            if descriptor is not None:  # another process fetched it while this one waited
                return descriptor
            spared = {self.path_for(kept) for kept in keep}
            for _ in range(2):
                self._download(shard, path, spared, wait)
                descriptor = self._open_verified(path, shard, fresh=True)
                if descriptor is not None:
                    return descriptor
                log.warning("dali-bridge: %s was damaged after download (sha256 or size); fetching it again",
                            shard.url)
        raise CacheError(f"{shard.url}: the downloaded shard does not match the manifest's size "
                         f"{shard.size:,} and sha256 {shard.sha256}: re-run `dali-bridge verify` on it")

    def unchanged(self, descriptor: int, shard: CachedShard) -> bool:
        """Whether the file open at ``descriptor`` is still the one verified (its identity unchanged
        since; for a shard without a recorded sha256, its size)."""
        status = os.fstat(descriptor)
        if shard.sha256 is None:
            return status.st_size == shard.size
        verified = self._verified.get(str(self.path_for(shard)))
        if verified is None:
            return False
        # Asked before and after every read: no ioctl here. An inode held open is never given to another
        # file, so with the device and inode verified its generation is the one verified too.
        current = _identity(status, verified[2])
        if status.st_nlink == 0:   # evicted while read: unlinking sets the change time
            return verified[:-1] == current[:-1]
        return verified == current

    def _open_verified(self, path: Path, shard: CachedShard, *, fresh: bool = False) -> int | None:
        """A descriptor on the file at ``path`` if it holds the shard; None when it is absent, or was
        removed as damaged or as a link (the caller fetches it again). ``fresh``: this process has just
        downloaded it (an identity verified before is another file's, whatever its inode)."""
        try:
            descriptor = os.open(path, os.O_RDONLY | _NO_LINK)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise CacheError(f"cannot open the cached copy of {shard.url} ({path}): "
                                 f"{exc.strerror or exc}") from None
            log.warning("dali-bridge: a link stands at the cached shard's name %s (%s): removed, never followed; "
                        "fetching the shard again", path, shard.url)
            path.unlink(missing_ok=True)
            return None
        try:
            status = os.fstat(descriptor)
            if stat.S_ISREG(status.st_mode) and self._holds(descriptor, status, path, shard, fresh=fresh):
                return descriptor
        except BaseException:
            os.close(descriptor)
            raise
        os.close(descriptor)
        what = "is damaged" if stat.S_ISREG(status.st_mode) else "is not a regular file"
        log.warning("dali-bridge: cached shard %s (%s) %s: deleted, fetching it again", path.name, shard.url, what)
        self._remove(path, status)
        return None

    def _holds(self, descriptor: int, status: os.stat_result, path: Path, shard: CachedShard, *,
               fresh: bool = False) -> bool:
        """Whether the open file is the shard: its size, and its sha256 unless a process of the loader
        verified this very file (same identity) before."""
        if status.st_size != shard.size:
            return False
        identity = _identity(status, _generation(descriptor))
        verified = self._verified.get(str(path))
        if shard.sha256 is None or verified == identity:
            return True
        # After its own download (``fresh``) an identity verified before was another file's: inode
        # numbers are reused. Otherwise the same inode (number and generation) with other bytes or times
        # was changed in place; another inode is the shard evicted and fetched again, as a cache does
        # (by another process too: a reused inode number comes with a new generation where the file
        # system keeps one).
        if verified is not None and not fresh:
            if verified[:3] == identity[:3]:
                log.warning("dali-bridge: cached shard %s (%s) changed since it was verified (size or times of "
                            "the same file): checking its sha256 again", path.name, shard.url)
            else:
                log.info("dali-bridge: cached shard %s (%s) is another file than the one verified (fetched "
                         "again since): checking its sha256", path.name, shard.url)
        if _sha256(descriptor) != shard.sha256:
            return False
        self._verified.put(str(path), identity)   # as before the hash: a change while hashing is seen next time
        return True

    def _remove(self, path: Path, status: os.stat_result) -> None:
        """Remove what stands at ``path`` if it is still the file seen (``status``): never a shard another
        process has renamed into place since."""
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.lstat(path), status):
                if stat.S_ISDIR(status.st_mode):
                    raise CacheError(f"a folder stands at the cached shard's name {path}: remove it")
                path.unlink()

    def _touch(self, path: Path) -> None:
        """Mark the shard recently used on its lock file, not on the shard: the shard's own times stay
        those verified."""
        lock = str(path) + _LOCK_SUFFIX
        try:
            os.utime(lock, follow_symlinks=False)
        except FileNotFoundError:
            with contextlib.suppress(OSError):
                os.close(os.open(lock, os.O_WRONLY | os.O_CREAT | _NO_LINK, 0o644))
        except OSError:
            pass

    def _download(self, shard: CachedShard, path: Path, spared: set[Path], wait: bool) -> None:
        descriptor, partial = self._reserve(path, shard.size, keep=spared | {path}, wait=wait)
        try:
            try:
                self._fill(descriptor, shard)
            finally:
                os.close(descriptor)
            os.replace(partial, path)   # replaces whatever stands at the name (a link too), never follows it
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(partial)

    def _fill(self, descriptor: int, shard: CachedShard) -> None:
        """Write the shard's bytes through ``descriptor``: ranged GETs, four at a time, each retried as a
        sample's read is; :class:`StorageError` naming the failed range."""
        for offset, data in pieces(self.store, shard.url, shard.size, shard.etag, piece=_PIECE):
            view = memoryview(data)
            while view:
                written = os.pwrite(descriptor, view, offset)
                view, offset = view[written:], offset + written

    def _reserve(self, path: Path, size: int, keep: set[Path], wait: bool) -> tuple[int, str]:
        """Make room for ``size`` bytes and claim it: a partial download (a new file of an unpredictable
        name, ``O_CREAT|O_EXCL|O_NOFOLLOW``) made at its full size (sparse), so every process that trims
        the folder counts it; its descriptor and name. Least recently used shards are evicted first,
        never those in ``keep``; partial downloads are never evicted (their owners are writing them) —
        when only they stand in the way, wait for them up to ``source.timeout`` (or, without ``wait``,
        raise :class:`CacheFull`)."""
        deadline = time.monotonic() + self.store.timeout
        while True:
            with _locked(self.folder / _EVICTION_LOCK):  # one process trims and claims at a time
                if self._trim(size, keep) + size <= self.max_bytes:
                    descriptor, partial = tempfile.mkstemp(dir=self.folder, prefix=path.name + _PARTIAL)
                    try:
                        os.fchmod(descriptor, _file_mode())
                        os.ftruncate(descriptor, size)
                    except BaseException:
                        os.close(descriptor)
                        os.unlink(partial)
                        raise
                    return descriptor, partial
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
        entries, used_at = [], {}
        for entry in os.scandir(self.folder):
            try:
                status = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            if entry.name.endswith(_LOCK_SUFFIX):
                used_at[entry.name[:-len(_LOCK_SUFFIX)]] = status.st_mtime
            elif stat.S_ISREG(status.st_mode):
                entries.append((status.st_mtime, entry.name, status.st_size, _PARTIAL in entry.name))
        entries = [(max(mtime, used_at.get(name, 0.0)), str(self.folder / name), size, partial)
                   for mtime, name, size, partial in entries]
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


def _sha256(descriptor: int) -> str:
    digest, offset = hashlib.sha256(), 0
    while block := os.pread(descriptor, 1 << 20, offset):
        digest.update(block)
        offset += len(block)
    return digest.hexdigest()


def cache_usage(folder: str | Path) -> int:
    """Bytes the cache's shards and partial downloads take on disk now (links and lock files not counted)."""
    try:
        return sum(e.stat(follow_symlinks=False).st_size for e in os.scandir(folder)
                   if e.is_file(follow_symlinks=False) and not e.name.endswith(_LOCK_SUFFIX))
    except FileNotFoundError:
        return 0
