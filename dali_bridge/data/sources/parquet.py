"""Parquet image datasets (the Hugging Face hub's layout) as a source: ``source: {type: parquet, files: ...}``.

Each row is a sample: an image column — Hugging Face's ``Image`` feature, a struct
``{bytes: binary, path: string}``, or a plain binary column — and an integer label column.
Samples are indexed in file order (the ``files`` entries in order, each glob sorted), then row
order. Class names come from the Hugging Face features stored in each file's schema metadata
(key ``huggingface``: the label column's ``ClassLabel`` names) when present, else they are
``"0"``…``"max"``.

Listing reads each file's footer and its label column only. A sample's bytes are read through
the row-group index: the row group that holds it is read (its image column only) into a small
per-process cache bounded in bytes (:data:`MAX_CACHED_BYTES`), and the row's encoded bytes are
handed to the decoders as stored — the same byte checks, pixel cap and ``on_error`` policy as
any file. Shuffled epochs read about one row group per sample once the dataset is larger than
the cache: for large shuffled training, ``dali-bridge convert`` the files to shards first.

Files at a URL (``s3://``, ``gs://``, ``http(s)://``; globs and brace patterns as for local
files) are read as shards at URLs are (:mod:`dali_bridge.data.storage.store`): listing takes each
file's size and ETag from the store's LIST (a HEAD each over HTTP); the footer and each row group's
image column are then ranged GETs of exactly the bytes pyarrow asks for
(:class:`~dali_bridge.data.sources.ranged_file.RangedFile`), each retried with backoff within
``source.timeout`` and carrying the listed ETag, so a file replaced since the listing fails its
reads instead of giving other bytes. With ``source.cache`` each file is downloaded whole once per
node into the shard cache (its size checked, its name a hash of URL, size and ETag) and read
locally. A read that still fails is a sample error under ``on_error``, redacted of credentials.

Needs pyarrow (the ``[parquet]`` extra), and the scheme's client for URLs (``[s3]``...).
"""
from __future__ import annotations

import glob
import json
import os
import threading
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import ImageError
from ..shards.remote import LISTING_THREADS
from ...util.braces import expand_braces
from ..shards.cache import CachedShard, ShardCache
from ..storage.store import ObjectStore
from ..storage.listing import FetchError, ObjectInfo
from .ranged_file import RangedFile
from ...util.urls import StorageError, redact
from ...util.wording import plural

# Row groups' image columns kept per process (each DataLoader worker has its own cache).
MAX_CACHED_BYTES = 256 << 20
MAX_OPEN_FILES = 16
_GLOB = set("*?[")


def _pyarrow():
    from ...errors import SourceError

    try:
        import pyarrow
        import pyarrow.compute  # noqa: F401  (pyarrow.compute, used on image structs)
        import pyarrow.parquet
    except ImportError:
        raise SourceError("source.type parquet needs pyarrow, which is not installed: "
                          "pip install dali-bridge[parquet] (or pip install pyarrow)") from None
    return pyarrow, pyarrow.parquet


def expand_files(files: tuple[str, ...], store: ObjectStore | None = None) -> list[str]:
    """The Parquet files ``files`` names: each entry brace-expanded, then globbed (sorted) when it has
    ``*``, ``?`` or ``[``; a plain name must exist (with ``store``: objects at URLs, listed together).
    Raises :class:`~dali_bridge.errors.SourceError`."""
    return expand_listed_files(files, store)[0]


def expand_listed_files(files: tuple[str, ...],
                        store: ObjectStore | None = None) -> tuple[list[str], list[ObjectInfo]]:
    """:func:`expand_files`, with ``store`` also each object's size and ETag as the store lists them
    (LIST pages on S3 and GCS, a HEAD each over HTTP): what its reads are checked against."""
    from ...errors import SourceError

    found: list[str] = []
    problems: list[str] = []
    for entry in files:
        try:
            names = expand_braces(entry)
        except ValueError as exc:
            raise SourceError(f"source.files: {exc}") from None
        for name in names:
            if _GLOB & set(name):
                matches = _glob(name, store, problems)
                if not matches:
                    # HTTP has no listing: fsspec reads the links of the folder's index page, if the server has one
                    over_http = store is not None and store.scheme in ("http", "https")
                    problems.append(f"{name} matches no file" + (
                        " (over HTTP a glob reads the links of the folder's index page, which this server may "
                        "not serve: name the files, or a brace pattern such as train-{00000..00003}.parquet)"
                        if over_http else ""))
                found.extend(matches)
            elif store is not None:
                found.append(name)
            elif not os.path.isfile(name):
                problems.append(f"{name} {'is not a regular file' if os.path.exists(name) else 'does not exist'}")
            else:
                found.append(name)
    infos: list[ObjectInfo] = []
    if store is not None and found and not problems:
        answers = store.listed(found)
        problems.extend(answer.reason for answer in answers if isinstance(answer, FetchError))
        infos = [answer for answer in answers if isinstance(answer, ObjectInfo)]
    repeated = [name for name, count in Counter(found).items() if count > 1]
    if repeated:
        problems.append(f"{plural(len(repeated), 'file')} named more than once (each sample must be listed once): "
                        f"{', '.join(repeated[:5])}")
    if problems:
        raise SourceError(f"source.files: {len(problems)} problem(s):\n  " + "\n  ".join(problems[:50]))
    return found, infos


