"""The shard-aware epoch order (``loader.shuffle: shards``) and how well an order mixes classes.

The shards are shuffled, then cut into windows of ``loader.shuffle_window`` consecutive shards
of that shuffled order, and the samples of each window are shuffled together; the epoch is the
windows one after the other. It is a permutation of the samples drawn from (seed, epoch) alone,
dealt to ranks like the global shuffle, so it keeps every guarantee of the order: each sample
exactly once per epoch across ranks, resumable, the same on every backend. Each rank reads from
one window of shards at a time, which is what a bounded shard cache needs.

A window of few shards mixes classes less than a global shuffle when the shards are sorted by
class (as ``dali-bridge convert`` of an ImageFolder writes them): :func:`order_quality` measures
it — the mean number of distinct classes per batch and the mean label entropy of a batch — and
:func:`quality_report` puts windows side by side with the global shuffle
(``dali-bridge show --order``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

_STREAM = 0x5A4D  # keeps these draws apart from the global order's


@dataclass(frozen=True)
class ShardWindows:
    """What the shard-aware order needs of a listing: each sample's shard, and the window size."""
    shard_of: np.ndarray   # int [num_samples]: the shard of each sample (listing order)
    window: int            # shards whose samples are shuffled together


def windows_of(listing: Any, loader: Any) -> ShardWindows | None:
    """What :func:`shard_window_order` needs of a listing under ``loader`` (a LoaderSpec); None
    unless ``loader.shuffle`` is ``"shards"`` and the listing has shards."""
    if loader.shuffle != "shards" or listing.shards is None:
        return None
    return ShardWindows(listing.shards.shard, loader.shuffle_window)


def shard_window_order(shards: ShardWindows, seed: int, epoch: int) -> np.ndarray:
    """The epoch's sample order: shards shuffled, then samples shuffled within each window."""
    shard_of = np.asarray(shards.shard_of, dtype=np.int64)
    if not len(shard_of):
        return np.empty(0, dtype=np.int64)
    rng = np.random.default_rng([seed, epoch, _STREAM])
    num_shards = int(shard_of.max()) + 1
    by_shard = np.argsort(shard_of, kind="stable")
    starts = np.searchsorted(shard_of[by_shard], np.arange(num_shards + 1))
    shuffled = rng.permutation(num_shards)
    pieces = []
    for first in range(0, num_shards, shards.window):
        members = np.concatenate([by_shard[starts[s]:starts[s + 1]] for s in shuffled[first:first + shards.window]])
        pieces.append(members[rng.permutation(len(members))])
    return np.concatenate(pieces).astype(np.int64)


@dataclass(frozen=True)
class OrderQuality:
    """How an order mixes classes: per-batch means over an epoch's full batches."""
    distinct_classes: float   # mean number of distinct labels in a batch
    entropy_bits: float       # mean Shannon entropy of a batch's label histogram, in bits
    batches: int


def order_quality(labels: np.ndarray, order: np.ndarray, batch_size: int) -> OrderQuality:
    """:class:`OrderQuality` of the batches ``order`` cuts (full batches only)."""
    count = len(order) // batch_size
    if count == 0:
        return OrderQuality(0.0, 0.0, 0)
    batch_labels = np.asarray(labels)[np.asarray(order[:count * batch_size])].reshape(count, batch_size)
    distinct, entropy = [], []
    for row in batch_labels:
        _, counts = np.unique(row, return_counts=True)
        share = counts / batch_size
        distinct.append(len(counts))
        entropy.append(float(-(share * np.log2(share)).sum()))
    return OrderQuality(float(np.mean(distinct)), float(np.mean(entropy)), count)


def quality_report(labels: np.ndarray, shard_of: np.ndarray, batch_size: int, seed: int,
                   windows: list[int], chosen: int | None = None, *,
                   global_order: np.ndarray) -> list[dict[str, str]]:
    """Rows comparing the global shuffle with the shard-aware order at each window (epoch 0, one rank):
    ``order``, ``window``, ``classes/batch``, ``entropy (bits)`` and the share of the global
    shuffle's entropy; ``chosen`` marks the pipeline's window. ``global_order``: the global shuffle's
    epoch-0 order under ``seed`` (:func:`dali_bridge.pipeline.sampling.epoch_order`, which builds on this module)."""
    reference = order_quality(labels, global_order, batch_size)
    rows = [_row("global shuffle", "-", reference, reference)]
    num_shards = int(np.max(shard_of)) + 1 if len(shard_of) else 0
    for window in sorted(set(w for w in windows if 1 <= w <= max(num_shards, 1)) | ({chosen} if chosen else set())):
        quality = order_quality(labels, shard_window_order(ShardWindows(shard_of, window), seed, 0), batch_size)
        rows.append(_row("shards" + (" (this pipeline)" if window == chosen else ""), str(window), quality, reference))
    return rows


def _row(name: str, window: str, quality: OrderQuality, reference: OrderQuality) -> dict[str, str]:
    share = quality.entropy_bits / reference.entropy_bits if reference.entropy_bits else 1.0
    return {"order": name, "window": window, "classes": f"{quality.distinct_classes:.2f}",
            "entropy": f"{quality.entropy_bits:.3f}", "share": f"{share:.0%}"}
