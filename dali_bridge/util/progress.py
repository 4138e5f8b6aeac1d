"""Progress of long work (run, compare, bench, convert, verify, sample-data) on standard error.

On a terminal it is a tqdm bar with rate and time left; anywhere else (a log file, CI, a pipe) a bar
is noise or nothing at all, so a plain line is printed every few seconds instead, and one at the
end. Both say the same things: what, how far, how fast, how long is left.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

from .wording import plural_noun

__all__ = ["Progress", "progress"]

#: Seconds between two plain lines in a log: often enough to see a run is alive, rare enough to read.
LOG_INTERVAL_S = 5.0


class Progress:
    """Counts ``update(n)`` calls towards ``total``; prints plain lines (see the module)."""

    def __init__(self, *, total: int | None, unit: str, description: str, stream: TextIO,
                 interval_s: float = LOG_INTERVAL_S, clock=time.monotonic):
        self.total, self.unit, self.description, self.stream = total, unit, description, stream
        self.n = 0  # as tqdm names it, so callers treat both alike
        self._interval_s, self._clock = interval_s, clock
        self._start = self._last = clock()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self._clock()
        if now - self._last >= self._interval_s:
            self._last = now
            self._line(now)

    def set_description(self, description: str) -> None:
        """What is being done now (as tqdm's): the next line names it."""
        self.description = description

    def _line(self, now: float) -> None:
        elapsed = now - self._start
        rate = self.n / elapsed if elapsed > 0 else 0.0
        text = f"{self.description}: {self.n:,}"
        if self.total:
            text += f"/{self.total:,} {plural_noun(self.unit)} ({100 * self.n / self.total:.0f} %)"
        else:
            text += f" {plural_noun(self.unit)}"
        text += f", {rate:,.1f} {self.unit}/s, {elapsed:,.0f} s"
        if self.total and rate > 0 and self.n < self.total:
            text += f", ~{(self.total - self.n) / rate:,.0f} s left"
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.n:
            self._line(self._clock())

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Silent:
    n = 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_description(self, description: str) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def progress(*, total: int | None, unit: str, description: str, enabled: bool = True,
             stream: TextIO | None = None):
    """A tqdm bar on a terminal, plain periodic lines elsewhere, nothing when not ``enabled``.

    The object has ``update(n)`` and ``close()`` and is a context manager.
    """
    stream = stream if stream is not None else sys.stderr
    if not enabled:
        return _Silent()
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        try:
            from tqdm import tqdm
        except ImportError:  # a nicety: a bare host without tqdm gets the plain lines
            pass
        else:
            return tqdm(total=total, unit=unit, desc=description, leave=False, dynamic_ncols=True, file=stream)
    return Progress(total=total, unit=unit, description=description, stream=stream)
