"""Wording shared by messages and reports: counted nouns ("1 class", "2 classes")."""
from __future__ import annotations

from typing import Sequence

# Nouns whose plural is not the singular + "s".
_IRREGULAR = {"class": "classes", "process": "processes", "batch": "batches", "entry": "entries",
              "index": "indexes"}


def plural_noun(noun: str) -> str:
    """``"batch"`` → ``"batches"``, ``"image"`` → ``"images"``."""
    return _IRREGULAR.get(noun, noun + "s")


def problem_list(source: str, problems: Sequence[object]) -> str:
    """``source: N problem(s):`` then each problem on its own indented line (what every error that
    lists all the problems it found says)."""
    return "\n".join([f"{source}: {plural(len(problems), 'problem')}:"] + [f"  {p}" for p in problems])


def plural(count: int, noun: str) -> str:
    """``plural(1, "class")`` → ``"1 class"``; ``plural(3, "class")`` → ``"3 classes"``."""
    if count == 1:
        return f"{count} {noun}"
    return f"{count} {plural_noun(noun)}"