def _glob(pattern: str, store: ObjectStore | None, problems: list[str]) -> list[str]:
    if store is None:
        return sorted(path for path in glob.glob(pattern) if os.path.isfile(path))
    try:
        return store.glob(pattern)
    except StorageError as exc:
        problems.append(str(exc))
        return []


def _open(path: str, store: ObjectStore | None, info: ObjectInfo | None = None) -> Any:
    """``path``'s pyarrow ParquetFile: a local file, or an object (listed as ``info``) read by ranged
    GETs through ``store``, each retried and checked against the listed ETag."""
    pq = _pyarrow()[1]
    return pq.ParquetFile(path if store is None else RangedFile(store, path, info))


def _read_errors(store: ObjectStore | None) -> tuple[type[BaseException], ...]:
    """What reading a file may raise: a local file's OS and Arrow errors; at a URL, whatever the
    client raises through pyarrow (its errors have no common base)."""
    return (Exception,) if store is not None else (OSError, _pyarrow()[0].ArrowException)


def class_names(metadata: dict[bytes, bytes] | None, label_column: str) -> tuple[str, ...] | None:
    """The label column's ``ClassLabel`` names from Hugging Face's schema metadata, or None."""
    raw = (metadata or {}).get(b"huggingface")
    if raw is None:
        return None
    try:
        features = json.loads(raw).get("info", {}).get("features", {})
        names = features.get(label_column, {}).get("names")
    except (ValueError, AttributeError):
        return None
    if isinstance(names, list) and names and all(isinstance(n, str) for n in names):
        return tuple(names)
    return None


def _image_field(schema: Any, image_column: str, path: str) -> tuple[str | None, str | None]:
    """``("struct" | "binary", None)`` for a usable image column, else ``(None, problem)``."""
    pa = _pyarrow()[0]
    names = schema.names
    if image_column not in names:
        return None, f"{path}: no image column '{image_column}' (columns: {', '.join(names)}); set source.image_column"
    kind = schema.field(image_column).type
    if pa.types.is_struct(kind):
        if kind.get_field_index("bytes") < 0 or not _is_binary(pa, kind.field("bytes").type):
            return None, (f"{path}: image column '{image_column}' is a struct without a binary 'bytes' field "
                          f"(found {kind}); expected Hugging Face's {{bytes, path}} image struct or a binary column")
        return "struct", None
    if _is_binary(pa, kind):
        return "binary", None
    return None, (f"{path}: image column '{image_column}' holds {kind}, not encoded images; expected Hugging Face's "
                  f"{{bytes, path}} image struct or a binary column")


def _is_binary(pa: Any, kind: Any) -> bool:
    return pa.types.is_binary(kind) or pa.types.is_large_binary(kind)


