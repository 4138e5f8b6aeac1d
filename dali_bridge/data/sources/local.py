"""Source listings: a folder, a file list or WebDataset shards → an indexable list of (path, label) samples.

The listing fixes the sample indices and the label order once, the same for every backend:
for a folder, the sorted sub-folder names are the classes and files are walked in sorted order,
exactly as torchvision's ``ImageFolder`` does. Files whose extension is not an image extension
are ignored (like ImageFolder and DALI's file reader) but counted, never silently dropped.
Shard samples are indexed in shard order, then tar order; ``paths[i]`` names ``shard.tar#member``
and :meth:`Listing.read` fetches the bytes with one positioned read (see :mod:`dali_bridge.data.shards.tar`).

This module lists folders and local file lists and picks the listing for a source; :class:`Listing`
is in :mod:`dali_bridge.data.sources.listing`, the WebDataset listing in
:mod:`dali_bridge.data.sources.webdataset`, a file list at a URL in :mod:`dali_bridge.data.sources.remote_files`.
"""
from __future__ import annotations

import errno
import os
import stat
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..shards.cache import ShardCache
from ..storage.store import ObjectStore
from ...util.urls import hide_signature, is_url, without_userinfo
from .source_check import source_store
from ...errors import SourceError  # noqa: F401
from .path_table import PathTable, PathTableBuilder
from .listing import CLASSES_PER_SAMPLE, MIN_CLASS_BOUND, Listing, class_bound, sparse_labels  # noqa: F401
from .webdataset import list_webdataset
from .file_list_lines import ListLine, listed_samples, parse_lines
from ...util.quoting import safe_name
from ...spec.model import SourceSpec
from ...util.text import NotUtf8Error, decode_utf8
from ...util.messages import package_log

log = package_log()

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
        raise SourceError(f"source.root: folder {root} does not exist; point source.root at a folder with one "
                          f"sub-folder of images per class (on the command line: --data DIR), or make generated "
                          f"sample images there: dali-bridge sample-data {root}")
    if not root.is_dir():
        raise SourceError(f"source.root: {root} is not a folder")
    classes = _class_folders(root)
    if not classes:
        raise SourceError(f"source.root: {root} has no class sub-folders (expected root/<class>/<image> files)")
    paths = PathTableBuilder()
    counts: list[int] = []   # images per class
    ignored: Counter = Counter()
    empty: list[str] = []
    for label, name in enumerate(classes):
        found = 0
        for dirpath, filenames in _walk(root / name):
            images = []
            for filename in sorted(filenames):
                if _is_image(filename, extensions):
                    images.append(filename)
                else:
                    ignored[os.path.splitext(filename)[1].lower()] += 1
            paths.add_in_folder(os.path.join(dirpath, ""), images)   # os.path.join(dirpath, filename), packed
            found += len(images)
        counts.append(found)
        if not found:
            empty.append(name)
    if empty:
        shown = ", ".join(safe_name(name) for name in empty[:20]) + (f" and {len(empty) - 20} more"
                                                                     if len(empty) > 20 else "")
        raise SourceError(f"source.root: class folder(s) with no images ({', '.join(extensions)}) under {root}: "
                          f"{shown} — remove them or add images (labels follow the sorted folder names)")
    labels = np.repeat(np.arange(len(classes), dtype=np.int64), counts)
    return Listing(paths.build(), labels, tuple(classes), str(root), ignored)


def list_file(file_list: str | Path, root: str | Path | None, extensions: tuple[str, ...],
              store: ObjectStore | None = None, cache: ShardCache | None = None) -> Listing:
    """A text file of ``path label`` lines (path may contain spaces; label is the last field).

    Blank lines and lines starting with ``#`` are skipped. Relative paths resolve against ``root``
    (default: the list file's folder). Every malformed line and missing file is reported at once,
    with its line number. With ``store`` the list or its ``root`` is at a URL and the images are
    objects read through it (:func:`~dali_bridge.data.sources.remote_files.list_file_at_url`).
    """
    if store is not None:
        from .remote_files import list_file_at_url

        return list_file_at_url(str(file_list), None if root is None else str(root), store, cache)
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
    problems: list[str] = []
    found: list[ListLine] = []
    paths: list[str] = []
    for line in parse_lines(content, str(file_list), problems):
        if is_url(line.entry):   # never a path made of a URL
            problems.append(f"{file_list}:{line.number}: {safe_name(line.entry)} is a URL, and this list and its "
                            f"root are local: put the list in the store beside the images, or set source.root to "
                            f"the images' URL folder and write the entries relative to it")
            continue
        path = Path(line.entry) if os.path.isabs(line.entry) else base / line.entry
        problem = _not_a_file(path)
        if problem:
            problems.append(f"{file_list}:{line.number}: file {safe_name(path)} {problem}")
            continue
        found.append(line)
        paths.append(str(path))
    return listed_samples(str(file_list), str(base), found, paths, problems)


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


def _store_and_cache(source: SourceSpec, location: str, key: str) -> tuple[ObjectStore, ShardCache | None]:
    """The process's client for a source at a URL (with the source's settings) and, with
    ``source.cache``, the node's cache of whole objects it reads through."""
    store = source_store(source, location, key)
    cache = ShardCache(source.cache_dir, source.cache_max_bytes, store) if source.cache_dir is not None else None
    return store, cache


def list_source(source: SourceSpec) -> Listing:
    """The listing of a validated source (its samples read with the source's pixel and byte caps)."""
    store, cache = None, None
    if source.type == "folder":
        listing = list_folder(source.root, source.extensions)
    elif source.type == "file_list":
        remote = next((loc for loc in (source.file_list, source.root) if loc is not None and is_url(loc)), None)
        if remote is not None:
            store, cache = _store_and_cache(source, remote, "file_list" if remote == source.file_list else "root")
        listing = list_file(source.file_list and without_userinfo(source.file_list),
                            source.root and without_userinfo(source.root), source.extensions, store, cache)
    elif source.type == "webdataset":
        if is_url(source.shards):
            store, cache = _store_and_cache(source, source.shards, "shards")
        # The listing, its paths, messages and cache keys hold the URLs without their credentials
        # (the store has them: source_store).
        listing = list_webdataset(without_userinfo(source.shards), source.image_keys, source.label_key,
                                  source.manifest and without_userinfo(source.manifest), store, cache)
    elif source.type == "parquet":
        from .parquet import list_parquet

        files = source.files
        if files and is_url(files[0]):   # all local or all at URLs of one scheme
            store, cache = _store_and_cache(source, files[0], "files")
            files = tuple(without_userinfo(f) for f in files)
        listing = list_parquet(files, source.image_column, source.label_column, store, cache)
    else:
        raise SourceError(f"source.type: unsupported source type {source.type!r}")
    return replace(_without_signatures(listing, source), max_pixels=source.max_pixels, max_bytes=source.max_bytes)


def _without_signatures(listing: Listing, source: SourceSpec) -> Listing:
    """The listing's paths and root with a signed URL's credentials hidden (``X-Amz-Signature=***``):
    they name samples, the source's reader keeps the URLs it fetches."""
    locations = {"webdataset": [source.shards], "parquet": list(source.files or ()),
                 "file_list": [source.file_list, source.root]}.get(source.type, [])
    if all(hide_signature(location) == location for location in locations if location and is_url(location)):
        return listing   # nothing to hide (checked on the source's few URLs, not on every path)
    return replace(listing, paths=PathTable.of(hide_signature(path) for path in listing.paths),
                   root=hide_signature(listing.root))
