"""``convert`` to a URL and ``verify`` of shards at a URL.

``convert`` writes the shards, their indexes and the manifest into a local scratch folder (the
local converter, unchanged), then uploads them concurrently, the manifest last: a reader that
finds the manifest finds every shard it lists. ``verify`` lists every shard the manifest lists
(LIST on S3, HEADs over HTTP), streams the ones of the right size through sha256, several shards
at a time, and checks each index against the sha256 the manifest records.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from .convert_staging import ConvertError, check_pattern
from ..data.storage.store import ObjectStore, Range, store_for
from ..data.storage.listing import FetchError, ObjectInfo
from ..util.urls import StorageError, join_url, redact, split_url

UPLOADS = 8          # files uploaded at once
VERIFIES = 4         # shards hashed at once
PIECE = 16 << 20     # bytes per ranged GET while hashing


def convert_to_url(source: Any, out_pattern: str, *, convert_locally: Callable[..., Any], overwrite: bool = False,
                   **options: Any):
    """:func:`~dali_bridge.tools.convert.convert` with ``out_pattern`` at a URL (``s3://b/p/train-%06d.tar``):
    ``convert_locally`` (the local converter, which calls this) writes the set into a scratch folder."""
    from ..data.shards.tar import manifest_path

    check_pattern(out_pattern)
    try:
        store = store_for(out_pattern)
    except StorageError as exc:
        raise ConvertError(str(exc)) from None
    folder, name = split_url(out_pattern)
    if not overwrite:
        heads = store.info([out_pattern % 0, manifest_path(out_pattern)])
        existing = [url for url, head in zip([out_pattern % 0, manifest_path(out_pattern)], heads)
                    if isinstance(head, ObjectInfo)]
        if existing:
            raise ConvertError(f"output exists: {', '.join(existing)} (pass --overwrite to replace it)")
    with tempfile.TemporaryDirectory(prefix="dali-bridge-convert-") as scratch:
        result = convert_locally(source, os.path.join(scratch, name), overwrite=True, **options)
        manifest = Path(result.manifest)
        files = sorted(p for p in Path(scratch).iterdir() if p.is_file() and p != manifest)
        with ThreadPoolExecutor(max_workers=UPLOADS) as pool:
            failures = [f for f in pool.map(lambda p: _upload(store, p, join_url(folder, p.name)), files) if f]
        if failures:
            raise ConvertError(f"{len(failures)} upload(s) failed; the manifest was not written: {failures[0]}")
        failure = _upload(store, manifest, join_url(folder, manifest.name))
        if failure:
            raise ConvertError(failure)
    return replace(result, shards=tuple(join_url(folder, Path(s).name) for s in result.shards),
                   manifest=join_url(folder, manifest.name), pattern=join_url(folder, Path(result.pattern).name))


def _upload(store: ObjectStore, path: Path, url: str) -> str | None:
    try:
        store.upload(str(path), url)
    except StorageError as exc:
        return str(exc)
    return None


def verify_url(manifest_url: str, *, progress: bool = False) -> list[str]:
    """:func:`~dali_bridge.tools.convert.verify_shards` for a manifest at a URL: the problems found."""
    from ..util.progress import progress as progress_bar
    from ..util.checks import is_int
    from ..data.sources.webdataset import MAX_MANIFEST_BYTES, manifest_problem
    from ..util.text import decode_utf8

    store = store_for(manifest_url)
    answer = store.get([manifest_url])[0]
    if isinstance(answer, FetchError):
        return [answer.reason]
    try:
        data = json.loads(decode_utf8(answer[:MAX_MANIFEST_BYTES + 1], manifest_url))
    except ValueError as exc:
        return [f"{manifest_url}: not a dali-bridge shard manifest: {exc}"]
    problem = manifest_problem(data)
    if problem is None and not all(is_int(e.get("bytes")) and isinstance(e.get("sha256"), str) for e in data["shards"]):
        problem = "has a shards entry without its 'bytes' count or 'sha256'"
    if problem:
        return [f"{manifest_url}: not a dali-bridge shard manifest: it {problem}"]
    folder = split_url(manifest_url)[0]
    entries = data["shards"]
    urls = [join_url(folder, entry["file"]) for entry in entries]
    heads = store.listed(urls)

    def check(item: tuple[str, dict, ObjectInfo | FetchError]) -> str | None:
        url, entry, head = item
        if isinstance(head, FetchError):
            return "missing" if head.missing else head.reason
        if head.size != entry["bytes"]:
            return f"{url}: {head.size} bytes, the manifest records {entry['bytes']}"
        digest = _sha256(store, url, head)
        if isinstance(digest, FetchError):
            return digest.reason
        return None if digest == entry["sha256"] else \
            f"{url}: sha256 {digest} differs from the manifest's {entry['sha256']}"

    found = []
    with ThreadPoolExecutor(max_workers=VERIFIES) as pool, \
            progress_bar(total=len(urls), unit="shard", description=f"verify {redact(manifest_url)}",
                         enabled=progress) as bar:
        for problem in pool.map(check, zip(urls, entries, heads)):
            found.append(problem)
            bar.update(1)
    problems = [p if p != "missing" else f"{url}: missing" for url, p in zip(urls, found) if p]
    return [redact(p) for p in problems + _index_problems(store, urls, entries, manifest_url)]


def _index_problems(store: ObjectStore, urls: list[str], entries: list[dict], manifest_url: str) -> list[str]:
    """A problem per index whose sha256 is not the one the manifest records (those it records)."""
    from .convert_staging import index_problem
    from ..data.shards.tar import index_path

    recorded = [(index_path(url), entry["index_sha256"]) for url, entry in zip(urls, entries)
                if isinstance(entry.get("index_sha256"), str)]
    texts = store.get([index for index, _ in recorded])
    problems = []
    for (index, expected), text in zip(recorded, texts):
        if isinstance(text, FetchError) and not text.missing:
            problems.append(text.reason)
            continue
        digest = None if isinstance(text, FetchError) else hashlib.sha256(text).hexdigest()
        problems.append(index_problem(index, digest, expected, manifest_url))
    return [p for p in problems if p]


def _sha256(store: ObjectStore, url: str, head: ObjectInfo) -> str | FetchError:
    digest = hashlib.sha256()
    for start in range(0, head.size, 4 * PIECE):
        pieces = [Range(url, s, min(PIECE, head.size - s), head.etag)
                  for s in range(start, min(head.size, start + 4 * PIECE), PIECE)]
        for piece in store.fetch(pieces):
            if isinstance(piece, FetchError):
                return piece
            digest.update(piece)
    return digest.hexdigest()
