"""Sample order and per-sample random parameters: pure functions of their inputs.

* The order of an epoch is a permutation drawn from (seed, epoch) alone, split across ranks.
* Every random parameter (crop window, flip) is drawn from (seed, epoch, sample index, op
  position) with a counter-based hash, so it does not depend on worker count, batch position,
  rank, backend or restarts; the crop window also depends on the image size, as in torchvision.

That is what makes backends comparable pixel by pixel and runs resumable exactly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .images import ImageError
from .plan import Plan, Step

RRC_ATTEMPTS = 10  # torchvision's RandomResizedCrop tries 10 windows, then falls back to the centre


# --------------------------------------------------------------------------------------------
# Order

def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The global sample order of an epoch: a permutation of ``range(num_samples)`` from (seed, epoch)."""
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


def rank_batches(num_samples: int, batch_size: int, seed: int, epoch: int, rank: int = 0, world_size: int = 1,
                 last_batch: str = "partial", shuffle: bool = True) -> list[BatchTask]:
    """The batches rank ``rank`` of ``world_size`` yields in ``epoch``.

    The epoch order is dealt to ranks round-robin (sample ``k`` of the order goes to rank
    ``k % world_size``), then cut into batches:

    * ``partial``: every sample of the rank's share exactly once; the last batch may be smaller,
      never empty. Over all ranks, every sample exactly once.
    * ``drop``: full batches only; every rank yields ``(num_samples // world_size) // batch_size``.
    * ``pad``: full batches; every rank yields ``ceil(ceil(num_samples / world_size) / batch_size)``
      batches, the shortfall filled by repeating samples from the start of the epoch order,
      marked ``valid=False``.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    order = epoch_order(num_samples, seed, epoch, shuffle)
    share = order[rank::world_size]
    valid = np.ones(len(share), dtype=bool)
    if last_batch == "drop":
        count = (num_samples // world_size) // batch_size * batch_size
        share, valid = share[:count], valid[:count]
    elif last_batch == "pad":
        per_rank = math.ceil(num_samples / world_size) if num_samples else 0
        count = math.ceil(per_rank / batch_size) * batch_size
        missing = count - len(share)
        if missing > 0 and num_samples:
            filler = np.resize(order, missing)  # repeats the order from its start as often as needed
            share = np.concatenate([share, filler])
            valid = np.concatenate([valid, np.zeros(missing, dtype=bool)])
    elif last_batch != "partial":
        raise ValueError(f"unknown last_batch policy {last_batch!r}")
    return [BatchTask(epoch, n, share[start:start + batch_size], valid[start:start + batch_size])
            for n, start in enumerate(range(0, len(share), batch_size))]


def batch_count(num_samples: int, batch_size: int, world_size: int, rank: int, last_batch: str) -> int:
    """``len(rank_batches(...))`` without building the order."""
    if last_batch == "drop":
        return (num_samples // world_size) // batch_size
    if last_batch == "pad":
        return math.ceil((math.ceil(num_samples / world_size) if num_samples else 0) / batch_size)
    share = len(range(rank, num_samples, world_size))
    return math.ceil(share / batch_size)


# --------------------------------------------------------------------------------------------
# Random numbers: a counter-based hash (splitmix64) of (seed, epoch, index, op, draw)

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def uniforms(seed: int, epoch: int, indices: np.ndarray, stream: int, count: int) -> np.ndarray:
    """``[len(indices), count]`` floats uniform in [0, 1), a pure function of every argument."""
    with np.errstate(over="ignore"):
        key = _mix(np.uint64(seed & 0xFFFFFFFF) * np.uint64(0x9E3779B97F4A7C15)
                   + np.uint64(epoch & 0xFFFFFFFF) * np.uint64(0xD1B54A32D192ED03)
                   + np.uint64(stream & 0xFFFF) * np.uint64(0x8CB92BA72F3D8DD7))
        idx = np.asarray(indices, dtype=np.uint64)[:, None]
        counter = np.arange(count, dtype=np.uint64)[None, :]
        bits = _mix(key + _mix(idx * np.uint64(0x9E3779B97F4A7C15) + counter + np.uint64(1)))
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def draw_count(step: Step) -> int:
    """How many uniforms a random step consumes per sample."""
    if step.kind == "random_resized_crop":
        return 2 * RRC_ATTEMPTS + 2
    if step.kind == "horizontal_flip":
        return 1
    return 0


def draws(plan: Plan, seed: int, epoch: int, indices: np.ndarray) -> dict[int, np.ndarray]:
    """The uniforms of every random step for these samples: ``{step position: [N, k]}``."""
    return {pos: uniforms(seed, epoch, indices, pos + 1, draw_count(step))
            for pos, step in enumerate(plan.steps) if draw_count(step)}


# --------------------------------------------------------------------------------------------
# Geometry: what each step does to one image of a given size

@dataclass(frozen=True)
class Crop:
    """Take rows [top, top+height) and columns [left, left+width); outside the image is zero."""
    top: int
    left: int
    height: int
    width: int


@dataclass(frozen=True)
class Resize:
    """Resample to (height, width) pixels."""
    height: int
    width: int
    interpolation: str
    antialias: bool


@dataclass(frozen=True)
class Flip:
    """Mirror left-right when ``apply``."""
    apply: bool


def rrc_window(height: int, width: int, u: Sequence[float], scale: Sequence[float],
               ratio: Sequence[float]) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` driven by 22 given uniforms.

    Returns (top, left, crop height, crop width). Area uniform in ``scale``, aspect ratio
    log-uniform in ``ratio``, 10 attempts, then the centred fallback — the same algorithm.
    """
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for attempt in range(RRC_ATTEMPTS):
        target_area = area * (scale[0] + (scale[1] - scale[0]) * u[2 * attempt])
        aspect = math.exp(log_lo + (log_hi - log_lo) * u[2 * attempt + 1])
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = min(int(u[-2] * (height - h + 1)), height - h)
            left = min(int(u[-1] * (width - w + 1)), width - w)
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def shorter_side_size(height: int, width: int, size: int, max_size: int | None = None) -> tuple[int, int]:
    """torchvision's output size for ``Resize(int)``: shorter side ``size``, aspect kept (truncated).

    Raises :class:`~dali_bridge.images.ImageError` (a sample error, handled by ``on_error``) when
    ``max_size`` leaves the shorter side under one pixel: an image too thin for this resize.
    """
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    if max_size is not None and new_long > max_size:
        new_short, new_long = int(max_size * new_short / new_long), max_size
        if new_short < 1:
            raise ImageError(f"too thin to resize: shorter side {size} with max_size {max_size} would make this "
                             f"{height}x{width} image {max_size} pixels long and {max_size * short / long:.2f} wide")
    return (new_long, new_short) if width <= height else (new_short, new_long)