class ParquetSamples:
    """Where each sample's bytes are: row group ``g`` of ``files[group_file[g]]`` (its number in that
    file ``group_number[g]``) holds samples ``group_start[g]`` onwards.

    :meth:`read` reads a row group's image column once into a per-process cache bounded by
    :data:`MAX_CACHED_BYTES`; pickling (to spawned workers) drops the cache and open files.
    """

    #: A row's byte count is known only once its row group is read (the listing reads the labels
    #: alone), so the listing's per-sample byte cap applies to the bytes read, which the bounded
    #: row-group cache holds anyway.
    size = None

    def __init__(self, files: tuple[str, ...], group_file: np.ndarray, group_number: np.ndarray,
                 group_start: np.ndarray, image_column: str, kinds: tuple[str, ...], store: ObjectStore | None = None,
                 infos: tuple[ObjectInfo, ...] = (), cache: ShardCache | None = None):
        self.files = files
        self.store = store   # files at URLs: read through it (its client made in each process)
        self.infos = infos   # files at URLs: each one's size and ETag when listed, checked by every read
        self.cache = cache   # files at URLs with source.cache: each downloaded whole once per node
        self.group_file = np.asarray(group_file, dtype=np.int32)
        self.group_number = np.asarray(group_number, dtype=np.int32)
        self.group_start = np.asarray(group_start, dtype=np.int64)
        self.image_column = image_column
        self.kinds = kinds   # per file: "struct" or "binary"
        self._reset()

    def _reset(self) -> None:
        self._cache: OrderedDict[int, Any] = OrderedDict()   # group → its image bytes column (pyarrow)
        self._cached_bytes = 0
        self._open: OrderedDict[int, Any] = OrderedDict()    # file → pyarrow ParquetFile
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in ("files", "group_file", "group_number", "group_start",
                                                      "image_column", "kinds", "store", "infos", "cache")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    def where(self, index: int) -> tuple[int, int]:
        """(row group, row within it) of sample ``index``."""
        group = int(np.searchsorted(self.group_start, index, side="right")) - 1
        return group, index - int(self.group_start[group])

    def read(self, index: int) -> bytes:
        """The encoded image of sample ``index``; :class:`ImageError` when its row group cannot be read
        or the row has no image bytes."""
        if self._pid != os.getpid():   # a forked child: the parent's lock and handles are not its own
            self._reset()
        group, row = self.where(index)
        with self._lock:
            column = self._column(group)
        value = column[row].as_py()
        if value is None:
            raise ImageError(f"row {row} of row group {int(self.group_number[group])} has no image bytes (null; a "
                             f"Hugging Face image stored by its path alone is not in the file: save the dataset "
                             f"with the images embedded)")
        return value

    def _column(self, group: int) -> Any:
        column = self._cache.get(group)
        if column is not None:
            self._cache.move_to_end(group)
            return column
        file = int(self.group_file[group])
        try:
            table = self._file(file).read_row_group(int(self.group_number[group]), columns=[self.image_column])
        except _read_errors(self.store) as exc:   # a damaged or changed file, a store that keeps failing
            raise ImageError(redact(f"cannot read row group {int(self.group_number[group])} of {self.files[file]}: "
                                    f"{' '.join(str(exc).split())}")) from None
        column = table.column(self.image_column).combine_chunks()
        if self.kinds[file] == "struct":
            column = _struct_bytes(column)
        self._cache[group] = column
        self._cached_bytes += column.nbytes
        while self._cached_bytes > MAX_CACHED_BYTES and len(self._cache) > 1:
            self._cached_bytes -= self._cache.popitem(last=False)[1].nbytes
        return column

    def _file(self, file: int) -> Any:
        handle = self._open.get(file)
        if handle is None:
            if self.cache is not None:   # a local copy, checked against the listed size (and ETag, by its name)
                info = self.infos[file]
                local = self.cache.ensure(CachedShard(self.files[file], info.size, info.etag, None))
                handle = _open(str(local), None)
            else:
                handle = _open(self.files[file], self.store, self.infos[file] if self.store is not None else None)
            self._open[file] = handle
            if len(self._open) > MAX_OPEN_FILES:
                self._open.popitem(last=False)[1].close()
        return handle

    def close(self) -> None:
        for handle in self._open.values():
            handle.close()
        self._reset()


def _struct_bytes(column: Any) -> Any:
    """The ``bytes`` field of an image struct column, null where the struct itself is null."""
    pa = _pyarrow()[0]
    values = column.field("bytes")
    if column.null_count:
        values = pa.compute.if_else(column.is_valid(), values, pa.nulls(len(values), values.type))
    return values



@dataclass
class _FileScan:
    """What listing needs from one file: its image column's kind, labels, rows per row group, class names."""
    kind: str | None = None
    labels: np.ndarray | None = None
    group_rows: list[int] = field(default_factory=list)
    classes: tuple[str, ...] | None = None
    problems: list[str] = field(default_factory=list)


