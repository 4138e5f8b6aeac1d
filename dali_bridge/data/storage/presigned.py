"""S3 ranged GETs as plain HTTP requests: each object's GET is signed once per process (a presigned
URL), then every sample's ranged GET of it is one aiohttp request carrying ``Range`` and ``If-Match``.

A ranged GET through aiobotocore (s3fs's client) validates its parameters, signs the request
(SigV4), runs the client's event hooks and parses the response on every call: about 1.6 ms of the
loader's CPU per sample, beside about 2.5 ms to decode and augment it (docs/object-storage.md).
A presigned URL signs the object once, and ``Range`` and ``If-Match`` are not part of what it
signs, so each sample's GET then costs what fsspec's HTTP client costs (about 0.4 ms). The URL is
signed by s3fs's own client — its credentials (environment, profiles, instance roles), endpoint,
region, addressing style and ``requester_pays`` — and signed again before it expires, or once when
S3 refuses it (temporary credentials renewed since), but not when S3 says the bucket is in another
region: that is the error at once (:mod:`dali_bridge.data.storage.regions`). A presigned URL holds the access key id and
a signature: it never leaves this module, and errors name the ``s3://`` URL instead.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from .answers import check_content_range, open_following
from .regions import ERROR_BODY_BYTES, answer_from_xml, bucket_url_of, wrong_region
from ...util.urls import hide_signature

EXPIRES_S = 3600        # how long a signed URL is valid
RESIGN_AFTER_S = 1800   # signed again after this long: never used close to its expiry
class PresignedGets:
    """One process's signed URLs and HTTP session for ranged GETs of S3 objects."""

    def __init__(self) -> None:
        self._signed: dict[str, tuple[str, float]] = {}   # s3:// URL → (its signed GET, when signed)
        self._http: Any = None

    async def _url(self, fs: Any, url: str) -> tuple[str, bool]:
        """The signed GET of ``url`` and whether it was signed just now."""
        known = self._signed.get(url)
        if known is not None and time.monotonic() - known[1] < RESIGN_AFTER_S:
            return known[0], False
        client = await fs.set_session()
        bucket, key, _ = fs.split_path(url)
        signed = await client.generate_presigned_url("get_object", ExpiresIn=EXPIRES_S,
                                                     Params={"Bucket": bucket, "Key": key, **fs.req_kw})
        self._signed[url] = (signed, time.monotonic())
        return signed, True

    async def _session(self, loop: Any) -> Any:
        if self._http is None:
            import fsspec

            # fsspec's HTTP file system owns the aiohttp session: made on the client's loop, closed at exit.
            self._http = fsspec.filesystem("http", skip_instance_cache=True, asynchronous=False, loop=loop)
        return await self._http.set_session()

    async def get(self, fs: Any, url: str, start: int, size: int, etag: str | None,
                  failure: Callable[[int, str, str], Exception], transient: type[Exception],
                  redirect_hosts: Sequence[str] = ()) -> bytes:
        """``size`` bytes of ``url`` from ``start`` (If-Match ``etag``); ``failure(status, url, what)``
        makes the exception for an answer other than 206, ``transient`` the one for another attempt.
        Redirects are followed within the endpoint's host and ``redirect_hosts``
        (:mod:`dali_bridge.data.storage.answers`), and the answer must hold the range asked for; an
        answer saying the bucket is in another region raises
        :class:`~dali_bridge.data.storage.regions.WrongRegion`."""
        import aiohttp
        import yarl

        signed, fresh = await self._url(fs, url)
        header = f"bytes={start}-{start + size - 1}"
        headers = {"Range": header, **({"If-Match": etag} if etag else {})}
        session = await self._session(fs.loop)
        try:
            async with await open_following(session, "GET", yarl.URL(signed, encoded=True), shown=url,
                                            headers=headers, allowed_hosts=redirect_hosts) as response:
                if response.status in (301, 400):   # a bucket in another region: before signing again
                    await self._refuse_wrong_region(fs, url, response)
                if response.status in (400, 403) and not fresh:
                    self._signed.pop(url, None)   # expired or renewed credentials: sign again, once
                    raise transient(f"GET {header}: the signed URL was refused ({response.status}): signing again")
                if response.status != 206:
                    raise failure(response.status, url, f"GET {header}")
                check_content_range(response, start, size, url)
                return await response.read()
        except aiohttp.ClientError as exc:  # connection errors: the message without the signed URL
            raise transient(f"{type(exc).__name__}: {hide_signature(str(exc).replace(signed, url))}") from None

    @staticmethod
    async def _refuse_wrong_region(fs: Any, url: str, response: Any) -> None:
        """:class:`~dali_bridge.data.storage.regions.WrongRegion` when S3's answer says the bucket is in
        another region: signing again would sign for the same one (:mod:`dali_bridge.data.storage.regions`)."""
        body = await response.content.read(ERROR_BODY_BYTES)
        client = await fs.set_session()
        refused = wrong_region(answer_from_xml(response.status, response.headers, body),
                               bucket_url_of(url), client.meta.region_name)
        if refused is not None:
            raise refused

    def inherited(self) -> Any:
        """What a forked process must keep, never close: the parent's HTTP file system."""
        return self._http
