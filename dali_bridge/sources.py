"""Source listings: a folder, a file list or WebDataset shards → an indexable list of (path, label) samples.

The listing fixes the sample indices and the label order once, the same for every backend:
for a folder, the sorted sub-folder names are the classes and files are walked in sorted order,
exactly as torchvision's ``ImageFolder`` does. Files whose extension is not an image extension
are ignored (like ImageFolder and DALI's file reader) but counted, never silently dropped.
Shard samples are indexed in shard order, then tar order; ``paths[i]`` names ``shard.tar#member``
and :meth:`Listing.read` fetches the bytes with one positioned read (see :mod:`dali_bridge.shards`).
"""
from __future__ import annotations

import errno
import functools
import io
import json
import logging
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .formats import DEFAULT_MAX_PIXELS, ImageInfo, inspect_image, without_webp_exif
from .images import ImageError, check_encoded, read_file, too_many_bytes
from .remote_shards import CachedShardSamples, RemoteShardSamples, list_remote_shards
from .shard_cache import ShardCache
from .shards import ShardSamples, ShardScan, expand_braces, manifest_path, scan_shard
from .storage import FetchError, ObjectInfo, ObjectStore, StorageError, is_url, store_for
from .checks import is_int
from .quoting import quoted, safe_name
from .spec import DEFAULT_MAX_BYTES, SourceSpec
from .text import NotUtf8Error, decode_utf8
from .wording import plural

log = logging.getLogger("dali_bridge")

_LABEL = re.compile(r"^-?[0-9]+$")  # ASCII digits only: str.isdigit also accepts '²' and '١'
# Labels are class numbers 0..C-1: C may be at most max(MIN_CLASS_BOUND, CLASSES_PER_SAMPLE x samples),
# which bounds the class-name table by the listing's own size.
MIN_CLASS_BOUND = 100_000
CLASSES_PER_SAMPLE = 4


class SourceError(ValueError):
    """The source cannot be listed: missing or empty root, malformed or dangling file-list lines."""


@dataclass(frozen=True)
class Listing:
    """Every sample of a source: ``paths[i]`` has label ``labels[i]``; ``classes[label]`` names it."""
    paths: tuple[str, ...]
    labels: np.ndarray
    classes: tuple[str, ...]
    root: str
    ignored: Counter = field(default_factory=Counter, compare=False)  # extension → files skipped
    # where shard samples' bytes are: local shards, objects at URLs, or Parquet row groups
    # (dali_bridge.parquet.ParquetSamples); read(index) gives them
    shards: ShardSamples | RemoteShardSamples | None = field(default=None, compare=False)
    max_pixels: int = field(default=DEFAULT_MAX_PIXELS, compare=False)  # source.max_pixels: larger images are refused
    max_bytes: int = field(default=DEFAULT_MAX_BYTES, compare=False)  # source.max_bytes: larger files are refused

    def __len__(self) -> int:
        return len(self.paths)

    def read(self, index: int) -> bytes:
        """Sample ``index``'s encoded image, checked like a file's; :class:`~dali_bridge.images.ImageError` if not."""
        data = self._raw(index)
        check_encoded(data, max_pixels=self.max_pixels)
        return data

    def prefetch(self, indices) -> None:
        """Fetch these samples' bytes together ahead of their reads: concurrent ranged GETs for shards
        at a URL (a batch's latency paid once), nothing for local files."""
        if isinstance(self.shards, RemoteShardSamples):
            self.shards.prefetch(indices)

    def read_info(self, index: int) -> tuple[bytes, ImageInfo]:
        """Sample ``index``'s bytes, checked as :meth:`read` checks them, and their
        :class:`~dali_bridge.formats.ImageInfo` (format, decoded size, EXIF orientation), from one walk
        of the header — the bytes as every decoder gets them: a WebP without its EXIF chunk, whose
        orientation no backend applies (see :mod:`dali_bridge.formats`)."""
        data = self._raw(index)
        info = inspect_image(data, max_pixels=self.max_pixels)
        return (without_webp_exif(data) if info.format == "webp" else data), info

    def read_sized(self, index: int) -> tuple[bytes, tuple[int, int]]:
        """:meth:`read_info` with the decoded (height, width) alone."""
        data, info = self.read_info(index)
        return data, info.size

    def signature(self, index: int) -> tuple[int, int] | None:
        """(modification time in ns, size) of sample ``index``'s file, to notice that it changed;
        None for a shard member (shards are immutable) or a file that cannot be stat'ed."""
        if self.shards is not None:
            return None
        try:
            status = os.stat(self.paths[index])
        except OSError:
            return None
        return status.st_mtime_ns, status.st_size

    def _raw(self, index: int) -> bytes:
        """Sample ``index``'s bytes, at most ``max_bytes`` of them: every read of a sample (both CPU
        backends, ``convert``) comes through here, so an over-size file is the same sample error on each."""
        if self.shards is None:
            return read_file(self.paths[index], max_bytes=self.max_bytes)
        if self.shards.size is not None:
            size = int(self.shards.size[index])
            if size > self.max_bytes:  # from the shard's index, before reading
                raise ImageError(too_many_bytes(size, self.max_bytes))
        data = self.shards.read(index)
        if len(data) > self.max_bytes:  # a source that knows a size only once read (Parquet's row groups)
            raise ImageError(too_many_bytes(len(data), self.max_bytes))
        return data

    def describe(self) -> str:
        text = f"{plural(len(self), 'sample')} in {plural(len(self.classes), 'class')} under {self.root}"
        if self.ignored:
            total = sum(self.ignored.values())
            kinds = ", ".join(f"{ext or '(no extension)'}: {n}" for ext, n in sorted(self.ignored.items()))
            what = "shard members" if self.shards is not None else "non-image files"
            text += f"; {total} {what} ignored ({kinds})"
        return text


