"""A source at a URL checked the way the loader first reads it, for ``dali-bridge validate``: the
shards listed (the store's LIST on S3 and GCS, a HEAD each over HTTP), an explicit manifest and a
file list HEADed, Parquet globs listed and plain files HEADed — each request retried within the
source's own ``timeout``, through the process's client with the source's settings. Nothing is
downloaded and no local path is made of a URL.

A failure that is not "this object does not exist" (nothing answers, the request times out, a 5xx,
a refusal) is named with what to check for its scheme: the endpoint, the region, the credentials.
A bucket in another region is named by the store with the region S3 gives and the setting to
change (:mod:`dali_bridge.data.storage.regions`): that advice stands alone.
"""
from __future__ import annotations

from ..storage.listing import FetchError
from ..storage.store import ObjectStore, store_for
from ...errors import SourceError
from ...spec.model import SourceSpec
from ...util.braces import expand_braces
from ...util.quoting import shortened
from ...util.urls import StorageError, is_url, scheme_of

# What to check when a store does not answer as expected, per scheme.
_ADVICE = {
    "s3": "check the endpoint (AWS_ENDPOINT_URL or storage_options.endpoint_url), the region (AWS_DEFAULT_REGION "
          "or storage_options.client_kwargs.region_name) and the credentials (AWS_* variables, AWS_PROFILE)",
    "gs": "check the endpoint (STORAGE_EMULATOR_HOST or storage_options.endpoint_url) and the credentials "
          "(GOOGLE_APPLICATION_CREDENTIALS, gcloud auth application-default login; FSSPEC_GS_TOKEN=anon for a "
          "public bucket)",
    "http": "check that the server in the URL is up and reachable from here (host, port, HTTP_PROXY/HTTPS_PROXY) "
            "and answers HEAD and Range requests",
}
# A message (key, count, reason, advice) fits the spec's problem length with the advice whole.
_REASON_CHARS = 300
_ADVICE.update(gcs=_ADVICE["gs"], https=_ADVICE["http"])
# Reasons that say already what is wrong and what to do: a missing object, the credentials of a
# 401/403, a bucket in another region (the store names the region and the setting).
_SAID = ("does not exist", "matches no file", "check the credentials", "AWS_DEFAULT_REGION")


def scheme_advice(location: str, reason: str) -> str | None:
    """What to check for ``location``'s scheme after a request failed for ``reason``; None when the
    reason says already (the store names the credentials of a 401/403, the region of a bucket in
    another region) or the object is missing."""
    if any(said in reason for said in _SAID):
        return None
    return _ADVICE.get(scheme_of(location) or "")


def storage_advice(location: str, reason: str) -> str:
    """``reason`` (why a request about ``location`` failed) followed by :func:`scheme_advice`."""
    advice = scheme_advice(location, reason)
    return f"{shortened(reason, _REASON_CHARS)}; {advice}" if advice else reason


def source_store(source: SourceSpec, location: str, key: str) -> ObjectStore:
    """The process's client for a source at a URL, with the source's settings (``storage_options``,
    ``max_requests``, ``timeout``, ``redirect_hosts``) and the credentials ``location`` carries as
    ``user:password@`` (the store keeps them; every URL it is handed is used without them);
    :class:`SourceError` at ``source.KEY`` when it cannot be made."""
    try:
        return store_for(location, dict(source.storage_options), source.max_requests, source.timeout,
                         source.redirect_hosts)
    except StorageError as exc:
        raise SourceError(f"source.{key}: {exc}") from None


def source_problems(source: SourceSpec) -> list[tuple[str, str]]:
    """(``source`` key, message) for each part of the source at a URL that the loader could not
    read: shards, a manifest, Parquet files or a file list that do not exist, or a store that does
    not answer within ``source.timeout``. Local paths are the spec's to check
    (:func:`~dali_bridge.spec.source_keys.check_source_paths`); they are not looked at here."""
    try:
        if source.type == "webdataset" and source.shards and is_url(source.shards):
            return _shard_problems(source)
        if source.type == "parquet" and source.files and is_url(source.files[0]):
            return _parquet_problems(source)
        if source.type == "file_list" and source.file_list and is_url(source.file_list):
            return _object_problems(source, "file_list", [source.file_list])
    except SourceError as exc:   # no client for the scheme
        key, _, message = str(exc).partition(": ")
        return [(key.removeprefix("source."), message)]
    return []


def _shard_problems(source: SourceSpec) -> list[tuple[str, str]]:
    """The shards as the loader lists them (LIST pages, or a HEAD each over HTTP), then an explicit
    manifest (the default one may be absent)."""
    try:
        urls = expand_braces(source.shards)
    except ValueError:
        return []   # the spec reports the pattern
    store = source_store(source, source.shards, "shards")
    answers = store.listed(urls)
    failed = [answer for answer in answers if isinstance(answer, FetchError)]
    if failed:
        missing = [answer for answer in failed if answer.missing]
        if len(missing) == len(failed):
            return [("shards", f"{len(missing)} of {len(urls)} shard(s) do not exist; the first: "
                               f"{missing[0].reason}")]
        other = next(answer for answer in failed if not answer.missing)
        reason = other.reason.removeprefix(f"{other.url}: ")   # the listing names the URL it asked for
        return [("shards", f"{len(failed)} of {len(urls)} shard(s) cannot be listed: "
                           f"{storage_advice(source.shards, reason)}")]
    if source.manifest is not None:
        return _object_problems(source, "manifest", [source.manifest])
    return []


def _object_problems(source: SourceSpec, key: str, urls: list[str]) -> list[tuple[str, str]]:
    """One HEAD per object, as the loader's first GET of it would find it."""
    store = source_store(source, urls[0], key)
    return [(key, storage_advice(answer.url, answer.reason)) for answer in store.info(urls)
            if isinstance(answer, FetchError)]


def _parquet_problems(source: SourceSpec) -> list[tuple[str, str]]:
    """The files as the loader expands them: each glob listed, each plain file HEADed."""
    from .parquet import expand_files

    store = source_store(source, source.files[0], "files")
    try:
        expand_files(source.files, store)
    except SourceError as exc:
        message = str(exc).removeprefix("source.files: ")
        return [("files", storage_advice(source.files[0], message))]
    return []
