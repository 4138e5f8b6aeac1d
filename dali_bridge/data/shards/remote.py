"""WebDataset shards in object storage: listed from their indexes without reading the data, each
sample then one ranged GET of exactly its bytes, a batch's samples fetched together.

Listing a URL pattern costs the store's LIST of the shards and indexes (on S3 one request per
1,000 keys; over HTTP, which has no LIST, a HEAD each), the manifest and one GET per index, all
concurrent (``source.max_requests`` in flight): the labels come from the manifest,
which ``dali-bridge convert`` writes with each shard's labels and its index's sha256. A shard
the manifest does not describe so (an older manifest, none, another index) costs one small
ranged GET per label member instead, with a warning naming the cost; each includes the tar
header before the label, so an index that does not describe its shard is refused, as a local
one is. Listings are cached locally keyed by the shard's URL, size and ETag, so the next run on
the node lists from disk. A shard without a usable index is downloaded whole once to be scanned
(a warning names the cost).
Every ranged GET carries the ETag seen at listing (``If-Match``): an object replaced since then
is an error naming it, never other bytes under the old offsets.
"""
from __future__ import annotations

import hashlib
import json
import os
import tarfile
import tempfile
import threading
import weakref
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ...errors import ImageError
from .cache import CachedShard, ShardCache
from .tar import Member, ShardScan, index_path, parse_header, parse_index, scan_members, scan_shard
from ..storage.store import ObjectStore, Range
from ..storage.listing import FetchError, ObjectInfo
from ...util.urls import StorageError, redact, split_url
from ...util.wording import plural
from ...util.messages import package_log

log = package_log()

LISTING_CACHE_VERSION = 1
# Shards listed at once (each its labels' GETs in flight through the shared request limit).
LISTING_THREADS = 16
# Shards without an index downloaded at once to be scanned: each is a temporary file on disk.
STREAM_SCANS = 4
BLOCK = tarfile.BLOCKSIZE


