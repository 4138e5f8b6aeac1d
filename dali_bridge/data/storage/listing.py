"""Many objects' sizes and versions in few requests: the store's LIST pages instead of a HEAD each.

S3's ListObjectsV2 and GCS's ``objects.list`` (the JSON API) both answer up to 1,000 objects a
request, in key order, within a prefix and from a starting key: a folder's shards and indexes
cost one request per 1,000 keys between the first and the last asked for, not one HEAD each.
HTTP has no LIST (one HEAD per object, :meth:`ObjectStore.info`).

What a listing records of an object (:class:`ObjectInfo`) is what a later ranged read compares:
S3's ETag (``If-Match``), GCS's object generation (``ifGenerationMatch``; a generation changes
exactly when the object's bytes are written again, a metadata update leaves it), HTTP's ETag.

:class:`ListingRequests` is :class:`~dali_bridge.data.storage.store.ObjectStore`'s listing half, kept here
so that each module stays readable; the store re-exports this module's records.
"""
from __future__ import annotations

import asyncio
import functools
import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Sequence

from ...util.urls import redact, split_url


@dataclass(frozen=True)
class ObjectInfo:
    """What a listing records of an object, to notice later that it changed."""
    size: int
    etag: str | None                # S3's and HTTP's ETag; GCS's object generation
    modified: float | None = None   # seconds since the epoch, when the store says


@dataclass(frozen=True)
class FetchError:
    """Why a request failed, with the URL; ``changed``: the object is not the one that was listed."""
    url: str
    reason: str
    missing: bool = False
    changed: bool = False

    def __post_init__(self) -> None:
        # The reason quotes URLs and servers' answers: shown scrubbed wherever it goes (util/urls.py).
        object.__setattr__(self, "reason", redact(self.reason))

    def __str__(self) -> str:
        return self.reason


def gcs_object_info(item: dict[str, Any]) -> ObjectInfo:
    """A GCS object resource (``objects.get``, an ``objects.list`` item) as the listing records it."""
    updated = item.get("updated")
    modified = datetime.fromisoformat(updated.replace("Z", "+00:00")).timestamp() if updated else None
    return ObjectInfo(int(item["size"]), item.get("generation"), modified)


class ListingRequests:
    """The LIST requests of :class:`~dali_bridge.data.storage.store.ObjectStore` (which provides ``scheme``,
    ``info``, ``_run``, ``_bounded``, ``_filesystem``, ``_s3_call`` and ``_gcs_json``)."""

    scheme: str

    def _listed(self, urls: Sequence[str], page_size: int) -> list[ObjectInfo | FetchError]:
        """:meth:`ObjectStore.listed` with ``page_size`` keys per LIST request."""
        lister = {"s3": self._list_s3, "gs": self._list_gcs, "gcs": self._list_gcs}.get(self.scheme)
        if lister is None or not urls:
            return self.info(urls)
        folders: dict[str, list[int]] = {}
        for number, url in enumerate(urls):
            folders.setdefault(split_url(url)[0], []).append(number)
        out: list[ObjectInfo | FetchError] = [FetchError(url, "not listed") for url in urls]

        async def one_folder(numbers: list[int]) -> None:
            found = await lister([urls[n] for n in numbers], page_size)
            for number in numbers:
                url = urls[number]
                got = found.get(url) if isinstance(found, dict) else found
                out[number] = got if got is not None else FetchError(
                    url, f"{url} does not exist (not in the store's listing of {split_url(url)[0]}/)", missing=True)
                if isinstance(got, FetchError):
                    out[number] = FetchError(url, f"{url}: {got.reason}", got.missing, got.changed)

        self._run(lambda: asyncio.gather(*(one_folder(numbers) for numbers in folders.values())))
        return out

    def _bucket_and_keys(self, urls: list[str]) -> tuple[str, list[str]]:
        fs = self._filesystem()
        return fs.split_path(urls[0])[0], sorted(fs.split_path(url)[1] for url in urls)

    async def _list_s3(self, urls: list[str], page_size: int) -> dict[str, ObjectInfo] | FetchError:
        """The objects of one folder named by ``urls`` that exist: LIST pages of the keys from the
        first URL's to the last one's (S3 lists in key order), each page retried as a request is."""
        fs = self._filesystem()
        bucket, keys = self._bucket_and_keys(urls)
        wanted = set(keys)
        # From just before the first key, within the keys' common prefix, until past the last: other
        # objects of the folder (another split, older files) cost pages only when they sort among these.
        request = {"Bucket": bucket, "Prefix": os.path.commonprefix(keys), "MaxKeys": page_size,
                   **({"StartAfter": keys[0][:-1]} if len(keys[0]) > 1 else {})}
        found: dict[str, ObjectInfo] = {}
        while True:
            # A LIST answers 404 only when the bucket is missing: the error names the bucket.
            list_page = functools.partial(self._s3_call, fs, f"s3://{bucket}", "list_objects_v2", **request)
            page = await self._bounded(list_page, urls[0], f"LIST s3://{bucket}/{request['Prefix']}")
            if isinstance(page, FetchError):
                return page
            for item in page.get("Contents", []):
                if item["Key"] in wanted:
                    modified = item.get("LastModified")
                    found[f"s3://{bucket}/{item['Key']}"] = ObjectInfo(
                        int(item["Size"]), item.get("ETag"), modified.timestamp() if modified is not None else None)
            contents = page.get("Contents", [])
            if not page.get("IsTruncated") or not contents or contents[-1]["Key"] >= keys[-1]:
                return found
            request["ContinuationToken"] = page["NextContinuationToken"]

    async def _list_gcs(self, urls: list[str], page_size: int) -> dict[str, ObjectInfo] | FetchError:
        """:meth:`_list_s3` on GCS: ``objects.list`` pages within the keys' common prefix from the
        first key (``startOffset`` is inclusive) until past the last; the live generation only."""
        bucket, keys = self._bucket_and_keys(urls)
        wanted = set(keys)
        prefix = os.path.commonprefix(keys)
        # fields: a page of 1,000 names, sizes, generations and times instead of whole object resources.
        params = {"prefix": prefix, "startOffset": keys[0], "maxResults": page_size,
                  "fields": "items(name,size,generation,updated),nextPageToken"}
        found: dict[str, ObjectInfo] = {}
        while True:
            list_page = functools.partial(self._gcs_json, f"gs://{bucket}", "LIST", "b/{}/o", bucket, **params)
            page = await self._bounded(list_page, urls[0], f"LIST gs://{bucket}/{prefix}")
            if isinstance(page, FetchError):
                return page
            items = page.get("items", [])
            for item in items:
                if item["name"] in wanted:
                    found[f"{self.scheme}://{bucket}/{item['name']}"] = gcs_object_info(item)
            if not page.get("nextPageToken") or not items or items[-1]["name"] >= keys[-1]:
                return found
            params["pageToken"] = page["nextPageToken"]
