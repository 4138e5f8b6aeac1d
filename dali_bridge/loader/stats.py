"""Is the GPU starving? Measured in the user's own loop, from the loader's side of each step.

The loader's iteration is a generator, so the time between the consumer's ``next()`` and the
batch handed back is time the consumer *waited* for data, and the time between a batch handed
over and the next ``next()`` is time the consumer *held* it (its step: forward, backward,
optimiser). Two clock reads per batch, no thread, no synchronisation: the cost is a few
microseconds a batch. The times are the host's: a step that queues CUDA work and returns
without reading anything back leaves the GPU busy while the loop waits for the next batch, and
that wait counts as data wait (nothing here synchronises the device, which would change the
training's own overlap); a step that synchronises (``loss.item()``) is timed whole.

The first batch of each iteration waits for workers to start and the pipeline to fill; that
wait is reported on its own (``startup_s``) and left out of the fraction, which is about the
steady state.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any
from ..util.messages import package_log

log = package_log()

# Above this share of each step spent waiting for data, the loader is what limits training.
DATA_BOUND_FRACTION = 0.10


@dataclass
class _Tally:
    """Sums over some batches: what the consumer waited and held, and the images it got."""
    batches: int = 0
    images: int = 0
    wait_s: float = 0.0
    busy_s: float = 0.0
    startup_s: float = 0.0   # the first batch's wait of each iteration (part of wait_s)
    steady_images: int = 0   # images of the batches after each iteration's first

    def figures(self, *, backend: str, workers: int | None) -> dict[str, Any]:
        steady_wait = self.wait_s - self.startup_s
        steady = steady_wait + self.busy_s
        fraction = steady_wait / steady if steady > 0 else None
        # the rate batches arrived at: the loader's own rate when data-bound, the steps' when not
        loader_rate = self.steady_images / steady if steady > 0 else None
        # the rate the steps alone would consume images at, with data always ready
        consumer_rate = self.steady_images / self.busy_s if self.busy_s > 0 else None
        return {"batches": self.batches, "images": self.images, "wait_s": self.wait_s, "busy_s": self.busy_s,
                "startup_s": self.startup_s, "data_wait_fraction": fraction,
                "loader_images_per_s": loader_rate, "consumer_images_per_s": consumer_rate,
                "verdict": verdict(fraction, loader_rate=loader_rate, consumer_rate=consumer_rate,
                                   backend=backend, workers=workers)}


def verdict(fraction: float | None, *, loader_rate: float | None, consumer_rate: float | None,
            backend: str, workers: int | None) -> str:
    """One line a user reads: data-bound (and what to try) or compute-bound, with the figures."""
    if fraction is None:
        return "not measured yet: the verdict needs two batches of one iteration (the first only starts the loader)"
    percent = f"{round(fraction * 100):d} %"
    if fraction < DATA_BOUND_FRACTION:
        return f"compute-bound: {percent} waiting"
    rates = f"loader {loader_rate:,.0f} img/s" if loader_rate else "loader rate unknown"
    if consumer_rate:
        rates += f", your steps consume {consumer_rate:,.0f} img/s"
    more = f"more workers (loader.workers, now {workers})" if workers else "more workers (loader.workers)"
    hint = (f"try `backend: dali` (see `dali-bridge doctor`) or {more}" if backend != "dali"
            else f"try {more}, a larger loader.prefetch, or decode.device: mixed")
    return f"data-bound: {percent} of each step waited for data ({rates}); {hint}"


class StepClock:
    """Times each batch from the loader's side: :meth:`asked` when the consumer asks for one,
    :meth:`handed` when it is handed over, :meth:`returned` when the consumer asks again.

    Keeps the totals since the loader was built and those of the iteration in progress, whose
    verdict is logged (when ``report``) as its last batch is handed over — a consumer that knows
    the epoch's length, as Lightning does, never asks past it — or when it ends without one (its
    last batches all skipped).
    """

    def __init__(self, *, backend: str, workers: int | None, report: bool, clock=time.perf_counter):
        self.backend = backend
        self.workers = workers
        self.report = report
        self._clock = clock
        self._total = _Tally()
        self._epoch = _Tally()
        self._mark = 0.0
        self._first = True
        self._name, self._epoch_number, self._reported = "", 0, False

    def asked(self, *, name: str, epoch: int) -> None:
        """Iteration ``epoch`` of pipeline ``name`` starts: the consumer asked for its first batch."""
        self._epoch, self._first, self._mark = _Tally(), True, self._clock()
        self._name, self._epoch_number, self._reported = name, epoch, False

    def handed(self, images: int, *, last: bool = False) -> None:
        now = self._clock()
        waited = now - self._mark
        for tally in (self._total, self._epoch):
            tally.batches += 1
            tally.images += images
            tally.wait_s += waited
            if self._first:
                tally.startup_s += waited
            else:
                tally.steady_images += images
        self._first, self._mark = False, now
        if last:
            self.ended()

    def returned(self) -> None:
        """The consumer is back for the next batch: it held the last one until now."""
        now = self._clock()
        for tally in (self._total, self._epoch):
            tally.busy_s += now - self._mark
        self._mark = now

    def figures(self) -> dict[str, Any]:
        """The totals since the loader was built (see :meth:`dali_bridge.loader.loader.Loader.stats`)."""
        return self._total.figures(backend=self.backend, workers=self.workers)

    def epoch_figures(self) -> dict[str, Any]:
        """The figures of the iteration in progress, or of the last one."""
        return self._epoch.figures(backend=self.backend, workers=self.workers)

    def ended(self) -> None:
        """The iteration's data ran out: log its verdict (once) when the pipeline asked for it."""
        if not self.report or self._reported:
            return
        self._reported = True
        figures = self.epoch_figures()
        bound = figures["data_wait_fraction"] is not None and figures["data_wait_fraction"] >= DATA_BOUND_FRACTION
        # data-bound is worth a warning (seen without any logging set up); compute-bound is news
        log.log(logging.WARNING if bound else logging.INFO,
                "dali-bridge %s: epoch %d: %s (%d batches; waited %.1f s, steps %.1f s, startup %.1f s)",
                self._name, self._epoch_number, figures["verdict"], figures["batches"],
                figures["wait_s"] - figures["startup_s"], figures["busy_s"], figures["startup_s"])