def _scan_file(path: str, image_column: str, label_column: str, store: ObjectStore | None = None,
               info: ObjectInfo | None = None) -> _FileScan:
    pa = _pyarrow()[0]
    scan = _FileScan()
    try:
        handle = _open(path, store, info)
    except _read_errors(store) as exc:
        scan.problems.append(redact(f"{path}: not a readable Parquet file: {exc}"))
        return scan
    with handle:
        schema = handle.schema_arrow
        scan.kind, problem = _image_field(schema, image_column, path)
        if problem:
            scan.problems.append(problem)
        if label_column not in schema.names:
            scan.problems.append(f"{path}: no label column '{label_column}' (columns: {', '.join(schema.names)}); "
                                 f"set source.label_column")
        elif not pa.types.is_integer(schema.field(label_column).type):
            scan.problems.append(f"{path}: label column '{label_column}' holds {schema.field(label_column).type}, "
                                 f"expected integer class numbers")
        if scan.problems:
            return scan
        try:
            column = handle.read(columns=[label_column]).column(label_column)
        except _read_errors(store) as exc:
            scan.problems.append(redact(f"{path}: cannot read label column '{label_column}': {exc}"))
            return scan
        scan.group_rows = [handle.metadata.row_group(g).num_rows for g in range(handle.metadata.num_row_groups)]
    if column.null_count:
        rows = np.flatnonzero(~np.asarray(column.is_valid()))
        scan.problems.append(f"{path}: {plural(len(rows), 'row')} without a label (null), e.g. row(s) "
                             f"{', '.join(map(str, rows[:10]))}")
        return scan
    scan.labels = np.asarray(column.to_numpy(), dtype=np.int64)
    negative = np.flatnonzero(scan.labels < 0)
    if len(negative):
        scan.problems.append(f"{path}: row {negative[0]}: labels must be >= 0, found {scan.labels[negative[0]]} "
                             f"({plural(len(negative), 'row')} with a negative label; -1 is Hugging Face's "
                             f"'no label': filter those rows out)")
    scan.classes = class_names(schema.metadata, label_column)
    return scan


def list_parquet(files: tuple[str, ...], image_column: str = "image", label_column: str = "label",
                 store: ObjectStore | None = None, cache: ShardCache | None = None):
    """The :class:`~dali_bridge.data.sources.listing.Listing` of the Parquet files ``files`` names (see the module);
    with ``store``, files at URLs read through it (their footers and label columns fetched together).

    Reads each file's footer and label column; every problem (missing file or column, wrong column
    type, null or negative label, labels outside the class names, files that disagree on the class
    names) is reported at once.
    """
    from ...errors import SourceError
    from .listing import Listing, sparse_labels

    _pyarrow()   # the missing extra first, before any file is looked at
    paths, infos = expand_listed_files(files, store)
    if store is None:
        scans = [_scan_file(path, image_column, label_column) for path in paths]
    else:  # each file a few round trips (footer, label column chunks): the files' latencies overlap
        with ThreadPoolExecutor(max_workers=min(LISTING_THREADS, max(1, len(paths)))) as pool:
            scans = list(pool.map(lambda item: _scan_file(item[0], image_column, label_column, store, item[1]),
                                  zip(paths, infos)))
    problems = [problem for scan in scans for problem in scan.problems]
    named = [(path, scan.classes) for path, scan in zip(paths, scans) if scan.classes is not None]
    classes = named[0][1] if named else None
    for path, other in named[1:]:
        if other != classes:
            problems.append(f"{path}: its ClassLabel names for '{label_column}' differ from those of {named[0][0]}")
    labels = np.concatenate([scan.labels for scan in scans if scan.labels is not None] or [np.zeros(0, np.int64)])
    names = [f"{path}#{row}" for path, scan in zip(paths, scans) if scan.labels is not None
             for row in range(len(scan.labels))]
    if not problems and classes is not None and len(labels) and labels.max() >= len(classes):
        problems.append(f"labels up to {labels.max()} are outside the {len(classes)} ClassLabel names of "
                        f"{named[0][0]}")
    if not problems and classes is None:
        problems.extend(sparse_labels(labels.tolist(), lambda i: names[i]))
    if problems:
        raise SourceError(f"source.files: {len(problems)} problem(s):\n  " + "\n  ".join(problems[:50])
                          + (f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""))
    if not names:
        raise SourceError(f"source.files: {', '.join(paths[:5])} hold no rows")
    group_file = [number for number, scan in enumerate(scans) for _ in scan.group_rows]
    group_number = [group for scan in scans for group in range(len(scan.group_rows))]
    group_start = np.cumsum([0] + [rows for scan in scans for rows in scan.group_rows])[:-1]
    samples = ParquetSamples(tuple(paths), np.asarray(group_file), np.asarray(group_number), group_start,
                             image_column, tuple(scan.kind for scan in scans), store, tuple(infos), cache)
    if classes is None:
        classes = tuple(str(c) for c in range(int(labels.max()) + 1))
    return Listing(tuple(names), labels, classes, ", ".join(files), shards=samples)