def listing_cache_dir() -> Path:
    """Where remote shard listings are cached: ``$XDG_CACHE_HOME/dali-bridge/listings`` (~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dali-bridge" / "listings"


def _cache_file(folder: Path, url: str, info: ObjectInfo, image_keys: tuple[str, ...], label_key: str) -> Path:
    # Hashed: a URL may name a bucket or path the file system should not see in a file name.
    key = json.dumps([LISTING_CACHE_VERSION, url, info.size, info.etag, list(image_keys), label_key])
    return folder / (hashlib.sha256(key.encode()).hexdigest() + ".json")


def _cached_scan(path: Path) -> ShardScan | None:
    try:   # never through a link planted at the name: a listing another file's content would make
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as handle:
            data = json.loads(handle.read().decode("utf-8"))
        scan = ShardScan(**{k: v for k, v in data.items() if k != "ignored"})
        scan.ignored.update(data["ignored"])
    except (OSError, ValueError, TypeError, KeyError):
        return None  # absent or damaged: list again
    lengths = {len(scan.keys), len(scan.image_names), len(scan.offsets), len(scan.sizes), len(scan.labels)}
    return scan if len(lengths) == 1 and not scan.problems else None


def _store_scan(path: Path, scan: ShardScan) -> None:
    """Write a clean scan atomically (a reader never sees half a file); a cache that cannot be
    written only costs the next run a listing."""
    if scan.problems:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, partial = tempfile.mkstemp(dir=path.parent, prefix=".listing-", suffix=".partial")
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump({**asdict(scan), "ignored": dict(scan.ignored)}, handle)
        os.replace(partial, path)
    except OSError as exc:
        log.debug("dali-bridge: cannot cache a shard listing in %s: %s", path.parent, exc)


def _scan_from_index(store: ObjectStore, url: str, info: ObjectInfo, text: str, image_keys: tuple[str, ...],
                     label_key: str, known_labels: list[int] | None = None) -> ShardScan | None:
    """A shard's scan from its index text and label GETs (or the manifest's ``known_labels``, and no
    GET); None if the index is not usable."""
    scan = ShardScan(from_index=True)
    name = split_url(url)[1]
    members = parse_index(text, split_url(index_path(url))[1], name, info.size, scan)
    if members is None:
        return None
    if known_labels is not None:
        scan_members(name, members, image_keys, label_key, scan, known_labels=known_labels)
        return scan

    def read_labels(labels: list[Member]) -> list[bytes | None]:
        # Each label with the tar header before it: the header must name the member the index
        # names, at the indexed size — a stale or foreign index is refused, at no extra request.
        got = store.fetch([Range(url, offset - BLOCK, BLOCK + size, info.etag) for _, offset, size in labels])
        out: list[bytes | None] = []
        for member, answer in zip(labels, got):
            if isinstance(answer, FetchError):
                scan.problems.append(f"{name}: {answer.reason}")
                out.append(None)
                continue
            problem = _header_problem(answer[:BLOCK], member)
            if problem:
                scan.problems.append(f"{split_url(index_path(url))[1]} disagrees with {name}: {problem} — "
                                     f"delete the index or re-create it from the shard")
                out.append(None)
                continue
            out.append(answer[BLOCK:])
        return out

    if members:
        scan_members(name, members, image_keys, label_key, scan, read_labels)
    return scan


def _header_problem(block: bytes, member: Member) -> str | None:
    """Why the tar header ``block`` is not that of ``member`` (name, offset, size), or None."""
    name, offset, size = member
    try:
        header = parse_header(block, offset - BLOCK)
    except ValueError as exc:
        return str(exc)
    encoded = name.encode("utf-8", "surrogateescape")
    named = header is not None and (header.name == name or len(encoded) > 100 or not encoded.isascii())
    if header is None or not header.regular or header.size != size or not named:
        found = "an end-of-archive block" if header is None else f"{header.name} ({header.size} bytes)"
        return f"the index places {name} ({size} bytes) at byte {offset}, where the tar holds {found}"
    return None


def _scan_by_download(store: ObjectStore, url: str, info: ObjectInfo, image_keys: tuple[str, ...],
                      label_key: str) -> ShardScan:
    """Download the shard once into a temporary folder and scan its tar headers there."""
    name = split_url(url)[1]
    with tempfile.TemporaryDirectory(prefix="dali-bridge-scan-") as folder:
        local = os.path.join(folder, name)
        try:
            store.download(url, local, info.size, info.etag)
        except StorageError as exc:
            scan = ShardScan()
            scan.problems.append(f"{name}: {exc}")
            return scan
        return scan_shard(local, image_keys, label_key, use_index=False)


def manifest_labels(manifest: dict | None, label_key: str) -> dict[str, tuple[str, list[int]]]:
    """Shard file name → (its index's sha256, its samples' labels in tar order), for the shards whose
    manifest entry records both (``dali-bridge convert`` writes them) under this label key."""
    if manifest is None or manifest.get("label_key", "cls") != label_key:
        return {}
    known = {}
    for entry in manifest.get("shards", []):
        digest, text = entry.get("index_sha256"), entry.get("labels")
        if not isinstance(digest, str) or not isinstance(text, str):
            continue
        words = text.split()
        if len(words) == entry["samples"] and all(w.isascii() and w.isdigit() for w in words):
            known[entry["file"]] = (digest, [int(w) for w in words])
    return known


def list_remote_shards(store: ObjectStore, urls: list[str], image_keys: tuple[str, ...], label_key: str,
                       cache_dir: Path | None = None, manifest: Callable[[], dict | None] = lambda: None
                       ) -> tuple[list[ShardScan], list[ObjectInfo], list[str]]:
    """Every shard's scan, size and ETag (:meth:`~dali_bridge.data.storage.store.ObjectStore.listed`) and the
    problems that stop the listing (missing shards), in the order of ``urls``. Indexes are listed
    with the shards and fetched concurrently; labels come
    from the ``manifest()`` (read once the shards answer) when it records them for an index of
    the same digest, else from one
    ranged GET per sample (with a warning naming the cost); a shard whose index is absent or
    unusable is downloaded and scanned, with a warning."""
    cache_dir = cache_dir or listing_cache_dir()
    heads = store.listed(urls + [index_path(u) for u in urls])
    shard_heads, index_heads = heads[:len(urls)], heads[len(urls):]
    problems = [f"{h.reason}" for h in shard_heads if isinstance(h, FetchError)]
    if problems:
        return [], [], problems
    infos: list[ObjectInfo] = list(shard_heads)  # type: ignore[arg-type]
    scans: list[ShardScan | None] = [None] * len(urls)
    wanted: list[int] = []
    for number, (url, info) in enumerate(zip(urls, infos)):
        scans[number] = _cached_scan(_cache_file(cache_dir, url, info, image_keys, label_key))
        if scans[number] is None:
            wanted.append(number)
    # An index's age is not compared with its shard's: uploads land in any order. Its label
    # reads check it against the tar headers instead (see _scan_from_index).
    usable = [n for n in wanted if isinstance(index_heads[n], ObjectInfo)]
    texts = store.get([index_path(urls[n]) for n in usable])
    indexed = {n: t for n, t in zip(usable, texts) if not isinstance(t, FetchError)}
    recorded = manifest()
    known = manifest_labels(recorded, label_key)
    indexes = {e["file"]: e["index_sha256"] for e in (recorded or {}).get("shards", [])
               if isinstance(e.get("index_sha256"), str)}
    label_gets: list[int] = []   # shards whose labels are read one GET per sample

    def from_index(number: int) -> None:
        text = indexed[number]
        try:
            decoded = text.decode("utf-8")
        except UnicodeDecodeError:
            return
        name, actual = split_url(urls[number])[1], hashlib.sha256(text).hexdigest()
        digest, labels = known.get(name, (None, None))
        if digest != actual:
            labels = None   # no labels recorded, or for another index: read them from the shard
            label_gets.append(number)
        scans[number] = _scan_from_index(store, urls[number], infos[number], decoded, image_keys, label_key, labels)
        if scans[number] is not None and indexes.get(name, actual) != actual:
            scans[number].problems.append(
                f"{split_url(index_path(urls[number]))[1]}: sha256 {actual} differs from the manifest's "
                f"{indexes[name]}: not the index the manifest records (a changed shard, or a set mixed by an "
                f"interrupted or concurrent convert): check the set with 'dali-bridge verify', convert again")

    with ThreadPoolExecutor(max_workers=min(LISTING_THREADS, max(1, len(indexed)))) as pool:
        list(pool.map(from_index, list(indexed)))
    _warn_label_gets(urls, [n for n in label_gets if scans[n] is not None], scans, recorded is not None)
    _download_scans(store, urls, infos, [n for n in wanted if scans[n] is None], scans, image_keys, label_key)
    for number in wanted:
        _store_scan(_cache_file(cache_dir, urls[number], infos[number], image_keys, label_key), scans[number])
    return scans, infos, []  # type: ignore[return-value]


def _download_scans(store: ObjectStore, urls: list[str], infos: list[ObjectInfo], unindexed: list[int],
                    scans: list[ShardScan | None], image_keys: tuple[str, ...], label_key: str) -> None:
    """Scans the shards numbered ``unindexed`` (no usable index) by downloading each whole, into
    ``scans``, with one warning naming what it costs."""
    if not unindexed:
        return
    total = sum(infos[n].size for n in unindexed)
    log.warning("dali-bridge: %s without a usable index (%s ...): each is downloaded whole once to be "
                "listed, %.1f MiB in all; write the indexes beside the shards (dali-bridge convert writes "
                "them, as does DALI's wds2idx) to list without reading the data",
                plural(len(unindexed), "shard"), split_url(urls[unindexed[0]])[1], total / 2**20)

    def by_download(number: int) -> None:
        scans[number] = _scan_by_download(store, urls[number], infos[number], image_keys, label_key)

    with ThreadPoolExecutor(max_workers=min(STREAM_SCANS, len(unindexed))) as pool:
        list(pool.map(by_download, unindexed))


def _warn_label_gets(urls: list[str], numbers: list[int], scans: list[ShardScan | None], manifest: bool) -> None:
    """Say what listing these shards from their labels' GETs cost, and how to avoid it."""
    if not numbers:
        return
    gets = sum(len(scans[n].keys) for n in numbers)  # type: ignore[union-attr]
    why = ("the manifest records no labels for them (written by an older dali-bridge convert) or for other "
           "indexes" if manifest else "there is no manifest beside them")
    log.warning("dali-bridge: %s (%s ...) listed with one ranged GET per sample for its label, %s in all: %s; "
                "convert them again (dali-bridge convert) to list from the manifest and the indexes alone",
                plural(len(numbers), "shard"), split_url(urls[numbers[0]])[1], plural(gets, "GET"), why)


