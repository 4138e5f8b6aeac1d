"""The loader's state: where the job stands in an epoch, checked key by key before it is used.

A state (``Loader.state_dict()``, a small JSON-able dict) says where the *job* stands: the epoch,
how many batches every rank has taken in it (``batch``) and how many entries of the epoch's
sequence — the order with its repeats, which ranks take round-robin — are behind the job
(``position``). Ranks that stepped together have consumed exactly a prefix of that sequence, so the
dict is the same on every rank, and a loader of any world size can deal the rest of the epoch
(:func:`~dali_bridge.pipeline.sampling.rank_batches` with ``start``). The rest of the state identifies what
the position is a position in: the dataset (a fingerprint of its listing), seed, order, batch size,
last-batch policy and repeat count; a state that disagrees is refused.

Format 1 (before elastic resume) held one rank's batch and its rank: it loads at the world size
and rank it was saved with.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .sampling import EPOCH_LIMIT, entries_consumed
from ..data.sources.listing import Listing

STATE_FORMAT = 2
_POLICIES = ("partial", "drop", "pad")


@dataclass(frozen=True)
class Identity:
    """What a position is a position in: a state only continues a loader with the same identity."""
    seed: int
    num_samples: int
    dataset: str
    batch_size: int
    last_batch: str
    shuffle: bool | str
    repeated_augmentations: int
    shuffle_window: int | None   # shuffle "shards" only: the shards shuffled together


@dataclass(frozen=True)
class SavedState:
    """A checked state: the job's place in an epoch, and where it was saved."""
    epoch: int
    batch: int          # batches each rank has taken in the epoch
    position: int       # entries of the epoch's sequence behind the job (repeats included, padding not)
    world_size: int     # the world size it was saved at
    rank: int | None    # format 1 only: the one rank whose position it holds
    fields: Mapping[str, Any]


def listing_fingerprint(listing: Listing) -> str:
    """SHA-256 over every sample's location relative to the source root, its label and the class
    names: two datasets of the same size differ here, the same files found on another mount do not."""
    digest = hashlib.sha256()
    # each path relative to the root, then a NUL: fed from the listing's arrays (PathTable.feed)
    listing.paths.feed(digest, strip=listing.root.rstrip("/") + "/")
    digest.update(np.asarray(listing.labels, dtype="<i8").tobytes())
    digest.update("\0".join(listing.classes).encode("utf-8", "surrogateescape"))
    return digest.hexdigest()


def _integer(low: int, high: int | None = None) -> tuple[Callable[[Any], bool], str]:
    text = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high})"
    return (lambda v: type(v) is int and v >= low and (high is None or v < high)), text


