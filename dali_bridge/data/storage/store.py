"""Object storage below the listing: "give me these byte ranges of these objects", concurrently and retried.

A URL source (``s3://``, ``gs://``, ``http(s)://``) is read through fsspec's asynchronous file
systems (s3fs, gcsfs, fsspec's HTTP on aiohttp): one event loop per process runs every request,
at most ``max_requests`` of them in flight, each a ranged GET of exactly the bytes asked for. A
transient failure (throttling, a 5xx, a reset connection, a body shorter than its range, a
stalled read) is retried with exponential backoff and jitter until the request's ``timeout``
runs out; a permanent one (gone, access denied, changed since it was listed, a bucket in another
region: :mod:`dali_bridge.data.storage.regions`) is not retried.
Either way the caller gets a :class:`FetchError` naming the URL, the range and the last error,
never a hang.

fsspec over obstore: one interface covers S3, GCS and HTTP with the file systems users already
configure (``AWS_*`` variables, ``AWS_ENDPOINT_URL``, profiles, ``GOOGLE_APPLICATION_CREDENTIALS``),
and each forked process makes its own client. On S3 a sample's ranged GET is a plain HTTP request
of a URL s3fs signed once per object (:mod:`dali_bridge.data.storage.presigned`): as cheap per request as
obstore, whose runtime does not survive a fork (docs/object-storage.md weighs the two).

Credentials are never taken from ``storage_options`` (:func:`secret_option` refuses them); a
URL's ``user:password@`` becomes the client's (:func:`store_for`), and the store's requests,
results and messages name the URL without it. None is ever shown: every message passes through
:func:`redact` (:mod:`dali_bridge.util.urls`), which removes the secret values the process
environment holds, any ``user:password@`` in a URL and a signed URL's credentials. Redirects and
ranged answers are checked by :mod:`dali_bridge.data.storage.answers`. The client is created per process on first
use, so forked DataLoader workers and DALI's feeder each hold their own (a client's event loop and
connections do not survive a fork).
"""
from __future__ import annotations

import asyncio
import base64
import importlib
import json
import os
import random
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterator, Sequence

from ...spec.model import DEFAULT_MAX_REQUESTS, DEFAULT_TIMEOUT  # noqa: F401
from .answers import AnswerRefused, check_content_range, open_following
from .listing import FetchError, ListingRequests, ObjectInfo, gcs_object_info  # noqa: F401
from .regions import answer_from_client_error, bucket_url_of, wrong_region, wrong_region_in
from ...util.urls import (StorageError, is_url, redact, require_client, scheme_of, split_userinfo,  # noqa: F401
                          without_userinfo)

BACKOFF_FIRST = 0.05            # seconds before the first retry; doubled each time, capped
BACKOFF_CAP = 5.0
LIST_PAGE = 1000                # keys per LIST request (S3's and GCS's most)


@dataclass(frozen=True)
class Range:
    """``size`` bytes of ``url`` from byte ``start``; ``etag`` (when known) must still match."""
    url: str
    start: int
    size: int
    etag: str | None = None


class _Permanent(Exception):
    """A failure another attempt cannot fix (404, 403, 412, a server ignoring Range)."""

    def __init__(self, reason: str, missing: bool = False, changed: bool = False):
        super().__init__(reason)
        self.missing, self.changed = missing, changed


class _Transient(Exception):
    """A failure worth another attempt (5xx, throttling, a reset, a short body)."""


def _status_failure(status: int, url: str, what: str) -> Exception:
    if status == 404:
        return _Permanent(f"{url} does not exist (404)", missing=True)
    if status in (401, 403):
        return _Permanent(f"access to {url} denied ({status}): check the credentials in the environment "
                          f"(AWS_* variables, AWS_PROFILE, GOOGLE_APPLICATION_CREDENTIALS)")
    if status == 412:
        return _Permanent(f"{url} changed since it was listed (its ETag or generation differs): the listing "
                          f"describes other bytes — restart to list it again", changed=True)
    if status == 416:
        return _Permanent(f"{url} is shorter than it was when listed ({what} is past its end)", changed=True)
    if status == 301:   # moved for good, and no Location to follow (one with a Location was followed or refused)
        return _Permanent(f"{url} has moved permanently (301) and the server does not say where (no Location)")
    return _Transient(f"{what}: HTTP {status}")


