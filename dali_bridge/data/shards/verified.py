"""Which cached files a loader has verified, shared by its processes: the loader's process and the
DataLoader workers forked from it.

The shard cache checks a shard's sha256 before its bytes are first used, and again whenever the
file's identity (device, inode and its generation, size, modification and change times) differs
from the one verified (:mod:`dali_bridge.data.shards.cache`). Kept per process, every worker would
hash every shard it reads although the loader's process (its read-ahead) or another worker has just
verified the same file: one hash per worker per shard per epoch. Here the verified identities live
in anonymous shared memory made with the cache, before the workers are forked, so one verification
serves them all.

Only the loader's own processes can write it (no file, nothing another user can reach), so the
guarantee is the one a single process gave: bytes are used only from a file whose identity is one
that some process of the loader hashed and found right. The table is bounded: a file whose entry
was overwritten by another's is hashed again, never trusted without. A spawned process (Ray, a
``spawn`` DataLoader) makes a table of its own.
"""
from __future__ import annotations

import mmap

import numpy as np

SLOTS = 8192   # files remembered at once: the shards a cache holds, with room to spare
_PROBES = 8    # slots looked at from a file's own before its entry overwrites another's
_FIELDS = 8    # per slot: the file's key, its identity's six numbers, a check of the seven


class VerifiedFiles:
    """File path → the identity whose sha256 a process of this loader found right."""

    def __init__(self, slots: int = SLOTS):
        self._memory = mmap.mmap(-1, slots * _FIELDS * 8)   # anonymous and shared: forked workers see writes
        self._table = np.frombuffer(self._memory, dtype=np.int64).reshape(slots, _FIELDS)
        self._keys: dict[str, int] = {}

    def __getstate__(self) -> dict:
        return {"slots": len(self._table)}   # a pickled copy (a spawned process) starts empty

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["slots"])

    def get(self, path: str) -> tuple[int, ...] | None:
        """The identity verified for ``path``, or None."""
        key = self._key(path)
        for slot in self._slots(key):
            if self._table[slot, 0] != key:   # asked twice per cached sample's read: the key alone first
                continue
            row = self._table[slot].tolist()
            if row[0] == key and row[-1] == _check(row[:-1]):   # a slot two writers tore apart fails the check
                return tuple(row[1:-1])
        return None

    def put(self, path: str, identity: tuple[int, ...]) -> None:
        """Record ``identity`` as verified for ``path``. Processes write without a lock: a reader of a
        slot being written, or written by two processes at once, finds the check wrong and hashes the
        file again."""
        key = self._key(path)
        slots = self._slots(key)
        free = next((s for s in slots if self._table[s, 0] in (key, 0)), slots[0])
        row = [key, *identity]
        self._table[free] = row + [_check(row)]

    def _key(self, path: str) -> int:
        key = self._keys.get(path)
        if key is None:
            # hash() of a str differs between interpreters but not between a process and its forks,
            # which are the only readers; 0 marks a free slot.
            key = self._keys[path] = (hash(path) & 0x7FFF_FFFF_FFFF_FFFF) or 1
        return key

    def _slots(self, key: int) -> list[int]:
        count = len(self._table)
        return [(key + probe) % count for probe in range(_PROBES)]


def _check(row: list[int]) -> int:
    return hash(tuple(row)) & 0x7FFF_FFFF_FFFF_FFFF
