"""Values quoted in messages, shortened: a message must stay readable (and small) whatever a file holds."""
from __future__ import annotations

import reprlib
from typing import Any

_QUOTE = reprlib.Repr()
_QUOTE.maxlevel, _QUOTE.maxstring, _QUOTE.maxother = 3, 80, 80
_QUOTE.maxlist = _QUOTE.maxtuple = _QUOTE.maxdict = _QUOTE.maxset = 8

# The most characters one problem message may take; longer ones (an op checker quoting a huge value
# whole) keep their start and end.
MAX_MESSAGE = 600


def quoted(value: Any) -> str:
    """``repr(value)`` for a message, shortened (``...``) past 80 characters or 8 items."""
    return _QUOTE.repr(value)


def shortened(message: str, limit: int = MAX_MESSAGE) -> str:
    """``message`` itself, or its start and end around ``[... N characters ...]`` when longer than ``limit``."""
    if len(message) <= limit:
        return message
    keep = (limit - 40) // 2
    return f"{message[:keep]} [... {len(message) - 2 * keep} characters ...] {message[-keep:]}"
