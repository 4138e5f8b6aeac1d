"""Source listings: a folder, a file list or WebDataset shards → an indexable list of (path, label) samples.

The listing fixes the sample indices and the label order once, the same for every backend:
for a folder, the sorted sub-folder names are the classes and files are walked in sorted order,
exactly as torchvision's ``ImageFolder`` does. Files whose extension is not an image extension
are ignored (like ImageFolder and DALI's file reader) but counted, never silently dropped.
Shard samples are indexed in shard order, then tar order; ``paths[i]`` names ``shard.tar#member``
and :meth:`Listing.read` fetches the bytes with one positioned read (see :mod:`dali_bridge.data.shards.tar`).

This module lists folders and file lists and picks the listing for a source; :class:`Listing` is in
:mod:`dali_bridge.data.sources.listing`, the WebDataset listing in :mod:`dali_bridge.data.sources.webdataset` (both importable
from here).
"""
from __future__ import annotations

import errno
import io
import os
import re
import stat
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..shards.cache import ShardCache
from ..storage.store import ObjectStore, store_for
from ...util.urls import StorageError, hide_signature, is_url, split_userinfo, without_userinfo
from ...errors import SourceError  # noqa: F401
from .listing import CLASSES_PER_SAMPLE, MIN_CLASS_BOUND, Listing, class_bound, sparse_labels  # noqa: F401
from .webdataset import list_webdataset
from ...util.quoting import quoted, safe_name
from ...spec.model import SourceSpec
from ...util.text import NotUtf8Error, decode_utf8
from ...util.messages import package_log

log = package_log()

_LABEL = re.compile(r"^-?[0-9]+$")  # ASCII digits only: str.isdigit also accepts '²' and '١'
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


def _source_store(source: SourceSpec, locations: list[str], key: str) -> ObjectStore:
    """The process's client for a source at these URLs, with the source's settings and the
    credentials the URLs carry (``user:password@``), which the listing never keeps."""
    given = {split_userinfo(location)[1:] for location in locations} - {(None, None)}
    if len(given) > 1:
        raise SourceError(f"source.{key}: the URLs carry different user:password@ credentials; one source "
                          f"reads with one set of credentials")
    try:
        return store_for(locations[0], dict(source.storage_options), source.max_requests, source.timeout,
                         source.redirect_hosts)
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
        shards, manifest = source.shards, source.manifest
        if is_url(shards):
            store = _source_store(source, [shards] + ([manifest] if manifest else []), "shards")
            # The listing, its paths, messages and cache keys hold the URLs without their credentials.
            shards, manifest = without_userinfo(shards), manifest and without_userinfo(manifest)
            if source.cache_dir is not None:
                cache = ShardCache(source.cache_dir, source.cache_max_bytes, store)
        listing = list_webdataset(shards, source.image_keys, source.label_key, manifest, store, cache)
    elif source.type == "parquet":
        from .parquet import list_parquet

        at_url = bool(source.files) and is_url(source.files[0])   # all local or all at URLs of one scheme
        store = _source_store(source, list(source.files), "files") if at_url else None
        files = tuple(without_userinfo(f) for f in source.files) if at_url else source.files
        listing = list_parquet(files, source.image_column, source.label_column, store)
    else:
        raise SourceError(f"source.type: unsupported source type {source.type!r}")
    return replace(_without_signatures(listing, source), max_pixels=source.max_pixels, max_bytes=source.max_bytes)


def _without_signatures(listing: Listing, source: SourceSpec) -> Listing:
    """The listing's paths and root with a signed URL's credentials hidden (``X-Amz-Signature=***``):
    they name samples, the source's reader keeps the URLs it fetches."""
    locations = [source.shards] if source.type == "webdataset" else list(source.files or ())
    if all(hide_signature(location) == location for location in locations if location and is_url(location)):
        return listing   # nothing to hide (checked on the source's few URLs, not on every path)
    return replace(listing, paths=tuple(hide_signature(path) for path in listing.paths),
                   root=hide_signature(listing.root))