def _is_image(name: str, extensions: tuple[str, ...]) -> bool:
    return name.lower().endswith(extensions)


def _walk(folder: Path) -> list[tuple[str, list[str]]]:
    """``sorted(os.walk(folder, followlinks=True))`` as ImageFolder walks, minus symlink loops.

    A linked folder that leads back to a folder already on the current path would be walked
    again and again (until the OS refuses, after ~40 levels) and list the same files dozens
    of times; it is pruned and logged. A folder that cannot be listed raises
    :class:`SourceError` instead of being skipped silently, as ``os.walk`` would.
    """
    chains: dict[str, frozenset[str]] = {}
    walked: list[tuple[str, list[str]]] = []

    def fail(exc: OSError) -> None:
        raise SourceError(f"source.root: cannot list folder {safe_name(exc.filename)}: {exc.strerror or exc}")

    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True, onerror=fail):
        chain = chains.pop(dirpath, frozenset()) | {os.path.realpath(dirpath)}
        for dirname in list(dirnames):
            child = os.path.join(dirpath, dirname)
            real = os.path.realpath(child)
            if real in chain:
                log.warning("source.root: not following %s: it links back to %s (a symlink loop)", safe_name(child),
                            safe_name(real))
                dirnames.remove(dirname)
            else:
                chains[child] = chain
        walked.append((dirpath, filenames))
    return sorted(walked)


def _class_folders(root: Path) -> list[str]:
    """The sorted names of ``root``'s sub-folders (links to folders included), each one checked: a
    link that cannot be followed (a loop, a link to itself) and a folder that is ``root`` or holds it
    (its walk would list the whole dataset again under a new label) are refused by name."""
    try:
        entries = list(os.scandir(root))
    except OSError as exc:
        raise SourceError(f"source.root: cannot list folder {safe_name(root)}: {exc.strerror or exc}") from None
    classes = []
    real_root = os.path.realpath(root)
    for entry in entries:
        try:
            is_dir = entry.is_dir()
        except OSError as exc:
            raise SourceError(f"source.root: cannot follow {safe_name(entry.path)}: {exc.strerror or exc} "
                              f"(a link that leads nowhere or to itself); remove it or point it at a class "
                              f"folder") from None
        if not is_dir:
            continue
        real = os.path.realpath(entry.path)
        if real_root == real or real_root.startswith(real.rstrip(os.sep) + os.sep):
            raise SourceError(f"source.root: class folder {safe_name(entry.path)} links to {safe_name(real)}, "
                              f"which holds the root itself: it would list the whole dataset again under a new "
                              f"label; remove the link")
        classes.append(entry.name)
    return sorted(classes)