# Batches a reading thread fetches ahead of the one it reads (a DataLoader worker its own next
# batches, DALI's feeding thread the loader's): their GETs, about one round trip, are then on the
# wire while the batches before them are decoded. Two cover a round trip of up to two batches' decode.
READ_AHEAD_BATCHES = 2
# At most this many encoded bytes read ahead per reading thread (a batch that would pass it is not
# read ahead), besides the batch being read: memory stays bounded whatever the batch and image sizes.
READ_AHEAD_BYTES = 128 << 20


class _Fetches:
    """One reading thread's started GETs: sample index → (its future, whether it was started as a
    read-ahead of a later batch)."""

    def __init__(self) -> None:
        self.started: dict[int, tuple[Future, bool]] = {}

    def cancel(self, keep: Iterable[int] = ()) -> None:
        """Cancel the requests of the samples not in ``keep`` (still waiting ones stop; done ones are dropped)."""
        kept = set(keep)
        for index, (future, _) in list(self.started.items()):
            if index not in kept:
                future.cancel()
                self.started.pop(index, None)


class RemoteShardSamples:
    """Where each sample's image bytes are, as :class:`~dali_bridge.data.shards.tar.ShardSamples`, in objects
    read by ranged GETs through an :class:`~dali_bridge.data.storage.store.ObjectStore`.

    :meth:`prefetch` starts a batch's ranged GETs, in the batch's order, then those of the thread's
    next batches (``ahead``: up to :data:`READ_AHEAD_BATCHES` of them and :data:`READ_AHEAD_BYTES`),
    and returns; :meth:`read` then hands out each sample as soon as its bytes have arrived (or
    fetches it alone when it was not prefetched), so the first samples are decoded while the later
    ones are still on the wire, and a next batch's GETs wait out their round trip while this one is
    decoded. What a thread prefetched is its own; its next prefetch keeps what that batch and the
    ones after it need and cancels the rest, so memory holds at most a batch and its read-ahead per
    reading thread. A read-ahead that fails is fetched again when read: only that fetch's error is
    the sample's. :meth:`close` cancels every thread's requests.
    """

    reads_ahead = READ_AHEAD_BATCHES  # batches of sample indices :meth:`prefetch` takes in ``ahead``

    def __init__(self, shards: tuple[str, ...], shard: np.ndarray, offset: np.ndarray, size: np.ndarray,
                 etags: tuple[str | None, ...], store: ObjectStore):
        self.shards = shards
        self.shard = np.asarray(shard, dtype=np.int32)
        self.offset = np.asarray(offset, dtype=np.int64)
        self.size = np.asarray(size, dtype=np.int64)
        self.etags = etags
        self.store = store
        self._reset_threads()

    def _reset_threads(self) -> None:
        self._local = threading.local()
        self._every: weakref.WeakSet[_Fetches] = weakref.WeakSet()  # every thread's, for close()
        self._every_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.offset)

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_local", "_every", "_every_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset_threads()

    def _range(self, index: int) -> Range:
        shard = int(self.shard[index])
        return Range(self.shards[shard], int(self.offset[index]), int(self.size[index]), self.etags[shard])

    def _fetches(self) -> _Fetches:
        fetches = getattr(self._local, "fetches", None)
        if fetches is None:
            fetches = self._local.fetches = _Fetches()
            with self._every_lock:
                self._every.add(fetches)
        return fetches

    def prefetch(self, indices: Iterable[int], ahead: Sequence[Iterable[int]] = ()) -> None:
        """Start fetching these samples' bytes together (``source.max_requests`` in flight), then those
        of ``ahead``, the batches this thread reads next, in order (bounded as the class says)."""
        wanted = self._wanted(indices, set())
        upcoming = self._upcoming(ahead, set(wanted))
        fetches = self._fetches()
        fetches.cancel(keep=wanted + upcoming)   # what neither this batch nor the next ones need
        new = [i for i in wanted + upcoming if i not in fetches.started]
        if new:
            early = set(upcoming)
            # One call, this batch's first: the store's request limit lets them through in order.
            for index, future in zip(new, self.store.start([self._range(i) for i in new])):
                fetches.started[index] = (future, index in early)

    def _wanted(self, indices: Iterable[int], seen: set[int]) -> list[int]:
        return [i for i in dict.fromkeys(int(i) for i in indices) if self.size[i] > 0 and i not in seen]

    def _upcoming(self, ahead: Sequence[Iterable[int]], seen: set[int]) -> list[int]:
        """The samples of the next batches to read ahead, in order, within the batch and byte bounds."""
        out: list[int] = []
        total = 0
        for batch in list(ahead)[:READ_AHEAD_BATCHES]:
            chosen = self._wanted(batch, seen)
            total += int(self.size[chosen].sum()) if chosen else 0
            if total > READ_AHEAD_BYTES:
                break
            out += chosen
            seen.update(chosen)
        return out

    def read(self, index: int) -> bytes:
        """The encoded image of sample ``index``; :class:`ImageError` naming the request's last error."""
        if int(self.size[index]) == 0:
            raise ImageError("empty image member (0 bytes)")
        # Kept until this thread's next prefetch: a batch may hold a sample twice (pad, repeats).
        future, early = self._fetches().started.get(index, (None, False))
        answer = _answer(future, early) if future is not None else None
        if answer is None:  # not started, or a read-ahead that failed: fetched now
            answer = self.store.fetch([self._range(index)])[0]
        if isinstance(answer, FetchError):
            raise ImageError(redact(answer.reason))
        return answer

    def close(self) -> None:
        """Cancel every thread's requests still waiting and drop what they fetched (the store's
        connections live as long as the process)."""
        with self._every_lock:
            every = list(self._every)
        for fetches in every:
            fetches.cancel()


