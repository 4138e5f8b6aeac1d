"""Values quoted in messages, shortened: a message must stay readable (and small) whatever a file holds.

Names that come from data or files (paths, class folders, pipeline names) go through
:func:`safe_name` before they reach a terminal or a log: a downloaded dataset must not be able to
clear the screen, retitle the window or forge log lines with escape sequences, newlines or bidi
overrides in a file name."""
from __future__ import annotations

import reprlib
from typing import Any

_QUOTE = reprlib.Repr()
_QUOTE.maxlevel, _QUOTE.maxstring, _QUOTE.maxother = 3, 80, 80
_QUOTE.maxlist = _QUOTE.maxtuple = _QUOTE.maxdict = _QUOTE.maxset = 8

# The most characters one problem message may take; longer ones (an op checker quoting a huge value
# whole) keep their start and end.
MAX_MESSAGE = 600
# The most characters one name may take in a message (a path line of megabytes stays a line).
MAX_NAME = 300


def quoted(value: Any) -> str:
    """``repr(value)`` for a message, shortened (``...``) past 80 characters or 8 items."""
    return _QUOTE.repr(value)


def shortened(message: str, limit: int = MAX_MESSAGE) -> str:
    """``message`` itself, or its start and end around ``[... N characters ...]`` when longer than ``limit``."""
    if len(message) <= limit:
        return message
    keep = (limit - 40) // 2
    return f"{message[:keep]} [... {len(message) - 2 * keep} characters ...] {message[-keep:]}"


def safe_name(name: Any) -> str:
    """``name`` as text for a terminal: itself when every character prints (a space counts; a
    newline, ESC, any other control or format character such as U+202E does not), else quoted as
    ``repr`` quotes it, those characters escaped. Shortened past :data:`MAX_NAME` characters."""
    text = str(name)
    if not text.isprintable():
        text = repr(text)
    return shortened(text, MAX_NAME)
