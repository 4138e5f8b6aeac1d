"""The ``path label`` lines of a file list, read the same whether the list is a local file or an
object at a URL: blank lines and ``#`` comments skipped, the label the last field (a path may hold
spaces), every malformed line and bad label reported at once with its line number."""
from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...errors import SourceError
from ...util.quoting import quoted
from .listing import Listing, sparse_labels

_LABEL = re.compile(r"^-?[0-9]+$")  # ASCII digits only: str.isdigit also accepts '²' and '١'


@dataclass(frozen=True)
class ListLine:
    """One sample line: its number in the file, its path as written, its label."""
    number: int
    entry: str
    label: int


def parse_lines(content: str, where: str, problems: list[str]) -> list[ListLine]:
    """The sample lines of a list's text (``where`` names it in each problem, added to ``problems``)."""
    lines: list[ListLine] = []
    content = content.removeprefix("\ufeff")  # a byte-order mark some editors write: not part of line 1's path
    for number, line in enumerate(io.StringIO(content, newline=None), start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        parts = text.rsplit(None, 1)
        if len(parts) != 2 or not _LABEL.match(parts[1]):
            problems.append(f"{where}:{number}: expected 'path label' with an integer label, found {quoted(text)}")
            continue
        label = int(parts[1])
        if label < 0:
            problems.append(f"{where}:{number}: labels must be >= 0, found {label}")
            continue
        lines.append(ListLine(number, parts[0], label))
    return lines


def listed_samples(where: str, base: str, lines: Sequence[ListLine], paths: Sequence[str],
                   problems: list[str], samples=None) -> Listing:
    """The listing of a file list's ``lines`` found at ``paths`` (labels checked as class numbers),
    or a :class:`SourceError` with every problem; ``samples``: how their bytes are read (None:
    local files)."""
    labels = [line.label for line in lines]
    if not problems:
        problems.extend(sparse_labels(labels, lambda i: f"{where}:{lines[i].number}"))
    if problems:
        shown = problems[:50] + ([f"... and {len(problems) - 50} more"] if len(problems) > 50 else [])
        raise SourceError(f"source.file_list: {len(problems)} problem(s):\n  " + "\n  ".join(shown))
    if not paths:
        raise SourceError(f"source.file_list: {where} lists no samples")
    return Listing(tuple(paths), np.asarray(labels, dtype=np.int64), tuple(str(c) for c in range(max(labels) + 1)),
                   base, shards=samples)