def _answer(future: Future, early: bool) -> bytes | FetchError | None:
    """A started GET's bytes or :class:`FetchError`; None for one cancelled (by :meth:`~RemoteShardSamples.close`)
    or a read-ahead (``early``) that did not bring the bytes, which is then fetched again as if never started."""
    try:
        answer = future.result()
    except CancelledError:
        return None
    except Exception as exc:
        if not early:
            raise
        answer = exc
    if early and not isinstance(answer, bytes):   # a read-ahead's failure is never the sample's
        log.debug("dali-bridge: a read-ahead failed (%s); the sample is fetched again", redact(str(answer)))
        return None
    return answer


class CachedShardSamples(RemoteShardSamples):
    """:class:`RemoteShardSamples` read through a node's cache of whole shards
    (:class:`~dali_bridge.data.shards.cache.ShardCache`): a shard is downloaded on its first touch, then
    each sample is a positioned read from the local copy."""

    def __init__(self, shards: tuple[str, ...], shard: np.ndarray, offset: np.ndarray, size: np.ndarray,
                 etags: tuple[str | None, ...], store: ObjectStore, cache: ShardCache,
                 shard_bytes: tuple[int, ...], sha256s: tuple[str | None, ...]):
        super().__init__(shards, shard, offset, size, etags, store)
        self.cache = cache
        self.shard_bytes = shard_bytes
        self.sha256s = sha256s

    reads_ahead = 0  # whole shards are cached at their first touch (or by the shard-aware order's read-ahead)

    def cached_shard(self, shard: int) -> CachedShard:
        """What the cache must know of shard number ``shard``."""
        return CachedShard(self.shards[shard], self.shard_bytes[shard], self.etags[shard], self.sha256s[shard])

    def _cached(self, shard: int) -> Path:
        return self.cache.ensure(self.cached_shard(shard))

    def prefetch(self, indices: Iterable[int], ahead: Sequence[Iterable[int]] = ()) -> None:
        """Bring the batch's shards into the cache (each downloaded once per node); ``ahead`` is not read.
        Shards not in the cache yet are downloaded together, each in a thread of its own: a batch of the
        shard-aware order draws from a window of shards, and one after the other they cost a round
        trip each before the batch (at the start of every epoch whose shards are not cached)."""
        shards = list(dict.fromkeys(int(self.shard[int(i)]) for i in indices))
        missing = [shard for shard in shards if not self.cache.path_for(self.cached_shard(shard)).exists()]
        if len(missing) > 1:
            with ThreadPoolExecutor(max_workers=len(missing), thread_name_prefix="dali-bridge-shard") as pool:
                list(pool.map(self._cached_or_not, missing))
        for shard in shards:   # the others (and those just fetched: checked, recently used)
            self._cached_or_not(shard)

    def _cached_or_not(self, shard: int) -> None:
        try:
            self._cached(shard)
        except StorageError:
            pass  # the samples' reads raise it, each as a sample error

    def read(self, index: int) -> bytes:
        """The sample's bytes from the cached copy, read only from a file verified against the manifest
        and unchanged while it was read (a copy changed since it was verified is verified again)."""
        size, offset = int(self.size[index]), int(self.offset[index])
        if size == 0:
            raise ImageError("empty image member (0 bytes)")
        shard = int(self.shard[index])
        cached = self.cached_shard(shard)
        for _ in range(3):   # changed (or evicted and fetched again) while read: verify and read again
            try:
                descriptor = self.cache.open(cached)
            except StorageError as exc:
                raise ImageError(redact(str(exc))) from None
            try:
                data = os.pread(descriptor, size, offset)
                unchanged = self.cache.unchanged(descriptor, cached)
            finally:
                os.close(descriptor)
            if not unchanged:
                continue
            if len(data) != size:
                raise ImageError(f"truncated image member in the cached copy of {self.shards[shard]}")
            return data
        raise ImageError(f"the cached copy of {self.shards[shard]} keeps changing while it is read: is another "
                         f"process writing into source.cache.dir?")