class ObjectStore(ListingRequests):
    """One scheme's client in this process: concurrent ranged GETs, HEADs and whole-object reads.

    Pickles as its settings only; a process that did not create the client (a forked or spawned
    worker) makes its own on first use.
    """

    def __init__(self, scheme: str, storage_options: dict[str, Any] | None = None,
                 max_requests: int = DEFAULT_MAX_REQUESTS, timeout: float = DEFAULT_TIMEOUT,
                 redirect_hosts: Sequence[str] = (), credentials: tuple[str, str | None] | None = None):
        require_client(scheme)
        if credentials is not None and scheme not in ("s3", "http", "https"):
            raise StorageError(f"{scheme}:// URLs take no user:password@: the client's credentials come from "
                               f"the environment (GOOGLE_APPLICATION_CREDENTIALS, gcloud's application-default "
                               f"login); remove them from the URL")
        self.scheme = scheme
        self.storage_options = dict(storage_options or {})
        self.max_requests = max_requests
        self.timeout = timeout
        self.redirect_hosts = tuple(redirect_hosts)
        # From a URL's user:password@ (the URL is kept without it): S3's access key id and secret, HTTP's
        # basic authentication. Never in a message, a repr or a listing.
        self._credentials = credentials
        self._reset()

    def __repr__(self) -> str:
        return f"ObjectStore({self.scheme}://, max_requests={self.max_requests}, timeout={self.timeout:g})"

    def _reset(self) -> None:
        self._fs: Any = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._semaphore: asyncio.Semaphore | None = None
        self._presigned: Any = None   # s3:// ranged GETs (dali_bridge.data.storage.presigned), made on first use

    def __getstate__(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "storage_options": self.storage_options, "max_requests": self.max_requests,
                "timeout": self.timeout, "redirect_hosts": self.redirect_hosts, "_credentials": self._credentials}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def _filesystem(self) -> Any:
        if self._pid != os.getpid():
            # A forked child: the parent's loop thread is not here, its connections are shared.
            # The inherited client is kept, never closed: closing its connections would
            # unregister the sockets from the event-loop selector the child shares with the
            # parent, and the parent's next answers on them would never arrive.
            _INHERITED.extend([self._fs, self._presigned and self._presigned.inherited()])
            self._reset()
        with self._lock:
            if self._fs is None:
                import fsspec

                options = dict(self.storage_options)
                if self.scheme == "s3":
                    # One attempt per call (the client is called directly, not through s3fs's
                    # retrying wrapper): this module retries, within the sample's timeout.
                    config = dict(options.pop("config_kwargs", {}))
                    config.setdefault("retries", {"total_max_attempts": 1})
                    config.setdefault("connect_timeout", min(self.timeout, 10.0))
                    config.setdefault("read_timeout", self.timeout)
                    options["config_kwargs"] = config
                options.update(self._client_credentials())
                self._fs = fsspec.filesystem(self.scheme, skip_instance_cache=True, **options)
            return self._fs

    def _client_credentials(self) -> dict[str, Any]:
        """The URL's credentials as the client's own options: s3fs's ``key``/``secret``; over HTTP
        they go with each request to the URL's own host (``auth``), never to a host it redirects to."""
        if self._credentials is None:
            return {}
        user, password = self._credentials
        if self.scheme == "s3":
            return {"key": user, "secret": password or ""}
        return {"headers": self._authorization()}

    def _authorization(self) -> dict[str, str]:
        """HTTP basic authentication from the URL's ``user:password@`` (none without)."""
        if self._credentials is None or self.scheme not in ("http", "https"):
            return {}
        token = base64.b64encode(f"{self._credentials[0]}:{self._credentials[1] or ''}".encode()).decode()
        return {"Authorization": f"Basic {token}"}

    # ---- running coroutines on the client's loop

    def _run(self, make: Callable[[], Awaitable[Any]]) -> Any:
        from fsspec.asyn import sync

        fs = self._filesystem()

        async def main() -> Any:
            if hasattr(fs, "set_session"):
                # Made once per process, outside any request's timeout: creating a client loads
                # its service model, which is not the server being slow.
                await fs.set_session()
            return await make()

        return sync(fs.loop, main)

    async def _bounded(self, attempt: Callable[[], Awaitable[Any]], url: str, what: str) -> Any:
        """``attempt()`` retried with backoff and jitter until it succeeds or ``timeout`` runs out;
        a :class:`FetchError` instead of an exception."""
        loop = asyncio.get_running_loop()
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.max_requests)
        deadline: float | None = None
        attempts, last = 0, "no attempt finished"
        while True:
            async with self._semaphore:  # time waiting for a slot is not the request's time
                deadline = deadline or loop.time() + self.timeout
                attempts += 1
                try:
                    return await asyncio.wait_for(attempt(), max(deadline - loop.time(), 0.001))
                except (_Permanent, AnswerRefused) as exc:
                    return FetchError(url, redact(f"{what}: {exc}"), exc.missing, exc.changed)
                except (asyncio.TimeoutError, TimeoutError):
                    last = f"no answer within the {self.timeout:g} s timeout"
                except _TRANSIENT as exc:  # connection errors, 5xx, throttling, short bodies
                    last = _describe(exc)
            delay = min(BACKOFF_CAP, BACKOFF_FIRST * 2 ** (attempts - 1)) * random.uniform(0.5, 1.0)
            if loop.time() + delay >= deadline:
                return FetchError(url, redact(f"{what} failed after {attempts} attempt(s) within "
                                              f"source.timeout ({self.timeout:g} s); last error: {last}"))
            await asyncio.sleep(delay)

    # ---- the public requests

    def fetch(self, ranges: Sequence[Range]) -> list[bytes | FetchError]:
        """Each range's bytes (exactly ``size`` of them) or why not, fetched concurrently."""
        if not ranges:
            return []
        ranges = _bare_ranges(ranges)
        return self._run(lambda: asyncio.gather(*(self._fetch_one(r) for r in ranges)))

    def start(self, ranges: Sequence[Range]) -> list[Future]:
        """:meth:`fetch`'s requests started on the client's loop, in order, without waiting: each
        future gives its range's bytes or a :class:`FetchError`, within the request's timeout."""
        fs = self._filesystem()
        self._run(lambda: asyncio.sleep(0))   # the session made (once per process) before requests start
        ranges = _bare_ranges(ranges)
        return [asyncio.run_coroutine_threadsafe(self._fetch_one(r), fs.loop) for r in ranges]

    def info(self, urls: Sequence[str]) -> list[ObjectInfo | FetchError]:
        """Each object's size and ETag (one HEAD each), concurrently."""
        urls = _bare(urls)
        return self._run(lambda: asyncio.gather(*(self._bounded(lambda u=u: self._head(u), u, f"HEAD {u}")
                                                  for u in urls)))

    def listed(self, urls: Sequence[str]) -> list[ObjectInfo | FetchError]:
        """Each object's size and version as :meth:`info` gives them, from the store's LIST where it
        has one (:mod:`dali_bridge.data.storage.listing`): on S3 and GCS one request per 1,000 keys between
        the first and the last of a folder's URLs (a missing object is a missing :class:`FetchError`);
        over HTTP (no LIST) one HEAD each."""
        return self._listed(_bare(urls), LIST_PAGE)

    def get(self, urls: Sequence[str]) -> list[bytes | FetchError]:
        """Whole (small) objects, concurrently: indexes and manifests."""
        urls = _bare(urls)
        return self._run(lambda: asyncio.gather(*(self._bounded(lambda u=u: self._get_whole(u), u, f"GET {u}")
                                                  for u in urls)))

    def download(self, url: str, path: str, size: int, etag: str | None = None, piece: int = 16 << 20) -> None:
        """Write the object's ``size`` bytes to ``path``: ranged GETs of ``piece`` bytes, four at a
        time, each retried as a sample's read is; :class:`StorageError` naming the failed range."""
        # An existing file is a reservation made at its full size (see shard_cache): written over, not truncated.
        with open(path, "r+b" if os.path.exists(path) else "wb") as out:
            for _, data in pieces(self, without_userinfo(url), size, etag, piece=piece):
                out.write(data)

    def upload(self, path: str, url: str) -> None:
        """Write a local file to ``url`` (``convert`` to a URL; the client streams it, multipart on S3);
        :class:`StorageError`, redacted."""
        url = without_userinfo(url)
        try:
            self._filesystem().put_file(path, url)
        except Exception as exc:  # the clients' errors have no common base; all become one message
            raise StorageError(redact(f"cannot write {url}: {self._failure(exc, url)}")) from None

    def glob(self, pattern: str) -> list[str]:
        """The objects ``pattern`` (``*``, ``?``, ``[...]`` in its last parts) matches, as URLs, sorted."""
        fs = self._filesystem()
        pattern = without_userinfo(pattern)
        try:
            found = fs.glob(pattern)
        except Exception as exc:  # the clients' errors have no common base; all become one message
            raise StorageError(redact(f"cannot list {pattern}: {self._failure(exc, pattern)}")) from None
        return sorted(path if is_url(path) else f"{self.scheme}://{path}" for path in found)

    def _failure(self, exc: BaseException, url: str) -> str:
        """A client library's exception from a call it made itself (a glob, an upload), described:
        on S3, a bucket in another region named as such."""
        if self.scheme == "s3":
            refused = wrong_region_in(exc, bucket_url_of(url))
            if refused is not None:
                return str(refused)
        return _describe(exc)

    async def _fetch_one(self, request: Range) -> bytes | FetchError:
        end = request.start + request.size - 1
        what = f"GET {request.url} bytes {request.start}-{end}"

        async def attempt() -> bytes:
            data = await self._get_range(request)
            if len(data) != request.size:
                raise _Transient(f"short body: {len(data)} of {request.size} bytes")
            return data

        return await self._bounded(attempt, request.url, what)

    # ---- one request per scheme

    async def _get_range(self, request: Range) -> bytes:
        fs = self._filesystem()
        header = f"bytes={request.start}-{request.start + request.size - 1}"
        if self.scheme == "s3":  # signed once per object, then plain HTTP: a third of the CPU per GET
            from .presigned import PresignedGets

            self._presigned = self._presigned or PresignedGets()
            return await self._presigned.get(fs, request.url, request.start, request.size, request.etag,
                                             _status_failure, _Transient, self.redirect_hosts)
        if self.scheme in ("http", "https"):
            headers = {"Range": header, **({"If-Match": request.etag} if request.etag else {})}
            session = await fs.set_session()
            async with await self._http(session, "GET", request.url, headers) as response:
                if response.status == 200:
                    raise _Permanent(f"the server at {request.url} ignores Range requests (answered 200 to "
                                     f"{header}); serve the shards from a server that supports them")
                if response.status != 206:
                    raise _status_failure(response.status, request.url, f"GET {header}")
                check_content_range(response, request.start, request.size, request.url)
                return await response.read()
        # gs://: the JSON API's media download; a generation other than the listed one answers 412.
        return await self._gcs_media(request.url, f"GET {header}", {"Range": header}, request.etag,
                                     (request.start, request.size))

    async def _s3_call(self, fs: Any, url: str, method: str, **kwargs: Any) -> Any:
        from botocore.exceptions import ClientError, ParamValidationError

        client = await fs.set_session()
        try:
            response = await getattr(client, method)(**kwargs, **fs.req_kw)
        except ParamValidationError as exc:   # a bucket or key S3 cannot name: no attempt will do better
            raise _Permanent(f"{url}: {exc}") from None
        except ClientError as exc:
            # The bucket is in another region (what botocore's own region redirect did not fix): permanent.
            refused = wrong_region(answer_from_client_error(exc.response), f"s3://{kwargs['Bucket']}",
                                   client.meta.region_name)
            if refused is not None:
                raise refused from None
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "NoSuchBucket"):
                status = 404
            raise _status_failure(status, url, f"{method} {exc.response.get('Error', {}).get('Code', '')}") from None
        if method in ("head_object", "list_objects_v2"):
            return response
        body = response["Body"]
        try:
            return await body.read()
        finally:
            body.close()

    async def _http(self, session: Any, method: str, url: str, headers: dict[str, str]) -> Any:
        """An HTTP(S) request's final answer, redirects followed within the allowed hosts
        (:mod:`dali_bridge.data.storage.answers`), the URL's credentials sent to its own host only."""
        return await open_following(session, method, self._filesystem().encode_url(url), shown=url,
                                    headers=headers, own_headers=self._authorization(),
                                    allowed_hosts=self.redirect_hosts)

    async def _gcs_request(self, url: str, what: str, path: str, *args: str, headers: dict[str, str] | None = None,
                           expect: tuple[int, int] | None = None, **params: Any) -> bytes:
        """One GET of the GCS JSON API (``path`` below ``storage/v1/``, ``args`` quoted into it) on
        gcsfs's session with its credentials and requester-pays project: one attempt, not gcsfs's
        retrying ``_call`` (this module retries within the request's timeout). ``expect``: the
        (start, size) of a ranged GET, which a 206 answer must hold."""
        fs = self._filesystem()
        session = await fs._set_session()
        async with session.get(fs._format_path(path, args), params=fs._get_params(params),
                               headers=fs._get_headers(headers)) as response:
            if response.status not in (200, 206):
                raise _status_failure(response.status, url, what)
            if expect is not None and response.status == 206:
                check_content_range(response, expect[0], expect[1], url)
            return await response.read()

    async def _gcs_json(self, url: str, what: str, path: str, *args: str, **params: Any) -> Any:
        return json.loads(await self._gcs_request(url, what, path, *args, **params))

    async def _gcs_media(self, url: str, what: str, headers: dict[str, str], generation: str | None,
                         expect: tuple[int, int] | None = None) -> bytes:
        bucket, key, _ = self._filesystem().split_path(url)
        return await self._gcs_request(url, what, "b/{}/o/{}", bucket, key, headers=headers, expect=expect,
                                       alt="media", ifGenerationMatch=generation)

    async def _head(self, url: str) -> ObjectInfo:
        fs = self._filesystem()
        if self.scheme == "s3":
            bucket, key, _ = fs.split_path(url)
            head = await self._s3_call(fs, url, "head_object", Bucket=bucket, Key=key)
            modified = head.get("LastModified")
            return ObjectInfo(int(head["ContentLength"]), head.get("ETag"),
                              modified.timestamp() if modified is not None else None)
        if self.scheme in ("http", "https"):
            from email.utils import parsedate_to_datetime

            session = await fs.set_session()
            async with await self._http(session, "HEAD", url, {"Accept-Encoding": "identity"}) as response:
                if response.status != 200:
                    raise _status_failure(response.status, url, "HEAD")
                if "Content-Length" not in response.headers:
                    raise _Permanent(f"the server does not say the size of {url} (no Content-Length)")
                stamp = response.headers.get("Last-Modified")
                return ObjectInfo(int(response.headers["Content-Length"]), response.headers.get("ETag"),
                                  parsedate_to_datetime(stamp).timestamp() if stamp else None)
        bucket, key, _ = fs.split_path(url)   # gs://: the object resource, its generation the version
        return gcs_object_info(await self._gcs_json(url, "GET", "b/{}/o/{}", bucket, key))

    async def _get_whole(self, url: str) -> bytes:
        fs = self._filesystem()
        if self.scheme == "s3":
            bucket, key, _ = fs.split_path(url)
            return await self._s3_call(fs, url, "get_object", Bucket=bucket, Key=key)
        if self.scheme in ("http", "https"):
            session = await fs.set_session()
            async with await self._http(session, "GET", url, {}) as response:
                if response.status != 200:
                    raise _status_failure(response.status, url, "GET")
                return await response.read()
        return await self._gcs_media(url, "GET", {}, None)