def _is_fingerprint(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


# key → (check, what is expected), per format
_COMMON: dict[str, tuple[Callable[[Any], bool], str]] = {
    "format": ((lambda v: type(v) is int), "an integer"),
    "epoch": _integer(0, EPOCH_LIMIT),
    "batch": _integer(0),
    "seed": ((lambda v: type(v) is int), "an integer"),
    "num_samples": _integer(0),
    "batch_size": _integer(1),
    "world_size": _integer(1),
    "last_batch": ((lambda v: v in _POLICIES), "one of " + ", ".join(_POLICIES)),
    "shuffle": ((lambda v: type(v) is bool or v == "shards"), "true, false or 'shards'"),
    "repeated_augmentations": _integer(1),
    "shuffle_window": ((lambda v: v is None or (type(v) is int and v >= 1)), "null or an integer >= 1"),
}
_KEYS = {
    STATE_FORMAT: {**_COMMON, "position": _integer(0), "dataset": (_is_fingerprint, "a 64-digit hex SHA-256")},
    1: {**_COMMON, "rank": _integer(0), "skipped": _integer(0)},
}
# keys a state saved before they existed lacks, with the value they had then
_OPTIONAL = {STATE_FORMAT: {"shuffle_window": None},
             1: {"repeated_augmentations": 1, "skipped": 0, "shuffle_window": None}}


def read_state(state: Any, *, where: str = "loader state") -> SavedState:
    """``state`` checked key by key: a ValueError (TypeError for a non-mapping) naming the key, what
    was expected and what was found."""
    if not isinstance(state, Mapping):
        raise TypeError(f"{where} must be a mapping (what loader.state_dict() returns), found "
                        f"{type(state).__name__}")
    version = state.get("format")
    if type(version) is not int or version not in _KEYS:
        raise ValueError(f"unknown loader state format {version!r} in {where} (expected {STATE_FORMAT}, or 1 "
                         f"from an earlier dali-bridge): pass what loader.state_dict() returned")
    keys = _KEYS[version]
    state = {**_OPTIONAL.get(version, {}), **state}
    unknown = sorted(str(key) for key in state if key not in keys)
    if unknown:
        raise ValueError(f"{where} has unknown key(s) {', '.join(map(repr, unknown))} (a format {version} state "
                         f"holds {', '.join(keys)})")
    for key, (check, expected) in keys.items():
        if key not in state:
            raise ValueError(f"{where} has no {key!r} (a format {version} state holds {', '.join(keys)}): "
                             f"pass what loader.state_dict() returned")
        if not check(state[key]):
            raise ValueError(f"{where}: {key} must be {expected}, found {state[key]!r}")
    if version == 1:
        if state["rank"] >= state["world_size"]:
            raise ValueError(f"{where}: rank {state['rank']} is outside world_size {state['world_size']}")
        return SavedState(state["epoch"], state["batch"], _prefix(state), state["world_size"], state["rank"], state)
    if state["batch"] > state["position"] or (state["batch"] == 0) != (state["position"] == 0):
        raise ValueError(f"{where}: batch {state['batch']} and position {state['position']} do not go together "
                         f"(every batch moves the position on; both are 0 at the start of an epoch)")
    return SavedState(state["epoch"], state["batch"], state["position"], state["world_size"], None, state)


def merge_states(states: Sequence[Any]) -> SavedState:
    """One state from the states every rank saved: they must agree on where the job stands.

    Ranks that did not step together (different batches) consumed no prefix of the epoch that one
    position could name, so they are refused with what to save instead.
    """
    if not states:
        raise ValueError("no loader state to load: the sequence of states is empty")
    read = [read_state(state, where=f"loader state [{number}]") for number, state in enumerate(states)]
    first = read[0]
    for number, other in enumerate(read[1:], 1):
        if other.rank is None and first.rank is None:
            differs = (other.epoch, other.batch, other.position) != (first.epoch, first.batch, first.position)
        else:  # format 1 (per rank): the same step is all they can share
            differs = (other.epoch, other.batch) != (first.epoch, first.batch)
        if differs or {k: v for k, v in other.fields.items() if k not in ("rank", "skipped")} != \
                {k: v for k, v in first.fields.items() if k not in ("rank", "skipped")}:
            raise ValueError(f"the ranks' loader states differ: [0] is at {describe(first)}, [{number}] at "
                             f"{describe(other)}; ranks that did not take the same number of batches have not "
                             f"consumed one prefix of the epoch, so no position continues them exactly. Save "
                             f"the state after a step every rank takes (with loader.last_batch: pad or drop "
                             f"every rank has the same len()); the state is then the same on every rank and "
                             f"rank 0's is enough")
    if first.rank is not None and {state.rank for state in read} == set(range(first.world_size)):
        # format 1 from every rank at the same batch: together they are a job's position
        return SavedState(first.epoch, first.batch, first.position, first.world_size, None, first.fields)
    return first


def _prefix(state: Mapping[str, Any]) -> int:
    """A format 1 state's position, were its ranks stepping together."""
    return entries_consumed(state["batch"], remaining=state["num_samples"] * state["repeated_augmentations"],
                            batch_size=state["batch_size"], world_size=state["world_size"])


def describe(state: SavedState) -> str:
    where = f"epoch {state.epoch} batch {state.batch}"
    if state.rank is None:
        return f"{where} (position {state.position}, saved at world size {state.world_size})"
    return f"{where} (rank {state.rank} of world size {state.world_size})"


def check_identity(state: SavedState, mine: Identity) -> None:
    """Refuse a state saved by a loader of another dataset, seed, order, batch size or policy."""
    fields = state.fields
    for key, here in vars(mine).items():
        if key == "dataset" and key not in fields:
            continue  # format 1: the sample count is all it has
        if fields[key] != here:
            if key == "dataset":
                raise ValueError(f"loader state does not match this loader: it was saved on another dataset "
                                 f"(listing fingerprint {fields[key][:12]}… in the state, {here[:12]}… here; "
                                 f"{mine.num_samples} samples in both): same files, labels and classes are needed")
            raise ValueError(f"loader state does not match this loader: {key} is {fields[key]!r} in the state "
                             f"and {here!r} here")
