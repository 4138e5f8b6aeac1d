"""Source listings: a folder or a file list → an indexable list of (path, label) samples.

The listing fixes the sample indices and the label order once, the same for every backend:
for a folder, the sorted sub-folder names are the classes and files are walked in sorted order,
exactly as torchvision's ``ImageFolder`` does. Files whose extension is not an image extension
are ignored (like ImageFolder and DALI's file reader) but counted, never silently dropped.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .spec import SourceSpec


class SourceError(ValueError):
    """The source cannot be listed: missing or empty root, malformed or dangling file-list lines."""


@dataclass(frozen=True)
class Listing:
    """Every sample of a source: ``paths[i]`` has label ``labels[i]``; ``classes[label]`` names it."""
    paths: tuple[str, ...]
    labels: np.ndarray
    classes: tuple[str, ...]
    root: str
    ignored: Counter = field(default_factory=Counter, compare=False)  # extension → files skipped

    def __len__(self) -> int:
        return len(self.paths)

    def describe(self) -> str:
        text = f"{len(self)} samples in {len(self.classes)} classes under {self.root}"
        if self.ignored:
            total = sum(self.ignored.values())
            kinds = ", ".join(f"{ext or '(no extension)'}: {n}" for ext, n in sorted(self.ignored.items()))
            text += f"; {total} non-image files ignored ({kinds})"
        return text


def _is_image(name: str, extensions: tuple[str, ...]) -> bool:
    return name.lower().endswith(extensions)


def list_folder(root: str | Path, extensions: tuple[str, ...]) -> Listing:
    """ImageFolder semantics: classes are the sorted sub-folders; files walked sorted, links followed."""
    root = Path(root)
    if not root.exists():
        raise SourceError(f"source.root: folder {root} does not exist")
    if not root.is_dir():
        raise SourceError(f"source.root: {root} is not a folder")
    classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
    if not classes:
        raise SourceError(f"source.root: {root} has no class sub-folders (expected root/<class>/<image> files)")
    paths: list[str] = []
    labels: list[int] = []
    ignored: Counter = Counter()
    empty: list[str] = []
    for label, name in enumerate(classes):
        before = len(paths)
        for dirpath, _, filenames in sorted(os.walk(root / name, followlinks=True)):
            for filename in sorted(filenames):
                if _is_image(filename, extensions):
                    paths.append(os.path.join(dirpath, filename))
                    labels.append(label)
                else:
                    ignored[os.path.splitext(filename)[1].lower()] += 1
        if len(paths) == before:
            empty.append(name)
    if empty:
        raise SourceError(f"source.root: class folder(s) with no images ({', '.join(extensions)}) under {root}: "
                          f"{', '.join(empty)} — remove them or add images (labels follow the sorted folder names)")
    return Listing(tuple(paths), np.asarray(labels, dtype=np.int64), tuple(classes), str(root), ignored)


def list_file(file_list: str | Path, root: str | Path | None, extensions: tuple[str, ...]) -> Listing:
    """A text file of ``path label`` lines (path may contain spaces; label is the last field).

    Blank lines and lines starting with ``#`` are skipped. Relative paths resolve against ``root``
    (default: the list file's folder). Every malformed line and missing file is reported at once,
    with its line number.
    """
    file_list = Path(file_list)
    if not file_list.is_file():
        raise SourceError(f"source.file_list: {file_list} does not exist")
    base = Path(root) if root else file_list.parent
    paths: list[str] = []
    labels: list[int] = []
    problems: list[str] = []
    with open(file_list, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            parts = text.rsplit(None, 1)
            if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
                problems.append(f"{file_list}:{number}: expected 'path label' with an integer label, found {text!r}")
                continue
            label = int(parts[1])
            if label < 0:
                problems.append(f"{file_list}:{number}: labels must be >= 0, found {label}")
                continue
            path = Path(parts[0]) if os.path.isabs(parts[0]) else base / parts[0]
            if not path.is_file():
                problems.append(f"{file_list}:{number}: file {path} does not exist")
                continue
            paths.append(str(path))
            labels.append(label)
    if problems:
        shown = problems[:50] + ([f"... and {len(problems) - 50} more"] if len(problems) > 50 else [])
        raise SourceError(f"source.file_list: {len(problems)} problem(s):\n  " + "\n  ".join(shown))
    if not paths:
        raise SourceError(f"source.file_list: {file_list} lists no samples")
    num_classes = max(labels) + 1
    return Listing(tuple(paths), np.asarray(labels, dtype=np.int64),
                   tuple(str(c) for c in range(num_classes)), str(base))


def list_source(source: SourceSpec) -> Listing:
    """The listing of a validated source."""
    if source.type == "folder":
        return list_folder(source.root, source.extensions)
    if source.type == "file_list":
        return list_file(source.file_list, source.root, source.extensions)
    raise SourceError(f"source.type: unsupported source type {source.type!r}")
