"""A file list whose images are objects at a URL: the list itself at a URL (or local, with a
``root`` at a URL), each relative entry taken against ``root`` (default: the list's own folder),
each entry that is a URL taken as it is.

The images are read as shards at a URL are (:mod:`dali_bridge.data.shards.remote`), each one an
object of its own: listing takes every image's size and ETag (on ``gs://``, generation) from the
store's LIST (S3, GCS: one request per 1,000 keys of a folder) or a HEAD each (HTTP); a sample is
then one GET of exactly that many bytes carrying the ETag (``If-Match``), retried within
``source.timeout``, so an image replaced since the listing is an error naming it, never other
bytes; a batch's GETs start together. With ``source.cache`` each image is downloaded whole once per
node into the shard cache, with its size checked, and read from there.
"""
from __future__ import annotations

import posixpath

import numpy as np

from ..shards.cache import ShardCache
from ..shards.remote import CachedShardSamples, RemoteShardSamples
from ..storage.listing import FetchError, ObjectInfo
from ..storage.store import ObjectStore
from ...errors import SourceError
from ...util.text import NotUtf8Error, decode_utf8
from ...util.urls import is_url, join_url, scheme_of, split_url
from .file_list_lines import ListLine, listed_samples, parse_lines
from .listing import Listing

# A list of 'path label' lines is tens of bytes a sample: this holds tens of millions.
MAX_LIST_BYTES = 1 << 30


def list_file_at_url(file_list: str, root: str | None, store: ObjectStore, cache: ShardCache | None = None) -> Listing:
    """The :class:`Listing` of a file list whose images are at URLs of ``store``'s scheme (see the module)."""
    base = root or split_url(file_list)[0]
    if not is_url(base):
        raise SourceError(f"source.root: a file list at {file_list} names its images relative to its own folder or "
                          f"to a root at a URL, not to the local folder {base}")
    content = _list_text(file_list, store)
    problems: list[str] = []
    lines = parse_lines(content, file_list, problems)
    urls: list[str] = []
    kept: list[ListLine] = []
    for line in lines:
        url = _entry_url(line.entry, base)
        if scheme_of(url) != store.scheme:
            problems.append(f"{file_list}:{line.number}: {line.entry} is not at a {store.scheme}:// URL like the "
                            f"list's other images (a list's images are all local or all in one store)")
            continue
        urls.append(url)
        kept.append(line)
    found: list[ObjectInfo] = []
    for line, url, answer in zip(kept, urls, store.listed(urls) if urls else []):
        if isinstance(answer, FetchError):
            problems.append(f"{file_list}:{line.number}: {answer.reason}")
        else:
            found.append(answer)
    samples = _samples(urls, found, store, cache) if urls and not problems else None
    return listed_samples(file_list, base, kept, urls, problems, samples)


def _list_text(file_list: str, store: ObjectStore) -> str:
    """The list's text: a local file, or an object fetched with one GET (within :data:`MAX_LIST_BYTES`)."""
    if not is_url(file_list):
        try:
            with open(file_list, "rb") as handle:
                data = handle.read(MAX_LIST_BYTES + 1)
        except OSError as exc:
            raise SourceError(f"source.file_list: cannot read {file_list}: {exc.strerror or exc}") from None
    else:
        head = store.info([file_list])[0]
        if isinstance(head, FetchError):
            raise SourceError(f"source.file_list: cannot read {head.reason}")
        if head.size > MAX_LIST_BYTES:
            raise SourceError(f"source.file_list: {file_list} is {head.size:,} bytes, more than a file list's "
                              f"{MAX_LIST_BYTES:,}: split it or convert the images to shards (dali-bridge convert)")
        answer = store.get([file_list])[0]
        if isinstance(answer, FetchError):
            raise SourceError(f"source.file_list: cannot read {answer.reason}")
        data = answer
    if len(data) > MAX_LIST_BYTES:
        raise SourceError(f"source.file_list: {file_list} is more than a file list's {MAX_LIST_BYTES:,} bytes")
    try:
        return decode_utf8(data, file_list)
    except NotUtf8Error as exc:
        raise SourceError(f"source.file_list: {exc}") from None


def _entry_url(entry: str, base: str) -> str:
    """A list entry as a URL: a URL as it is; a path taken against ``base`` (``./`` and ``..`` resolved
    within the URL's path, never against a local folder)."""
    if is_url(entry):
        return entry
    scheme_and_host, _, path = base.partition("://")
    host, _, folder = path.partition("/")
    joined = posixpath.normpath(posixpath.join("/" + folder, entry))
    return join_url(f"{scheme_and_host}://{host}", joined.lstrip("/"))


def _samples(urls: list[str], infos: list[ObjectInfo], store: ObjectStore,
             cache: ShardCache | None) -> RemoteShardSamples:
    """Each image a whole object: 'shard' ``i`` is image ``i``, its bytes from offset 0."""
    count = len(urls)
    where = (np.arange(count), np.zeros(count, dtype=np.int64), np.asarray([info.size for info in infos]))
    etags = tuple(info.etag for info in infos)
    if cache is None:
        return RemoteShardSamples(tuple(urls), *where, etags=etags, store=store)
    return CachedShardSamples(tuple(urls), *where, etags=etags, store=store, cache=cache,
                              shard_bytes=tuple(info.size for info in infos), sha256s=(None,) * count)
