"""Text read from files: UTF-8 decoding that names the first bad byte's line and column, and strings
that cannot be written as UTF-8.

A leaf: it imports only :mod:`dali_bridge.util.quoting`, so the spec layer, the sources and the converter
share it.
"""
from __future__ import annotations

from .quoting import quoted


class NotUtf8Error(UnicodeError):
    """A text file (pipeline, file list, manifest, index) holds bytes that are not UTF-8."""

    def __init__(self, filename: str, data: bytes, exc: UnicodeDecodeError):
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        self.where = f"{filename}:{line}:{column}"
        self.detail = (f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                       f"save the file as UTF-8")
        super().__init__(f"{self.where}: {self.detail}")


def decode_utf8(data: bytes, filename: str) -> str:
    """``data`` as UTF-8 text; :class:`NotUtf8Error` naming the file, line and column of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotUtf8Error(filename, data, exc) from None


def text_problem(value: str) -> str | None:
    """Why a string cannot be written as UTF-8 (a lone surrogate such as ``\\ud800``), or None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"holds {quoted(value[exc.start:exc.end])} at character {exc.start + 1}, a lone surrogate "
                f"that is not a Unicode character (an invalid escape?)")
    return None
