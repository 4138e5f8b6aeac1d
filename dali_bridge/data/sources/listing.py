"""What every source lists into: :class:`Listing` (the samples, their labels and class names, and
how each sample's bytes are read and checked), :class:`SourceError`, and the bound on class numbers
a listing of N samples may use."""
from __future__ import annotations

from ...errors import SourceError  # noqa: F401

import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from .formats import ImageInfo, inspect_image, without_webp_exif
from ...spec.model import DEFAULT_MAX_PIXELS
from ...errors import ImageError
from .images import check_encoded, read_file, too_many_bytes
from .path_table import PathTable
from ..shards.remote import RemoteShardSamples
from ..shards.tar import ShardSamples
from ...spec.model import DEFAULT_MAX_BYTES
from ...util.wording import plural


# Labels are class numbers 0..C-1: C may be at most max(MIN_CLASS_BOUND, CLASSES_PER_SAMPLE x samples),
# which bounds the class-name table by the listing's own size.
MIN_CLASS_BOUND = 100_000
CLASSES_PER_SAMPLE = 4


@dataclass(frozen=True)
class Listing:
    """Every sample of a source: ``paths[i]`` has label ``labels[i]``; ``classes[label]`` names it.

    The per-sample index is arrays only (the names a :class:`~dali_bridge.data.sources.path_table.PathTable`,
    the labels int64), so DataLoader workers forked from the process that holds it share it instead
    of copying it (see :mod:`dali_bridge.data.sources.path_table`); ``paths`` given as any sequence
    of strings is packed into one."""
    paths: PathTable
    labels: np.ndarray
    classes: tuple[str, ...]
    root: str
    ignored: Counter = field(default_factory=Counter, compare=False)  # extension → files skipped
    # where shard samples' bytes are: local shards, objects at URLs, or Parquet row groups
    # (dali_bridge.data.sources.parquet.ParquetSamples); read(index) gives them
    shards: ShardSamples | RemoteShardSamples | None = field(default=None, compare=False)
    max_pixels: int = field(default=DEFAULT_MAX_PIXELS, compare=False)  # source.max_pixels: larger images are refused
    max_bytes: int = field(default=DEFAULT_MAX_BYTES, compare=False)  # source.max_bytes: larger files are refused

    def __post_init__(self) -> None:
        if not isinstance(self.paths, PathTable):
            object.__setattr__(self, "paths", PathTable.of(self.paths))
        if not isinstance(self.labels, np.ndarray):
            object.__setattr__(self, "labels", np.asarray(self.labels, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.paths)

    def read(self, index: int) -> bytes:
        """Sample ``index``'s encoded image, checked like a file's; :class:`~dali_bridge.errors.ImageError` if not."""
        data = self._raw(index)
        check_encoded(data, max_pixels=self.max_pixels)
        return data

    @property
    def reads_ahead(self) -> int:
        """How many of a reading thread's next batches :meth:`prefetch` reads ahead (0: none; no
        reader needs to say its next batches)."""
        return self.shards.reads_ahead if isinstance(self.shards, RemoteShardSamples) else 0

    def prefetch(self, indices, ahead: Sequence = ()) -> None:
        """Fetch these samples' bytes together ahead of their reads, then those of ``ahead`` (the
        sample indices of the batches the calling thread reads next, in order): concurrent ranged
        GETs for shards at a URL (a batch's latency paid once, and hidden behind the decode of the
        batches before it), nothing for local files."""
        if isinstance(self.shards, RemoteShardSamples):
            self.shards.prefetch(indices, ahead)

    def stop_reading_ahead(self) -> None:
        """Cancel every thread's prefetched requests still waiting (the loader's iteration ended or
        it closed)."""
        if isinstance(self.shards, RemoteShardSamples):
            self.shards.close()

    def read_info(self, index: int) -> tuple[bytes, ImageInfo]:
        """Sample ``index``'s bytes, checked as :meth:`read` checks them, and their
        :class:`~dali_bridge.data.sources.formats.ImageInfo` (format, decoded size, EXIF orientation), from one walk
        of the header — the bytes as every decoder gets them: a WebP without its EXIF chunk, whose
        orientation no backend applies (see :mod:`dali_bridge.data.sources.formats`)."""
        data = self._raw(index)
        info = inspect_image(data, max_pixels=self.max_pixels)
        return (without_webp_exif(data) if info.format == "webp" else data), info

    def read_sized(self, index: int) -> tuple[bytes, tuple[int, int]]:
        """:meth:`read_info` with the decoded (height, width) alone."""
        data, info = self.read_info(index)
        return data, info.size

    def signature(self, index: int) -> tuple[int, int] | None:
        """(modification time in ns, size) of sample ``index``'s file, to notice that it changed;
        None for a shard member (shards are immutable) or a file that cannot be stat'ed."""
        if self.shards is not None:
            return None
        try:
            status = os.stat(self.paths[index])
        except OSError:
            return None
        return status.st_mtime_ns, status.st_size

    def _raw(self, index: int) -> bytes:
        """Sample ``index``'s bytes, at most ``max_bytes`` of them: every read of a sample (both CPU
        backends, ``convert``) comes through here, so an over-size file is the same sample error on each."""
        if self.shards is None:
            return read_file(self.paths[index], max_bytes=self.max_bytes)
        if self.shards.size is not None:
            size = int(self.shards.size[index])
            if size > self.max_bytes:  # from the shard's index, before reading
                raise ImageError(too_many_bytes(size, self.max_bytes))
        data = self.shards.read(index)
        if len(data) > self.max_bytes:  # a source that knows a size only once read (Parquet's row groups)
            raise ImageError(too_many_bytes(len(data), self.max_bytes))
        return data

    def describe(self) -> str:
        text = f"{plural(len(self), 'sample')} in {plural(len(self.classes), 'class')} under {self.root}"
        if self.ignored:
            total = sum(self.ignored.values())
            kinds = ", ".join(f"{ext or '(no extension)'}: {n}" for ext, n in sorted(self.ignored.items()))
            what = "shard members" if self.shards is not None else "non-image files"
            text += f"; {total} {what} ignored ({kinds})"
        return text


def class_bound(samples: int) -> int:
    """The most classes a listing of ``samples`` samples may number: labels are class numbers
    0..C-1, and a class table far larger than the data is a typo, not a dataset."""
    return max(MIN_CLASS_BOUND, CLASSES_PER_SAMPLE * samples)


def sparse_labels(labels: list[int], where: Callable[[int], str]) -> list[str]:
    """A problem per label too large to be a class number (see :func:`class_bound`); ``where(i)``
    names the place of ``labels[i]`` (file and line, shard and sample)."""
    bound = class_bound(len(labels))
    return [f"{where(i)}: label {label} is not a class number: labels count classes from 0 and "
            f"{len(labels)} samples may use at most {bound:,} classes (0..{bound - 1}); "
            f"renumber the classes densely" for i, label in enumerate(labels) if label >= bound]
