"""The WebDataset source's listing: the converter's manifest (found, read within bounds, checked),
every shard's scan (local, or at URLs through :mod:`dali_bridge.data.shards.remote`), the labels and
sizes checked against the manifest, and :func:`list_webdataset`, which joins them into a
:class:`~dali_bridge.data.sources.listing.Listing`."""
from __future__ import annotations

import functools
import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..shards.remote import CachedShardSamples, RemoteShardSamples, list_remote_shards
from ..shards.cache import ShardCache
from ...util.braces import expand_braces
from ..shards.tar import ShardSamples, ShardScan, index_path, manifest_path, scan_shard
from ..storage.store import ObjectStore
from ..storage.listing import FetchError, ObjectInfo
from ...util.checks import is_int
from ...util.quoting import quoted, safe_name
from ...util.text import NotUtf8Error, decode_utf8
from ...errors import SourceError
from .listing import Listing, sparse_labels
from .path_table import PathTableBuilder
from .source_check import scheme_advice


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
    ``OSError``, :class:`~dali_bridge.util.text.NotUtf8Error`, or ``ValueError``/``RecursionError``
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


def _manifest_problems(paths: list[str], scans: list[ShardScan], sizes: list[int], manifest_file: str,
                       manifest_data: dict, label_key: str, local: bool) -> list[str]:
    """A problem per shard that is not the one the manifest records, the first found of: not listed
    in it, another size (``sizes``: one ``stat`` or HEAD each), another sample count, other labels,
    an index read (``local``: from disk here; a URL's is checked as it is listed) other than the one
    whose sha256 it records. A set mixed by an interrupted or concurrent ``convert``, or a shard
    replaced since. A manifest without a ``shards`` list (class names only) checks nothing."""
    if "shards" not in manifest_data:
        return []
    entries = {entry["file"]: entry for entry in manifest_data["shards"]}
    labelled = manifest_data.get("label_key", "cls") == label_key
    problems = []
    for path, scan, size in zip(paths, scans, sizes):
        entry = entries.get(os.path.basename(path))
        named = f"the manifest {safe_name(manifest_file)}"
        problem = (f"not among the shards {named} records" if entry is None
                   else _entry_problem(path, scan, size, entry, named, labelled, local))
        if problem:
            problems.append(f"{safe_name(path)}: {problem} (a changed shard, or a set mixed by an interrupted or "
                            f"concurrent convert): check the set with 'dali-bridge verify "
                            f"{safe_name(manifest_file)}', convert again to repair it")
    return problems


def _entry_problem(path: str, scan: ShardScan, size: int, entry: dict, named: str, labelled: bool,
                   local: bool) -> str | None:
    """How one shard differs from its entry in the manifest (``named``: "the manifest FILE"), or None."""
    if is_int(entry.get("bytes")) and size != entry["bytes"]:
        return f"{size} bytes, {named} records {entry['bytes']}"
    if len(scan.keys) != entry["samples"]:
        return f"{len(scan.keys)} samples, {named} records {entry['samples']}"
    recorded = entry.get("labels")
    if labelled and isinstance(recorded, str):
        differs = next((n for n, (ours, theirs) in enumerate(zip(scan.labels, recorded.split()))
                        if str(ours) != theirs), None)
        if differs is not None:
            return (f"sample {safe_name(scan.keys[differs])} has label {scan.labels[differs]}, {named} records "
                    f"{safe_name(recorded.split()[differs])}")
    expected = entry.get("index_sha256")
    if local and scan.from_index and isinstance(expected, str):
        digest = file_sha256(index_path(path))
        if digest != expected:
            return (f"its index {safe_name(os.path.basename(index_path(path)))} has sha256 {digest}, "
                    f"{named} records {safe_name(expected)}")
    return None


