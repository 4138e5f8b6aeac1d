"""A read-only, seekable file object on an object at a URL whose every read is one ranged GET through
the store (:meth:`~dali_bridge.data.storage.store.ObjectStore.fetch`): retried with backoff within
``source.timeout``, exactly the bytes asked for, and carrying the ETag (or GCS generation) the
object had when it was listed, so an object replaced since then fails the read instead of giving
other bytes. No read-ahead: Parquet readers ask for exactly the column chunks they need."""
from __future__ import annotations

import io

from ..storage.listing import FetchError, ObjectInfo
from ..storage.store import ObjectStore, Range
from ...util.urls import StorageError


class RangedFile(io.RawIOBase):
    """``url``'s bytes as listed (``info``: its size and ETag), read by ranged GETs through ``store``."""

    def __init__(self, store: ObjectStore, url: str, info: ObjectInfo):
        super().__init__()
        self.store, self.url, self.info = store, url, info
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        origin = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.info.size}[whence]
        if origin + offset < 0:
            raise ValueError(f"seek to {origin + offset}, before the start of {self.url}")
        self._position = origin + offset
        return self._position

    def readinto(self, buffer) -> int:
        wanted = min(len(buffer), self.info.size - self._position)
        if wanted <= 0:
            return 0
        answer = self.store.fetch([Range(self.url, self._position, wanted, self.info.etag)])[0]
        if isinstance(answer, FetchError):
            raise StorageError(answer.reason)
        memoryview(buffer)[:wanted] = answer
        self._position += wanted
        return wanted
