"""Iterate a loader for one epoch and measure it: the core of ``dali-bridge run`` and ``bench``."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..loader.loader import Loader


@dataclass(frozen=True)
class EpochStats:
    """One epoch of a loader: counts, speed (images/s, excluding the first batch's start-up) and what it yields."""
    pipeline: str
    backend: str
    batches: int
    images: int
    seconds: float
    first_batch_seconds: float
    images_per_second: float
    shape: tuple[int, ...]
    dtype: str
    device: str
    skipped: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_epoch(loader: Loader, *, max_batches: int | None = None, progress: bool = False,
                  description: str | None = None) -> EpochStats:
    """Run one epoch (or ``max_batches``) and time it.

    ``images_per_second`` counts the images after the first batch over the time after it, so
    start-up (workers, pipeline build) shows in ``first_batch_seconds`` instead.
    """
    total = len(loader) if max_batches is None else min(len(loader), max_batches)
    from ..util.progress import progress as progress_bar

    bar = progress_bar(total=total, unit="batch", description=description or f"{loader.spec.name} [{loader.backend}]",
                       enabled=progress)
    skipped_before = len(loader.skipped)
    # the images' output (with views, the first view's batch stands for the shape)
    outputs = loader.spec.outputs
    image_position = next((outputs.index(name) for name in ("image", "views") if name in outputs), None)
    start = time.perf_counter()
    first = None
    batches = images = images_after_first = 0
    shape: tuple[int, ...] = ()
    dtype = device = ""
    iterator = iter(loader)
    try:
        for batch in iterator:
            count = len(batch[0][0] if isinstance(batch[0], list) else batch[0])  # samples: a list holds views
            if image_position is not None and not shape:
                image = batch[image_position]
                image = image[0] if isinstance(image, list) else image
                shape, dtype, device = tuple(image.shape), str(image.dtype).replace("torch.", ""), str(image.device)
            batches += 1
            images += count
            if first is None:
                _sync(loader.device)
                first = time.perf_counter()
            else:
                images_after_first += count
            bar.update(1)
            if max_batches is not None and batches >= max_batches:
                break
    finally:
        close = getattr(iterator, "close", None)
        if close:
            close()
        bar.close()
    _sync(loader.device)
    end = time.perf_counter()
    first = first or end
    steady = end - first
    if steady > 0 and images_after_first:
        rate = images_after_first / steady
    else:
        rate = images / (end - start) if end > start else 0.0
    return EpochStats(loader.spec.name, loader.backend, batches, images, end - start, first - start, rate,
                      shape, dtype, device, len(loader.skipped) - skipped_before)


def format_table(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    """A plain-text table: ``columns`` is [(key, header)]; numbers right-aligned."""
    cells = [[header for _, header in columns]]
    for row in rows:
        line = []
        for key, _ in columns:
            value = row.get(key, "")
            if isinstance(value, float):
                value = f"{value:,.1f}" if abs(value) >= 10 else f"{value:.3g}"
            elif isinstance(value, (tuple, list)):
                value = "x".join(str(v) for v in value)
            line.append(str(value))
        cells.append(line)
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    numeric = [all(_looks_numeric(r[i]) for r in cells[1:]) and len(cells) > 1 for i in range(len(columns))]
    out = []
    for n, row in enumerate(cells):
        cells = (c.rjust(w) if numeric[i] and n else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def _looks_numeric(text: str) -> bool:
    return text.replace(",", "").replace(".", "", 1).replace("-", "", 1).isdigit()
