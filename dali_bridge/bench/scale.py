"""What a source's index costs as the dataset grows: the bytes a listing holds (walked object by
object, so a per-sample Python object anywhere in it is counted), a process's memory from
``/proc/<pid>/smaps_rollup``, and what a forked DataLoader worker copies of the index when it
looks every sample up (``benchmarks/dataset_scale.py`` and the tests that pin the bounds).

Why the workers: a DataLoader worker is a fork of the process that holds the listing, so it starts
sharing every page of it. Looking up a Python object writes its reference count, and the page it
sits on is then copied into the worker (and the cyclic garbage collector writes into every
container it tracks): an index made of millions of Python objects ends up copied once per worker
over an epoch. An index made of a few arrays is read, never written, and stays shared.
"""
from __future__ import annotations

import gc
import os
import sys
import types
from pathlib import Path
from typing import Any, Iterator

import numpy as np

# Fields of /proc/<pid>/smaps_rollup kept, in kB there and in bytes here.
_ROLLUP = {"Rss": "rss", "Pss": "pss", "Shared_Clean": "shared_clean", "Shared_Dirty": "shared_dirty",
           "Private_Clean": "private_clean", "Private_Dirty": "private_dirty"}

# Objects a deep size does not descend into: code and the interpreter's own machinery, shared by everything.
_OPAQUE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
           types.CodeType, types.FrameType)


def memory_rollup(pid: int | str = "self") -> dict[str, int]:
    """A process's memory in bytes (Linux): ``rss``, ``pss`` (shared pages split between the
    processes sharing them), ``uss`` (its private pages: what it alone holds) and the rollup's
    shared and private, clean and dirty parts."""
    values = {name: 0 for name in _ROLLUP.values()}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in _ROLLUP:
            values[_ROLLUP[key]] = int(rest.split()[0]) * 1024
    values["uss"] = values["private_clean"] + values["private_dirty"]
    return values


def deep_bytes(root: Any) -> int:
    """The bytes of ``root`` and of every object it reaches (each counted once): containers, their
    items, instance attributes, numpy arrays' buffers. Classes, modules, functions and code are
    not followed (they are the program's, not the data's)."""
    seen: set[int] = set()
    total = 0
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _OPAQUE):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)   # an array that owns its buffer counts it here; a view counts its base below
        stack.extend(_referents(obj))
    return total


def _referents(obj: Any) -> Iterator[Any]:
    if isinstance(obj, np.ndarray):
        if obj.base is not None:
            yield obj.base
        return
    if isinstance(obj, (str, bytes, bytearray, int, float, complex, bool, memoryview)) or obj is None:
        return
    if isinstance(obj, dict):
        yield from obj.keys()
        yield from obj.values()
        return
    if isinstance(obj, (list, tuple, set, frozenset)):
        yield from obj
        return
    attributes = getattr(obj, "__dict__", None)
    if attributes is not None:
        yield attributes
    for cls in type(obj).__mro__:
        for slot in getattr(cls, "__slots__", ()):
            if hasattr(obj, slot):
                yield getattr(obj, slot)


def index_bytes(listing: Any) -> dict[str, int]:
    """The bytes of a listing's per-sample index, part by part: the sample names (``paths``), the
    labels and where shard samples are (``shards``), and their total."""
    parts = {"paths": deep_bytes(listing.paths), "labels": deep_bytes(listing.labels),
             "shards": deep_bytes(listing.shards) if listing.shards is not None else 0}
    parts["total"] = sum(parts.values())
    return parts


def look_up_every_sample(listing: Any) -> dict[str, Any]:
    """Look every sample's name and label up, as an epoch's reads and messages do, then let the
    garbage collector run as it would in a long-lived worker; this process's memory before and
    after (run it in a forked worker: what grows is what the worker copied of the index)."""
    gc.collect()
    before = memory_rollup()
    paths, labels = listing.paths, listing.labels
    for index in range(len(listing)):
        paths[index]
        labels[index]
    gc.collect()
    after = memory_rollup()
    return {"pid": os.getpid(), "before": before, "after": after,
            "private_growth": after["uss"] - before["uss"]}


class _EveryWorkerLooksUp:
    """A dataset of one item per worker: item ``k`` looks every sample of the listing up in the
    worker that takes it (DataLoader deals items round-robin, so each worker takes one)."""

    def __init__(self, listing: Any, workers: int):
        self.listing, self.workers = listing, workers

    def __len__(self) -> int:
        return self.workers

    def __getitem__(self, item: int) -> dict[str, Any]:
        return look_up_every_sample(self.listing)


def index_copied_by_workers(listing: Any, workers: int = 2) -> list[dict[str, Any]]:
    """Fork ``workers`` DataLoader workers from this process (which holds ``listing``) and have
    each look every sample up (:func:`look_up_every_sample`): per worker, its memory before and
    after and ``private_growth``, the bytes of the index it copied."""
    from torch.utils.data import DataLoader

    loader = DataLoader(_EveryWorkerLooksUp(listing, workers), batch_size=None, num_workers=workers,
                        multiprocessing_context="fork", collate_fn=lambda item: item)
    return list(loader)