def list_folder(root: str | Path, extensions: tuple[str, ...]) -> Listing:
    """ImageFolder semantics: classes are the sorted sub-folders; files walked sorted, links followed."""
    root = Path(root)
    if not root.exists():
        raise SourceError(f"source.root: folder {root} does not exist")
    if not root.is_dir():
        raise SourceError(f"source.root: {root} is not a folder")
    classes = _class_folders(root)
    if not classes:
        raise SourceError(f"source.root: {root} has no class sub-folders (expected root/<class>/<image> files)")
    paths: list[str] = []
    labels: list[int] = []
    ignored: Counter = Counter()
    empty: list[str] = []
    for label, name in enumerate(classes):
        before = len(paths)
        for dirpath, filenames in _walk(root / name):
            for filename in sorted(filenames):
                if _is_image(filename, extensions):
                    paths.append(os.path.join(dirpath, filename))
                    labels.append(label)
                else:
                    ignored[os.path.splitext(filename)[1].lower()] += 1
        if len(paths) == before:
            empty.append(name)
    if empty:
        shown = ", ".join(safe_name(name) for name in empty[:20]) + (f" and {len(empty) - 20} more"
                                                                     if len(empty) > 20 else "")
        raise SourceError(f"source.root: class folder(s) with no images ({', '.join(extensions)}) under {root}: "
                          f"{shown} — remove them or add images (labels follow the sorted folder names)")
    return Listing(tuple(paths), np.asarray(labels, dtype=np.int64), tuple(classes), str(root), ignored)