def file_sha256(path: str) -> str | None:
    """The sha256 of a (small) local file, or None when it cannot be read."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


def _local_scans(paths: list[str], image_keys: tuple[str, ...], label_key: str) -> list[ShardScan]:
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        shown = ", ".join(safe_name(p) for p in missing[:10]) + (f" and {len(missing) - 10} more"
                                                                  if len(missing) > 10 else "")
        raise SourceError(f"source.shards: {len(missing)} of {len(paths)} shard(s) do not exist: {shown}")
    return [scan_shard(path, image_keys, label_key) for path in paths]


def _remote_scans(paths: list[str], image_keys: tuple[str, ...], label_key: str,
                  store: ObjectStore, manifest: Callable[[], dict | None]) -> tuple[list[ShardScan], list[ObjectInfo]]:
    """Scans of shards at URLs (:func:`~dali_bridge.data.shards.remote.list_remote_shards`) and their HEADs."""
    scans, infos, problems = list_remote_shards(store, paths, image_keys, label_key, manifest=manifest)
    if problems:
        shown = problems[:10] + ([f"... and {len(problems) - 10} more"] if len(problems) > 10 else [])
        advice = next(filter(None, (scheme_advice(paths[0], problem) for problem in problems)), None)
        raise SourceError(f"source.shards: {len(problems)} of {len(paths)} shard(s) cannot be listed:\n  "
                          + "\n  ".join(shown) + (f"\n  ({advice})" if advice else ""))
    return scans, infos


@dataclass
class _ShardsFound:
    """What the scans of a pattern's shards found, joined in shard order."""
    names: PathTableBuilder = field(default_factory=PathTableBuilder)   # shard#member
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
        found.names.add_paths(scan.image_names, prefix=f"{path}#")
        found.labels.extend(scan.labels)
        found.shard_ids.extend([number] * len(scan.keys))
        found.offsets.extend(scan.offsets)
        found.sizes.extend(scan.sizes)
    return found


def _shard_classes(paths: list[str], scans: list[ShardScan], infos: list[ObjectInfo], store: ObjectStore | None,
                   found: _ShardsFound, manifest: tuple[str | None, dict | None], label_key: str) -> tuple[str, ...]:
    """The class names (the manifest's, else ``"0"``…``"max"``); adds to ``found.problems`` what the
    labels and the manifest say against each other."""
    manifest_file, manifest_data = manifest
    problems, labels, shard_ids = found.problems, found.labels, found.shard_ids
    if manifest_data is None and not problems:
        names = found.names.build()
        problems.extend(sparse_labels(labels, lambda i: f"{os.path.basename(paths[shard_ids[i]])}: "
                                                        f"{names[i].rsplit('#', 1)[1]}"))
    classes: tuple[str, ...] = ()
    if labels and not problems:
        classes = tuple(str(c) for c in range(max(labels) + 1))
    if manifest_data is not None:
        classes = tuple(str(c) for c in manifest_data["classes"])
        if not problems:  # a damaged shard's own problems say more than its size does
            shard_sizes = [info.size for info in infos] if store is not None else [os.stat(p).st_size for p in paths]
            problems.extend(_manifest_problems(paths, scans, shard_sizes, str(manifest_file), manifest_data,
                                               label_key, local=store is None))
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
    With ``store`` the pattern names objects at URLs, read through it (:mod:`dali_bridge.data.shards.remote`),
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
    classes = _shard_classes(paths, scans, infos, store, found, (manifest_file, manifest_data), label_key)
    if found.problems:
        problems = found.problems
        shown = problems[:50] + ([f"... and {len(problems) - 50} more"] if len(problems) > 50 else [])
        raise SourceError(f"source.shards: {len(problems)} problem(s) in {pattern}:\n  " + "\n  ".join(shown))
    if not found.labels:
        raise SourceError(f"source.shards: {pattern} holds no samples with a .{' or .'.join(image_keys)} image "
                          f"and a .{label_key} label")
    samples = _shard_samples(paths, found, infos, store, cache, manifest_data)
    return Listing(found.names.build(), np.asarray(found.labels, dtype=np.int64), classes, pattern, found.ignored,
                   samples)
