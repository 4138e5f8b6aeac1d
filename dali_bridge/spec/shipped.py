"""The pipelines shipped with dali-bridge, by name.

The files of the repository's ``pipelines/`` folder travel inside the package as
``dali_bridge/pipelines/`` (package data), so an installed dali-bridge reads them wherever it is
used from. Everything that takes a pipeline path passes it through :func:`resolve_pipeline`: a path
that is a file is read as it is; one that is not, but names a shipped pipeline (``imagenet_train``
or ``imagenet_train.yaml``), is that pipeline. A local file of the same name wins.
"""
from __future__ import annotations

import difflib
import errno
import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

SUFFIX = ".yaml"


@dataclass(frozen=True)
class ShippedPipeline:
    """One shipped pipeline file: its name (the file's stem) and where it is installed."""
    name: str
    path: Path

    def description(self) -> str:
        """The first sentence of the comment that opens the file (every shipped file has one)."""
        lines = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            if not line.startswith("#"):
                break
            lines.append(line.lstrip("#").strip())
        text = " ".join(lines)
        sentence = re.match(r"(.+?\.)(?:\s|$)", text)
        return sentence.group(1) if sentence else text


@dataclass(frozen=True)
class ResolvedPipeline:
    """Which file a pipeline path stands for: ``shipped`` when it came from the package; ``shadows``
    is the shipped file a local file of the same name takes the place of."""
    path: Path
    shipped: bool = False
    shadows: Path | None = None

    def describe(self, given: str | os.PathLike) -> str:
        """Which file was used, in words (``dali-bridge show`` prints it)."""
        if self.shipped:
            return f"{given}: the shipped pipeline {self.path}"
        if self.shadows is not None:
            return f"{self.path}: a local file (it takes the place of the shipped pipeline {self.shadows.stem})"
        return os.fspath(given)


class PipelineNotFound(FileNotFoundError):
    """A pipeline path that is neither a file nor the name of a shipped pipeline."""

    def __init__(self, given: str, names: list[str]):
        stem = _name_of(given) or Path(given).stem
        match = difflib.get_close_matches(stem, names, n=1)
        hint = f"; did you mean '{match[0]}'?" if match else ""
        detail = (f"neither a file nor a shipped pipeline{hint} (shipped: {', '.join(names)}; "
                  f"'dali-bridge pipelines' describes them)")
        super().__init__(errno.ENOENT, detail, given)

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def shipped_folder() -> Path:
    """The installed ``dali_bridge/pipelines`` folder (a file-system package: DALI needs real files anyway)."""
    return Path(str(resources.files("dali_bridge").joinpath("pipelines")))


def shipped_pipelines() -> dict[str, ShippedPipeline]:
    """Every shipped pipeline by name, sorted."""
    folder = shipped_folder()
    files = sorted(folder.glob(f"*{SUFFIX}")) if folder.is_dir() else []
    return {path.stem: ShippedPipeline(path.stem, path) for path in files}


def _name_of(given: str) -> str | None:
    """The shipped name a path could stand for: a bare name, with or without ``.yaml``; None for a
    path with a folder in it (that is a path, not a name)."""
    if not given or "/" in given or os.sep in given or (os.altsep and os.altsep in given):
        return None
    return given[: -len(SUFFIX)] if given.endswith(SUFFIX) else given


def resolve_pipeline(path: str | os.PathLike) -> ResolvedPipeline:
    """The file ``path`` stands for: itself when it is a file, else the shipped pipeline it names,
    unless ``NAME.yaml`` is a file here (the copy ``dali-bridge init NAME`` writes is what ``NAME`` runs).

    A folder of the same name as a shipped pipeline (an image folder called ``imagenet_train``, say)
    does not hide it. Raises :class:`PipelineNotFound` (a ``FileNotFoundError``) with a did-you-mean
    over the shipped names when it is neither.
    """
    given = os.fspath(path)
    shipped = shipped_pipelines()
    name = _name_of(given)
    if Path(given).is_file():
        return ResolvedPipeline(Path(given), shadows=shipped[name].path if name in shipped else None)
    if name in shipped and Path(name + SUFFIX).is_file():  # `dali-bridge init NAME` wrote it: the copy wins
        return ResolvedPipeline(Path(name + SUFFIX), shadows=shipped[name].path)
    if name in shipped:
        return ResolvedPipeline(shipped[name].path, shipped=True)
    if Path(given).exists():  # a folder or a device: reading it says what it is
        return ResolvedPipeline(Path(given))
    raise PipelineNotFound(given, list(shipped))