def center_crop_window(height: int, width: int, crop_h: int, crop_w: int) -> Crop:
    """torchvision's ``center_crop`` window, padding (negative anchors) when the crop is larger."""
    if crop_h > height or crop_w > width:
        pad_top = (crop_h - height) // 2 if crop_h > height else 0
        pad_left = (crop_w - width) // 2 if crop_w > width else 0
        padded_h = height + pad_top + ((crop_h - height + 1) // 2 if crop_h > height else 0)
        padded_w = width + pad_left + ((crop_w - width + 1) // 2 if crop_w > width else 0)
        top = int(round((padded_h - crop_h) / 2.0)) - pad_top
        left = int(round((padded_w - crop_w) / 2.0)) - pad_left
        return Crop(top, left, crop_h, crop_w)
    return Crop(int(round((height - crop_h) / 2.0)), int(round((width - crop_w) / 2.0)), crop_h, crop_w)


def sample_geometry(plan: Plan, height: int, width: int, sample_draws: dict[int, np.ndarray]) -> list:
    """The concrete Crop/Resize/Flip operations for one image of (height, width) pixels.

    ``sample_draws`` maps step positions to this sample's uniforms (a row of :func:`draws`).
    The list has the same shape for every sample of a plan (one entry per geometry step, two for
    random_resized_crop), which lets the DALI backend compile one graph with per-sample arguments.
    """
    ops: list = []
    h, w = height, width
    for pos, step in enumerate(plan.steps):
        p = step.params
        if step.kind == "random_resized_crop":
            top, left, ch, cw = rrc_window(h, w, sample_draws[pos], p["scale"], p["ratio"])
            out_h, out_w = p["size"]
            ops += [Crop(top, left, ch, cw), Resize(out_h, out_w, p["interpolation"], p["antialias"])]
            h, w = out_h, out_w
        elif step.kind == "resize":
            if p["shorter_side"]:
                h, w = shorter_side_size(h, w, p["size"][0], p["max_size"])
            else:
                h, w = p["size"]
            ops.append(Resize(h, w, p["interpolation"], p["antialias"]))
        elif step.kind == "center_crop":
            crop = center_crop_window(h, w, *p["size"])
            ops.append(crop)
            h, w = crop.height, crop.width
        elif step.kind == "horizontal_flip":
            ops.append(Flip(bool(sample_draws[pos][0] < p["probability"])))
    return ops