def list_file(file_list: str | Path, root: str | Path | None, extensions: tuple[str, ...]) -> Listing:
    """A text file of ``path label`` lines (path may contain spaces; label is the last field).

    Blank lines and lines starting with ``#`` are skipped. Relative paths resolve against ``root``
    (default: the list file's folder). Every malformed line and missing file is reported at once,
    with its line number.
    """
    file_list = Path(file_list)
    if not file_list.is_file():
        raise SourceError(f"source.file_list: {file_list} does not exist")
    base = Path(root) if root else file_list.parent
    try:
        content = decode_utf8(file_list.read_bytes(), str(file_list))
    except NotUtf8Error as exc:
        raise SourceError(f"source.file_list: {exc}") from None
    except OSError as exc:
        raise SourceError(f"source.file_list: cannot read {file_list}: {exc.strerror or exc}") from None
    paths: list[str] = []
    labels: list[int] = []
    numbers: list[int] = []
    problems: list[str] = []
    content = content.removeprefix("\ufeff")  # a byte-order mark some editors write: not part of line 1's path
    for number, line in enumerate(io.StringIO(content, newline=None), start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        parts = text.rsplit(None, 1)
        if len(parts) != 2 or not _LABEL.match(parts[1]):
            problems.append(f"{file_list}:{number}: expected 'path label' with an integer label, "
                            f"found {quoted(text)}")
            continue
        label = int(parts[1])
        if label < 0:
            problems.append(f"{file_list}:{number}: labels must be >= 0, found {label}")
            continue
        path = Path(parts[0]) if os.path.isabs(parts[0]) else base / parts[0]
        problem = _not_a_file(path)
        if problem:
            problems.append(f"{file_list}:{number}: file {safe_name(path)} {problem}")
            continue
        paths.append(str(path))
        labels.append(label)
        numbers.append(number)
    if not problems:
        problems.extend(sparse_labels(labels, lambda i: f"{file_list}:{numbers[i]}"))
    if problems:
        raise SourceError(f"source.file_list: {len(problems)} problem(s):\n  " + "\n  ".join(_shown(problems)))
    if not paths:
        raise SourceError(f"source.file_list: {file_list} lists no samples")
    num_classes = max(labels) + 1
    return Listing(tuple(paths), np.asarray(labels, dtype=np.int64),
                   tuple(str(c) for c in range(num_classes)), str(base))


def _not_a_file(path: Path) -> str | None:
    """Why ``path`` is not a regular file one can list (does not exist, a name too long, ...), or None."""
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return "does not exist"
        return f"cannot be read: {exc.strerror or exc}"
    except ValueError:  # an embedded NUL character
        return "cannot be read: its name holds a NUL character"
    return None if stat.S_ISREG(mode) else "is not a regular file"


def _shown(problems: list[str], most: int = 50) -> list[str]:
    return problems[:most] + ([f"... and {len(problems) - most} more"] if len(problems) > most else [])


def class_bound(samples: int) -> int:
    """The most classes a listing of ``samples`` samples may number: labels are class numbers
    0..C-1, and a class table far larger than the data is a typo, not a dataset."""
    return max(MIN_CLASS_BOUND, CLASSES_PER_SAMPLE * samples)


def sparse_labels(labels: list[int], where: Callable[[int], str]) -> list[str]:
    """A problem per label too large to be a class number (see :func:`class_bound`); ``where(i)``
    names the place of ``labels[i]`` (file and line, shard and sample)."""
    bound = class_bound(len(labels))
    return [f"{where(i)}: label {label} is not a class number: labels count classes from 0 and "
            f"{len(labels)} samples may use at most {bound:,} classes (0..{bound - 1}); "
            f"renumber the classes densely" for i, label in enumerate(labels) if label >= bound]


def _manifest_for(pattern: str, manifest: str | None,
                  store: ObjectStore | None = None) -> tuple[str | None, dict | None]:
    """The converter's manifest: the given path, else ``<prefix>.manifest.json`` next to the shards if present."""
    if store is not None:
        return _remote_manifest(pattern, manifest, store)
    if manifest is None:
        candidate = manifest_path(pattern)
        if not os.path.isfile(candidate):
            return None, None
        manifest = candidate
    try:
        return manifest, _checked_manifest(manifest, lambda: read_manifest_json(manifest))
    except OSError as exc:
        raise SourceError(f"source.manifest: cannot read {manifest}: {exc.strerror or exc}") from None


def _remote_manifest(pattern: str, manifest: str | None, store: ObjectStore) -> tuple[str | None, dict | None]:
    """:func:`_manifest_for` for shards at a URL: the manifest fetched with one GET."""
    url = manifest or manifest_path(pattern)
    answer = store.get([url])[0]
    if isinstance(answer, FetchError):
        if answer.missing and manifest is None:
            return None, None
        raise SourceError(f"source.manifest: cannot read {answer.reason}")
    return url, _checked_manifest(url, lambda: json.loads(decode_utf8(answer[:MAX_MANIFEST_BYTES + 1], url)))


def _checked_manifest(where: str, read: Callable[[], Any]) -> dict:
    """The manifest ``read()`` parses (a local file or a fetched object), checked: a
    :class:`SourceError` naming ``where`` when it is not UTF-8, not JSON or not a converter's."""
    try:
        data = read()
    except NotUtf8Error as exc:
        raise SourceError(f"source.manifest: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise SourceError(f"source.manifest: {where} is not valid JSON: {exc}") from None
    problem = manifest_problem(data)
    if problem:
        raise SourceError(f"source.manifest: {where} {problem} (expected a dali-bridge convert manifest)")
    return data


# A converter's manifest is a few hundred bytes per shard and per class.
MAX_MANIFEST_BYTES = 256 << 20


def read_manifest_json(manifest: str | Path) -> Any:
    """A converter's manifest file as JSON, read within :data:`MAX_MANIFEST_BYTES`. Raises
    ``OSError``, :class:`~dali_bridge.text.NotUtf8Error`, or ``ValueError``/``RecursionError``
    (not JSON); each caller names the file its own way."""
    with open(manifest, "rb") as handle:
        return json.loads(decode_utf8(handle.read(MAX_MANIFEST_BYTES + 1), str(manifest)))


def manifest_problem(data: Any) -> str | None:
    """What makes ``data`` (a parsed manifest) unusable, or None: a ``classes`` list, a ``shards``
    list of mappings with a ``file`` name and a ``samples`` count."""
    if not isinstance(data, dict) or not isinstance(data.get("classes"), list):
        return "has no 'classes' list"
    shards = data.get("shards", [])
    if not isinstance(shards, list) or not all(isinstance(e, dict) and isinstance(e.get("file"), str)
                                               and is_int(e.get("samples")) for e in shards):
        return "has a 'shards' entry that is not {file: name, samples: count, ...}"
    for number, entry in enumerate(shards):
        name = entry["file"]
        if name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
            return (f"has shards[{number}].file {quoted(name)}: expected the name of a file in the manifest's "
                    f"own folder (no folders, no absolute path)")
    return None


def _size_problems(paths: list[str], sizes: list[int], manifest_file: str, manifest_data: dict) -> list[str]:
    """A problem per shard whose size (``sizes``: one ``stat`` or HEAD each) is not the one its
    manifest records: a shard set mixed by an interrupted or concurrent ``convert``, or a shard
    replaced since."""
    recorded = {entry["file"]: entry.get("bytes") for entry in manifest_data.get("shards", [])}
    problems = []
    for path, size in zip(paths, sizes):
        expected = recorded.get(os.path.basename(path))
        if is_int(expected) and size != expected:
            problems.append(f"{safe_name(path)}: {size} bytes, the manifest {safe_name(manifest_file)} records "
                            f"{expected} (a changed shard, or a set mixed by an interrupted or concurrent convert): "
                            f"check the set with 'dali-bridge verify {safe_name(manifest_file)}', convert again "
                            f"to repair it")
    return problems


def _local_scans(paths: list[str], image_keys: tuple[str, ...], label_key: str) -> list[ShardScan]:
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        shown = ", ".join(safe_name(p) for p in missing[:10]) + (f" and {len(missing) - 10} more"
                                                                  if len(missing) > 10 else "")
        raise SourceError(f"source.shards: {len(missing)} of {len(paths)} shard(s) do not exist: {shown}")
    return [scan_shard(path, image_keys, label_key) for path in paths]


def _remote_scans(paths: list[str], image_keys: tuple[str, ...], label_key: str,
                  store: ObjectStore, manifest: Callable[[], dict | None]) -> tuple[list[ShardScan], list[ObjectInfo]]:
    """Scans of shards at URLs (:func:`~dali_bridge.remote_shards.list_remote_shards`) and their HEADs."""
    scans, infos, problems = list_remote_shards(store, paths, image_keys, label_key, manifest=manifest)
    if problems:
        shown = problems[:10] + ([f"... and {len(problems) - 10} more"] if len(problems) > 10 else [])
        raise SourceError(f"source.shards: {len(problems)} of {len(paths)} shard(s) cannot be listed:\n  "
                          + "\n  ".join(shown))
    return scans, infos


@dataclass
class _ShardsFound:
    """What the scans of a pattern's shards found, joined in shard order."""
    names: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    shard_ids: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    ignored: Counter = field(default_factory=Counter)
    counts: dict[str, int] = field(default_factory=dict)  # samples per shard file name


def _gather_scans(paths: list[str], scans: list[ShardScan]) -> _ShardsFound:
    """The shards' samples, problems and ignored members, joined in shard order."""
    found = _ShardsFound()
    for number, (path, scan) in enumerate(zip(paths, scans)):
        found.problems.extend(scan.problems)
        found.ignored.update(scan.ignored)
        found.counts[os.path.basename(path)] = len(scan.keys)
        found.names.extend(f"{path}#{name}" for name in scan.image_names)
        found.labels.extend(scan.labels)
        found.shard_ids.extend([number] * len(scan.keys))
        found.offsets.extend(scan.offsets)
        found.sizes.extend(scan.sizes)
    return found


def _shard_classes(paths: list[str], infos: list[ObjectInfo], store: ObjectStore | None, found: _ShardsFound,
                   manifest_file: str | None, manifest_data: dict | None) -> tuple[str, ...]:
    """The class names (the manifest's, else ``"0"``…``"max"``); adds to ``found.problems`` what the
    labels and the manifest say against each other."""
    problems, labels, names, shard_ids = found.problems, found.labels, found.names, found.shard_ids
    if manifest_data is None and not problems:
        problems.extend(sparse_labels(labels, lambda i: f"{os.path.basename(paths[shard_ids[i]])}: "
                                                        f"{names[i].rsplit('#', 1)[1]}"))
    classes: tuple[str, ...] = ()
    if labels and not problems:
        classes = tuple(str(c) for c in range(max(labels) + 1))
    if manifest_data is not None:
        classes = tuple(str(c) for c in manifest_data["classes"])
        if not problems:  # a damaged shard's own problems say more than its size does
            shard_sizes = [info.size for info in infos] if store is not None else [os.stat(p).st_size for p in paths]
            problems.extend(_size_problems(paths, shard_sizes, manifest_file, manifest_data))
        recorded = {entry.get("file"): entry.get("samples") for entry in manifest_data.get("shards", [])}
        for name, count in found.counts.items():
            if name in recorded and recorded[name] != count and not problems:
                problems.append(f"{name}: {count} samples, the manifest {manifest_file} records {recorded[name]} "
                                f"(a stale manifest or a changed shard)")
        out_of_range = sorted({label for label in labels if label >= len(classes)})
        if out_of_range:
            problems.append(f"labels {out_of_range[:10]} are outside the manifest's {len(classes)} classes "
                            f"({manifest_file})")
    return classes


def _shard_samples(paths: list[str], found: _ShardsFound, infos: list[ObjectInfo], store: ObjectStore | None,
                   cache: ShardCache | None, manifest_data: dict | None) -> ShardSamples | RemoteShardSamples:
    """Where each sample's bytes are: local shards, remote ones by ranged GETs, or remote ones cached whole."""
    where = (np.asarray(found.shard_ids), np.asarray(found.offsets), np.asarray(found.sizes))
    etags = tuple(info.etag for info in infos)
    if store is None:
        return ShardSamples(tuple(paths), *where)
    if cache is None:
        return RemoteShardSamples(tuple(paths), *where, etags=etags, store=store)
    recorded = {e["file"]: e.get("sha256") for e in (manifest_data or {}).get("shards", [])}
    return CachedShardSamples(tuple(paths), *where, etags=etags, store=store, cache=cache,
                              shard_bytes=tuple(info.size for info in infos),
                              sha256s=tuple(recorded.get(p.rsplit("/", 1)[-1]) for p in paths))


def list_webdataset(pattern: str, image_keys: tuple[str, ...], label_key: str = "cls",
                    manifest: str | None = None, store: ObjectStore | None = None,
                    cache: ShardCache | None = None) -> Listing:
    """Samples of the shards ``pattern`` names (brace-expanded, in that order), members in tar order.

    Every shard's headers are read before anything runs; every problem (missing shard, sample
    without image or label member, bad label, damaged or truncated tar) is reported at once with
    the shard and member key. Class names come from the converter's manifest (``manifest``, else
    the one ``dali-bridge convert`` writes next to the shards), else they are ``"0"``…``"max"``.
    With ``store`` the pattern names objects at URLs, read through it (:mod:`dali_bridge.remote_shards`),
    by ranged GETs or, with ``cache``, from whole shards cached on the node.
    """
    try:
        paths = expand_braces(pattern)
    except ValueError as exc:
        raise SourceError(f"source.shards: {exc}") from None
    infos: list[ObjectInfo] = []
    if store is None:
        scans = _local_scans(paths, image_keys, label_key)
        manifest_file, manifest_data = _manifest_for(pattern, manifest, store)
    else:
        # Read once the shards answer (missing shards are the first thing to say): its labels spare GETs.
        read_manifest = functools.cache(lambda: _manifest_for(pattern, manifest, store))
        scans, infos = _remote_scans(paths, image_keys, label_key, store, lambda: read_manifest()[1])
        manifest_file, manifest_data = read_manifest()
    found = _gather_scans(paths, scans)
    classes = _shard_classes(paths, infos, store, found, manifest_file, manifest_data)
    if found.problems:
        problems = found.problems
        shown = problems[:50] + ([f"... and {len(problems) - 50} more"] if len(problems) > 50 else [])
        raise SourceError(f"source.shards: {len(problems)} problem(s) in {pattern}:\n  " + "\n  ".join(shown))
    if not found.names:
        raise SourceError(f"source.shards: {pattern} holds no samples with a .{' or .'.join(image_keys)} image "
                          f"and a .{label_key} label")
    samples = _shard_samples(paths, found, infos, store, cache, manifest_data)
    return Listing(tuple(found.names), np.asarray(found.labels, dtype=np.int64), classes, pattern, found.ignored,
                   samples)


def _source_store(source: SourceSpec, location: str, key: str) -> ObjectStore:
    """The process's client for a source at a URL, with the source's settings."""
    try:
        return store_for(location, dict(source.storage_options), source.max_requests, source.timeout)
    except StorageError as exc:
        raise SourceError(f"source.{key}: {exc}") from None


def list_source(source: SourceSpec) -> Listing:
    """The listing of a validated source (its samples read with the source's pixel and byte caps)."""
    if source.type == "folder":
        listing = list_folder(source.root, source.extensions)
    elif source.type == "file_list":
        listing = list_file(source.file_list, source.root, source.extensions)
    elif source.type == "webdataset":
        store, cache = None, None
        if is_url(source.shards):
            store = _source_store(source, source.shards, "shards")
            if source.cache_dir is not None:
                cache = ShardCache(source.cache_dir, source.cache_max_bytes, store)
        listing = list_webdataset(source.shards, source.image_keys, source.label_key, source.manifest, store, cache)
    elif source.type == "parquet":
        from .parquet import list_parquet

        at_url = bool(source.files) and is_url(source.files[0])   # all local or all at URLs of one scheme
        store = _source_store(source, source.files[0], "files") if at_url else None
        listing = list_parquet(source.files, source.image_column, source.label_column, store)
    else:
        raise SourceError(f"source.type: unsupported source type {source.type!r}")
    return replace(listing, max_pixels=source.max_pixels, max_bytes=source.max_bytes)
