"""Sample order and per-sample random parameters: pure functions of their inputs.

* The order of an epoch is a permutation drawn from (seed, epoch) alone, split across ranks;
  with repeated augmentation each sample of it comes ``r`` times in a row before the deal.
* Every random parameter (crop window, flip) is drawn from (seed, epoch, sample index, op
  position, and the repeat number when a sample comes several times) with a counter-based hash,
  so it does not depend on worker count, batch position, rank, backend or restarts; each op
  turns its uniforms into concrete parameters given the image size, as torchvision does
  (``Op.sample`` in :mod:`dali_bridge.ops`).

That is what makes backends comparable pixel by pixel and runs resumable exactly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..ops.base import Step
from .plan import Plan
from ..data.shards.order import ShardWindows, shard_window_order
from ..ops.facets import Sizing, SpecRules, facet


# --------------------------------------------------------------------------------------------
# Order

def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool | str = True,
                shards: ShardWindows | None = None) -> np.ndarray:
    """The global sample order of an epoch: a permutation of ``range(num_samples)`` from (seed, epoch).

    ``shuffle="shards"``: the shard-aware order of :mod:`dali_bridge.data.shards.order` (``shards`` says
    each sample's shard and the window)."""
    if shuffle == "shards":
        if shards is None or len(shards.shard_of) != num_samples:
            raise ValueError("shuffle 'shards' needs each sample's shard (a webdataset listing)")
        return shard_window_order(shards, seed, epoch)
    if not shuffle:
        return np.arange(num_samples, dtype=np.int64)
    return np.random.default_rng([seed, epoch, 0x0D3A]).permutation(num_samples).astype(np.int64)


@dataclass(frozen=True)
class BatchTask:
    """One batch to produce: the sample indices, which of them are padding, and where it sits."""
    epoch: int
    number: int             # position of the batch in this rank's epoch
    indices: np.ndarray     # int64 [N], positions in the source listing
    valid: np.ndarray       # bool [N], False for samples repeated to pad the batch
    repeats: np.ndarray | None = None  # int64 [N], which repeat of its sample each row is (0 .. r-1); None: all 0

    def __post_init__(self) -> None:
        if self.repeats is None:
            object.__setattr__(self, "repeats", np.zeros(len(self.indices), dtype=np.int64))


def rank_batches(num_samples: int, batch_size: int, seed: int, epoch: int, rank: int = 0, world_size: int = 1,
                 last_batch: str = "partial", shuffle: bool | str = True, repeats: int = 1, *,
                 shards: ShardWindows | None = None, start: int = 0, first_number: int = 0) -> list[BatchTask]:
    """The batches rank ``rank`` of ``world_size`` yields in ``epoch``.

    With ``repeats`` r > 1 (repeated augmentation) each sample of the epoch order comes r times in
    a row, repeat numbers 0 .. r-1, as torchvision's ``RASampler`` lays them out; the epoch then
    holds ``num_samples * r`` entries (``RASampler`` instead cuts each rank's share to about
    ``num_samples / world_size``, dropping most samples from each epoch). That sequence is dealt
    to ranks round-robin (entry ``k`` goes to rank ``k % world_size``, so the repeats of a sample
    land on different ranks when ``r <= world_size``), then cut into batches:

    * ``partial``: every entry of the rank's share exactly once; the last batch may be smaller,
      never empty. Over all ranks, every sample exactly once per repeat.
    * ``drop``: full batches only; every rank yields ``(num_samples * r // world_size) // batch_size``.
    * ``pad``: full batches; every rank yields ``ceil(ceil(num_samples * r / world_size) / batch_size)``
      batches, the shortfall filled by repeating entries from the start of the sequence, marked
      ``valid=False``.

    ``start`` (elastic resume): the first ``start`` entries of the sequence were consumed already,
    by ranks of any world size; the rest are dealt from there (entry ``start + m`` to rank
    ``m % world_size``) and the policy applies to them as to a whole epoch; batch numbers count
    from ``first_number``. Resuming at the world size that consumed the prefix gives exactly the
    batches an uninterrupted epoch has after it.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, found {repeats}")
    entries = num_samples * repeats
    if not 0 <= start <= entries:
        raise ValueError(f"start {start} is outside the epoch's {entries} entries")
    order = np.repeat(epoch_order(num_samples, seed, epoch, shuffle, shards), repeats)
    repeat_of = np.tile(np.arange(repeats, dtype=np.int64), num_samples)
    remaining = entries - start
    share, share_repeats = order[start + rank::world_size], repeat_of[start + rank::world_size]
    valid = np.ones(len(share), dtype=bool)
    if last_batch == "drop":
        count = (remaining // world_size) // batch_size * batch_size
        share, share_repeats, valid = share[:count], share_repeats[:count], valid[:count]
    elif last_batch == "pad":
        per_rank = math.ceil(remaining / world_size) if remaining else 0
        count = math.ceil(per_rank / batch_size) * batch_size
        missing = count - len(share)
        if missing > 0:
            # repeats the sequence from its start as often as needed
            share = np.concatenate([share, np.resize(order, missing)])
            share_repeats = np.concatenate([share_repeats, np.resize(repeat_of, missing)])
            valid = np.concatenate([valid, np.zeros(missing, dtype=bool)])
    elif last_batch != "partial":
        raise ValueError(f"unknown last_batch policy {last_batch!r}")
    return [BatchTask(epoch, first_number + n, share[begin:begin + batch_size], valid[begin:begin + batch_size],
                      share_repeats[begin:begin + batch_size])
            for n, begin in enumerate(range(0, len(share), batch_size))]


def batch_count(num_samples: int, batch_size: int, world_size: int, rank: int, last_batch: str,
                repeats: int = 1, *, start: int = 0) -> int:
    """``len(rank_batches(...))`` without building the order."""
    entries = num_samples * repeats - start
    if last_batch == "drop":
        return (entries // world_size) // batch_size
    if last_batch == "pad":
        return math.ceil((math.ceil(entries / world_size) if entries else 0) / batch_size)
    share = len(range(rank, entries, world_size))
    return math.ceil(share / batch_size)


def entries_consumed(batches: int, *, remaining: int, batch_size: int, world_size: int) -> int:
    """Entries of the sequence behind a job whose ranks each took ``batches`` batches of a deal over
    ``remaining`` entries: round-robin dealing makes them a prefix, ``world_size`` × ``batch_size``
    per step (fewer at the end, where only ``remaining`` are left). Padding counts for nothing."""
    return min(remaining, batches * batch_size * world_size)


# Draws key on the low 32 bits of the epoch (:func:`uniforms`): a larger epoch would repeat an earlier one's.
EPOCH_LIMIT = 1 << 32


def check_epoch(epoch: object, *, what: str = "epoch") -> int:
    """``epoch`` as an int in [0, 2^32), or a ValueError/TypeError naming ``what`` (bool is not an int)."""
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)):
        raise TypeError(f"{what} must be an integer, found {type(epoch).__name__} {epoch!r}")
    if not 0 <= epoch < EPOCH_LIMIT:
        raise ValueError(f"{what} must be in [0, 2^32) (random draws key on its low 32 bits, so a larger one "
                         f"would repeat an earlier epoch's augmentations), found {epoch}")
    return int(epoch)


# --------------------------------------------------------------------------------------------
# Random numbers: a counter-based hash (splitmix64) of (seed, epoch, index, op, draw, repeat)

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)
_REPEAT = np.uint64(0xA0761D6478BD642F)  # the repeat number's multiplier in the key (odd, unrelated to the others)
_VIEW = np.uint64(0xE7037ED1A0B428DB)    # the view number's (likewise)


def _mix(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def uniforms(seed: int, epoch: int, indices: np.ndarray, stream: int, count: int,
             repeats: np.ndarray | None = None, view: int | None = None) -> np.ndarray:
    """``[len(indices), count]`` floats uniform in [0, 1), a pure function of every argument.

    ``repeats`` (int [len(indices)], default all 0): which repeat of its sample each row is. Repeat
    0 adds nothing to the key, so its draws are those of a pipeline without repeated augmentation.
    ``view``: the view's number across a pipeline's views groups (0, 1, ...), adding ``view + 1`` to
    the key; None (a pipeline without views, or its shared ops) adds nothing.
    """
    with np.errstate(over="ignore"):
        base = (np.uint64(seed & 0xFFFFFFFF) * np.uint64(0x9E3779B97F4A7C15)
                + np.uint64(epoch & 0xFFFFFFFF) * np.uint64(0xD1B54A32D192ED03)
                + np.uint64(stream & 0xFFFF) * np.uint64(0x8CB92BA72F3D8DD7))
        if repeats is not None:
            base = base + np.asarray(repeats, dtype=np.uint64)[:, None] * _REPEAT
        if view is not None:
            base = base + np.uint64(view + 1) * _VIEW
        key = _mix(base)
        idx = np.asarray(indices, dtype=np.uint64)[:, None]
        counter = np.arange(count, dtype=np.uint64)[None, :]
        bits = _mix(key + _mix(idx * np.uint64(0x9E3779B97F4A7C15) + counter + np.uint64(1)))
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def draw_count(step: Step) -> int:
    """How many uniforms a step consumes per sample (its op's ``draw_count``, ``draws`` by default)."""
    return facet(step.op, SpecRules).draw_count(step.params)


def draws(plan: Plan, seed: int, epoch: int, indices: np.ndarray,
          repeats: np.ndarray | None = None) -> dict[int, np.ndarray]:
    """The uniforms of every random step for these samples: ``{position in plan.ops: [N, k]}``.

    Stream ``position + 1``: the ops before a step decide nothing about its draws. ``repeats``:
    each row's repeat number (a :class:`BatchTask`'s ``repeats``), so every repeat of a sample is
    augmented differently; repeat 0 draws what a pipeline without repetition draws. A view's plan
    (:attr:`Plan.view`) keys its own steps' draws on its view number, and its shared steps' on none,
    so every view draws its own parameters and the shared ops draw once per sample.
    """
    return {pos: uniforms(seed, epoch, indices, pos + 1, draw_count(step), repeats,
                          view=None if pos < plan.shared_steps else plan.view)
            for pos, step in enumerate(plan.ops) if draw_count(step)}


# --------------------------------------------------------------------------------------------
# Per-sample parameters: what each step does to one image of a given size

def sample_steps(plan: Plan, height: int, width: int,
                 sample_draws: dict[int, np.ndarray]) -> list[tuple[tuple, tuple[int, int]]]:
    """Each step's concrete parameters for one image of (height, width) pixels, with the size the
    step receives: ``[(op.sample(...), (height, width)), ...]``, one entry per step of the plan.

    ``sample_draws`` maps step positions to this sample's uniforms (a row of :func:`draws`).
    Every sample of a plan gets entries of the same shape, which lets the DALI backend compile one
    graph with per-sample arguments. Raises :class:`~dali_bridge.errors.ImageError` when no
    parameters fit the image (too thin for a ``max_size`` resize).
    """
    found = []
    for pos, step in enumerate(plan.steps):
        op = step.op
        concrete = op.sample(step.params, sample_draws.get(pos), height, width)
        found.append((concrete, (height, width)))
        height, width = facet(op, Sizing).output_size(concrete, height, width)
    return found


def sample_geometry(plan: Plan, height: int, width: int, sample_draws: dict[int, np.ndarray]) -> list:
    """The concrete operations of every step for one image, in order (:func:`sample_steps` flattened:
    a random resized crop gives a Crop and a Resize)."""
    return [item for concrete, _ in sample_steps(plan, height, width, sample_draws) for item in concrete]


def dealt_ahead(tasks: Sequence[BatchTask], position: int, *, stride: int, depth: int) -> tuple[np.ndarray, ...]:
    """The sample indices of the ``depth`` batches a reader of ``tasks[position]`` takes next, when
    batches are dealt round-robin to ``stride`` readers (one: it takes them all)."""
    following = range(position + stride, min(len(tasks), position + stride * depth + 1), stride)
    return tuple(tasks[n].indices for n in following)