def pieces(store: Any, url: str, size: int, etag: str | None = None, *,
           piece: int = 16 << 20) -> Iterator[tuple[int, bytes]]:
    """An object's ``size`` bytes as (offset, bytes), in order: ranged GETs of ``piece`` bytes through
    ``store.fetch``, four at a time, each retried as a sample's read is; :class:`StorageError` naming
    the failed range."""
    for first in range(0, size, 4 * piece):
        group = [Range(url, start, min(piece, size - start), etag)
                 for start in range(first, min(size, first + 4 * piece), piece)]
        for request, answer in zip(group, store.fetch(group)):
            if isinstance(answer, FetchError):
                raise StorageError(answer.reason)
            yield request.start, answer


def _bare(urls: Sequence[str]) -> list[str]:
    """The URLs without userinfo: a store was made with a URL's credentials (:func:`store_for`);
    its requests, results and messages name the URLs without them."""
    return [without_userinfo(url) if "@" in url else url for url in urls]


def _bare_ranges(ranges: Sequence[Range]) -> Sequence[Range]:
    if not any("@" in r.url for r in ranges):
        return ranges
    return [Range(without_userinfo(r.url), r.start, r.size, r.etag) for r in ranges]


def _transient_errors() -> tuple[type[BaseException], ...]:
    """What another attempt may fix: the clients' connection and protocol errors, OSError, ours."""
    errors: list[type[BaseException]] = [_Transient, OSError, asyncio.IncompleteReadError]
    for module, name in (("aiohttp", "ClientError"), ("botocore.exceptions", "BotoCoreError")):
        try:
            errors.append(getattr(importlib.import_module(module), name))
        except ImportError:
            pass
    return tuple(errors)


