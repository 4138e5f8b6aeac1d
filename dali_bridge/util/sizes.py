"""Sizes written by people: ``1000000``, ``"500MB"``, ``"20 GiB"`` as bytes."""
from __future__ import annotations


def parse_size(value: object) -> int | None:
    """``1000000``, ``"500MB"``, ``"20 GiB"`` → bytes (KB, MB... are powers of 1000, KiB, MiB... of 1024);
    None when ``value`` is not a size."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return None
    text = value.strip().replace(" ", "")
    units = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    number = text.rstrip("KMGTIBkmgtib")
    unit = text[len(number):].upper()
    try:
        amount = float(number)
    except ValueError:
        return None
    return int(amount * units[unit]) if unit in units and amount >= 0 else None
