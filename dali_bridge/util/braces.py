"""Shell-style brace patterns of shard names: ranges (``train-{000000..000127}.tar``, keeping the
zero padding), lists (``{train,extra}-{0..3}.tar``), nested groups, and the bounds on the names and
groups one pattern may make."""
from __future__ import annotations

import re

_RANGE = re.compile(r"^(-?[0-9]+)\.\.(-?[0-9]+)$")

# Names one shard pattern may make: far more shards than any dataset has, and the names (about
# 100 bytes each) stay within tens of MB.
MAX_BRACE_NAMES = 100_000
MAX_BRACE_GROUPS = 64


def _first_group(pattern: str) -> tuple[int, int] | None:
    """(start, end) of the first top-level ``{...}`` group; None without braces; ValueError if unbalanced."""
    depth = 0
    start = -1
    for position, char in enumerate(pattern):
        if char == "{":
            if depth == 0:
                start = position
            depth += 1
        elif char == "}":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced '}}' at character {position + 1} of {pattern!r}")
            if depth == 0:
                return start, position
    if depth:
        raise ValueError(f"unbalanced '{{' at character {start + 1} of {pattern!r}")
    return None


def brace_count(pattern: str) -> int:
    """How many names :func:`expand_braces` makes of ``pattern``, counted without making them."""
    if pattern.count("{") > MAX_BRACE_GROUPS:
        raise ValueError(f"{pattern[:80]!r}... has {pattern.count('{')} brace groups; at most "
                         f"{MAX_BRACE_GROUPS} are allowed")
    total, rest = 1, pattern
    while (group := _first_group(rest)) is not None:
        start, end = group
        body = rest[start + 1:end]
        match = _RANGE.match(body)
        if match:
            total *= abs(int(match.group(2)) - int(match.group(1))) + 1
        else:  # each alternative is balanced, so its names and the rest's multiply
            total *= sum(brace_count(choice) for choice in _brace_choices(body, pattern))
        rest = rest[end + 1:]
    return total


def expand_braces(pattern: str, limit: int = MAX_BRACE_NAMES) -> list[str]:
    """Shell-style brace expansion: ``a-{000..002}.tar`` → zero-padded numbers, ``{x,y}`` → each.

    Numeric ranges keep the width of the wider bound when either is zero-padded (``{0..10}`` →
    ``0``…``10``, ``{00..10}`` → ``00``…``10``) and may count down. Braces nest. Raises
    :class:`ValueError` naming the problem for unbalanced braces, an empty alternative list, or a
    pattern that makes more than ``limit`` names (counted before any is made).
    """
    count = brace_count(pattern)
    if count > limit:
        raise ValueError(f"{pattern!r} makes {count:,} names; at most {limit:,} are allowed (check the range "
                         f"bounds, or split the data into fewer, larger shards)")
    return _expand(pattern)


def _expand(pattern: str) -> list[str]:
    group = _first_group(pattern)
    if group is None:
        return [pattern]
    start, end = group
    head, body, tail = pattern[:start], pattern[start + 1:end], pattern[end + 1:]
    out: list[str] = []
    for choice in _brace_choices(body, pattern):
        out.extend(_expand(head + choice + tail))
    return out


def _brace_choices(body: str, pattern: str) -> list[str]:
    match = _RANGE.match(body)
    if match:
        first, last = match.groups()
        low, high = int(first), int(last)
        padded = any(len(b.lstrip("-")) > 1 and b.lstrip("-").startswith("0") for b in (first, last))
        width = max(len(first), len(last)) if padded else 0
        step = 1 if high >= low else -1
        return [str(n).zfill(width) if width else str(n) for n in range(low, high + step, step)]
    parts, depth, current = [], 0, ""
    for char in body:  # split on top-level commas only: {a,{b,c}} has two alternatives
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        depth += (char == "{") - (char == "}")
        current += char
    parts.append(current)
    if len(parts) == 1:  # "{x}" is literal in bash; a typo like {0-9} is more likely here
        raise ValueError(f"'{{{body}}}' in {pattern!r} is neither a range like {{000..127}} nor a list like {{a,b}}")
    return parts