_TRANSIENT = _transient_errors()


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, _Transient) else f"{type(exc).__name__}: {text}"


_INHERITED: list[Any] = []   # clients a forked process got from its parent (see ObjectStore._filesystem)
_stores: dict[tuple, ObjectStore] = {}
_stores_lock = threading.Lock()


def store_for(url: str, storage_options: dict[str, Any] | None = None, max_requests: int = DEFAULT_MAX_REQUESTS,
              timeout: float = DEFAULT_TIMEOUT, redirect_hosts: Sequence[str] = ()) -> ObjectStore:
    """The process's store for ``url``'s scheme and these settings (one client per process and
    setting). A ``user:password@`` in ``url`` becomes the client's credentials (S3's key and secret,
    HTTP's basic authentication): the caller keeps the URL without it (:func:`without_userinfo`)."""
    scheme = scheme_of(url)
    if scheme is None:
        raise StorageError(f"{url} is a local path, not a URL")
    require_client(scheme)   # here too, not only when a store is made: a client gone since names its extra
    _, user, password = split_userinfo(url)
    credentials = (user, password) if user is not None else None
    key = (scheme, repr(sorted((storage_options or {}).items())), max_requests, timeout, tuple(redirect_hosts),
           credentials)
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = ObjectStore(scheme, storage_options, max_requests, timeout, redirect_hosts,
                                               credentials)
        return store
