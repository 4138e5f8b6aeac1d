"""The one path out for messages: every exception text, log record, warning and command output of
dali-bridge passes through :func:`~dali_bridge.util.urls.redact` on its way to a user.

- :class:`~dali_bridge.util.urls.Scrubbed`: the base of the package's error classes, whose texts
  (``str``, ``repr``, ``args``) are scrubbed when the error is made, so an error caught and printed
  by a caller's own code shows no credential either.
- :func:`package_log`: the package's logger (``dali_bridge``), carrying a filter that scrubs each
  record's message, arguments and traceback before any handler, the caller's included, sees it.
- :class:`ScrubbedStream`: a text stream over ``sys.stdout``/``sys.stderr`` that scrubs what a
  command prints, line by line: the command line runs every command with both wrapped
  (:func:`scrubbed_output`), so its output, its log lines and the warnings shown are scrubbed even
  when they come from another library.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import traceback
from typing import Any, Iterator, TextIO

from .urls import redact

PACKAGE_LOGGER = "dali_bridge"


class ScrubbingFilter(logging.Filter):
    """Scrubs a record in place: its message formatted with its arguments, and its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def package_log() -> logging.Logger:
    """The ``dali_bridge`` logger, with the scrubbing filter (added once)."""
    log = logging.getLogger(PACKAGE_LOGGER)
    if not any(isinstance(f, ScrubbingFilter) for f in log.filters):
        log.addFilter(ScrubbingFilter())
    return log


class ScrubbedStream:
    """A text stream that writes ``redact(text)`` to ``stream``: whole lines (a secret split over two
    writes is still one line), a pending part at :meth:`flush` or at a carriage return (progress
    lines). Every other attribute (``buffer``, ``fileno``, ``isatty``, ``encoding``) is the stream's."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self._pending = ""

    def write(self, text: str) -> int:
        self._pending += text
        cut = max(self._pending.rfind("\n"), self._pending.rfind("\r"))
        if cut >= 0:
            ready, self._pending = self._pending[:cut + 1], self._pending[cut + 1:]
            self.stream.write(redact(ready))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self._pending:
            ready, self._pending = self._pending, ""
            self.stream.write(redact(ready))
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def scrubbed_output() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` scrubbed while the block runs (a command): its prints, its log
    lines and the warnings Python shows (both written to ``sys.stderr``); what is pending is written
    out at the end."""
    saved = sys.stdout, sys.stderr
    out, err = ScrubbedStream(sys.stdout), ScrubbedStream(sys.stderr)
    sys.stdout, sys.stderr = out, err   # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        for stream in (out, err):
            with contextlib.suppress(Exception):   # a reader gone away: nothing more to show
                stream.flush()

