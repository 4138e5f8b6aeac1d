"""Synthetic, photo-like ImageFolder JPEG dataset for tests and benchmarks.

Real datasets cannot be downloaded everywhere, so this module writes a
deterministic stand-in whose images have natural-image statistics (rendered by
:mod:`dali_bridge.data.sources.synthetic_images`). JPEGs come out at ~0.8-1.6 bits/pixel
(median ~1.1) at quality 90, like smooth photographs (pure noise would be ~6+);
generation runs in a process pool.

Layout written by :func:`generate_sample_data`::

    root/.dali-bridge-samples.json     manifest (parameters, completeness)
    root/class_000/img_00000.jpg
    root/class_001/img_00001.jpg
    ...

Image ``i`` has label ``i % classes`` (round-robin), so sorted class folder
names equal label order and every class gets ``images // classes`` or one
more image. Output is a pure function of ``(images, classes, seed, quality)``:
repeated runs give byte-identical files regardless of the worker count
(same numpy/Pillow versions assumed).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from PIL import Image

from ...errors import SourceError
from .synthetic_images import sample_image

__all__ = ["MANIFEST_NAME", "SampleSetInfo", "ensure_sample_data", "generate_sample_data"]

#: Manifest file written into the dataset root.
MANIFEST_NAME = ".dali-bridge-samples.json"
#: Bump whenever rendering (synthetic_images) or encoding changes, so stale sets are regenerated.
_GENERATOR_VERSION = 2
_FORMAT = "dali-bridge-samples"

_CLASS_RE = re.compile(r"class_\d+")
_IMG_RE = re.compile(r"img_\d+\.jpg")
_TMP_RE = re.compile(r"\.img_\d+\.jpg\.tmp-\d+")


@dataclass(frozen=True)
class SampleSetInfo:
    """Description of a generated sample set.

    ``root``: dataset directory; ``images``: number of JPEG files;
    ``classes``: number of class folders; ``seed``: generator seed;
    ``class_names``: folder names in label order; ``bytes_total``: summed
    JPEG file sizes in bytes.
    """

    root: Path
    images: int
    classes: int
    seed: int
    class_names: tuple[str, ...]
    bytes_total: int


# ---------------------------------------------------------------------------
# Dataset generation
# ---------------------------------------------------------------------------


def _digits(n: int, minimum: int) -> int:
    return max(minimum, len(str(max(n - 1, 0))))


def _class_names(classes: int) -> tuple[str, ...]:
    width = _digits(classes, 3)
    return tuple(f"class_{c:0{width}d}" for c in range(classes))


def _relpaths(images: int, classes: int) -> list[str]:
    names = _class_names(classes)
    width = _digits(images, 5)
    return [f"{names[i % classes]}/img_{i:0{width}d}.jpg" for i in range(images)]


def _write_jpeg(task: tuple[str, str, int, int, int]) -> int:
    """Render and atomically write one JPEG; return its size in bytes."""
    root, rel, index, seed, quality = task
    final = os.path.join(root, rel)
    head, name = os.path.split(final)
    tmp = os.path.join(head, f".{name}.tmp-{os.getpid()}")
    arr = sample_image(index, seed)
    try:
        # Baseline (non-progressive), 4:2:0 chroma subsampling, no metadata.
        Image.fromarray(arr, "RGB").save(tmp, "JPEG", quality=quality, subsampling=2, optimize=False)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return os.path.getsize(final)


def _params(images: int, classes: int, seed: int, quality: int) -> dict:
    return {
        "format": _FORMAT,
        "version": _GENERATOR_VERSION,
        "images": images,
        "classes": classes,
        "seed": seed,
        "quality": quality,
    }


def _read_manifest(root: Path) -> dict | None:
    try:
        with open(root / MANIFEST_NAME, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_manifest(root: Path, data: dict) -> None:
    path = root / MANIFEST_NAME
    tmp = root / f".{MANIFEST_NAME}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class SampleDataError(SourceError):
    """The sample set cannot be made as asked: its settings or its destination (exit 2 from the CLI)."""


class SampleDataExists(SampleDataError, FileExistsError):
    """The destination holds files that are not a previous sample set."""


class SampleDataNotAFolder(SampleDataError, NotADirectoryError):
    """The destination exists and is not a folder."""


#: The most images one set may hold: ImageNet-1k's 1.28 M training images several times over. The
#: generator renders about 13 ms a core per image, so this is already days of work; a larger count is
#: a typo (and its list of names alone would not fit in memory).
MAX_IMAGES = 10_000_000
#: Mean bytes per generated JPEG (ImageNet-like sizes at quality 90), for the disk-space check.
MEAN_IMAGE_BYTES = 42_000


def _validate(images: int, classes: int, seed: int, quality: int) -> None:
    if images > MAX_IMAGES:
        raise SampleDataError(f"images ({images:,}, --images) must be at most {MAX_IMAGES:,} (about "
                              f"{MAX_IMAGES * MEAN_IMAGE_BYTES / 1e9:,.0f} GB of JPEGs)")
    if classes < 1:
        raise SampleDataError(f"classes (--classes) must be >= 1, got {classes}")
    if images < classes:
        raise SampleDataError(f"images ({images}, --images) must be >= classes ({classes}) so every class "
                              f"gets images")
    if seed < 0:
        raise SampleDataError(f"seed (--seed) must be non-negative, got {seed}")
    if not 1 <= quality <= 100:
        raise SampleDataError(f"quality must be in 1..100, got {quality}")


def _check_disk_space(root: Path, images: int) -> None:
    """Refuse a set that cannot fit on the disk before writing the first of its files."""
    import shutil

    needed = images * MEAN_IMAGE_BYTES
    free = shutil.disk_usage(root).free
    if needed > free:
        raise SampleDataError(f"{images:,} images need about {needed / 2**20:,.0f} MiB; {str(root)!r} has "
                              f"{free / 2**20:,.0f} MiB free: use fewer --images or another folder")


def _remove_stale(root: Path, keep: set[str]) -> None:
    """Delete sample files/tmp files and empty class folders not in ``keep``; leave anything else."""
    for d in root.iterdir():
        if not (d.is_dir() and not d.is_symlink() and _CLASS_RE.fullmatch(d.name)):
            continue
        for f in d.iterdir():
            rel = f"{d.name}/{f.name}"
            if _TMP_RE.fullmatch(f.name) or (_IMG_RE.fullmatch(f.name) and rel not in keep):
                if f.is_file() or f.is_symlink():
                    f.unlink()
        try:
            next(d.iterdir())
        except StopIteration:
            if d.name not in {k.split("/", 1)[0] for k in keep}:
                d.rmdir()
    for f in root.iterdir():
        if f.name.startswith(f".{MANIFEST_NAME}.tmp-") and f.is_file():
            f.unlink()


def _run_tasks(tasks: list[tuple[str, str, int, int, int]], workers: int, on_done: Callable[[int], None]) -> None:
    if workers <= 1 or len(tasks) <= 1:
        for t in tasks:
            on_done(_write_jpeg(t))
        return
    # fork keeps start-up cheap and works without an ``if __name__ == "__main__"`` guard.
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("fork") if "fork" in methods else mp.get_context()
    n = min(workers, len(tasks))
    chunk = max(1, min(16, len(tasks) // (n * 8)))
    with ctx.Pool(n) as pool:
        for nbytes in pool.imap_unordered(_write_jpeg, tasks, chunksize=chunk):
            on_done(nbytes)


def _generate(
    root: Path,
    images: int,
    classes: int,
    seed: int,
    quality: int,
    workers: int | None,
    progress: Callable[[int, int], None] | None,
    overwrite: bool,
    resume: bool,
) -> SampleSetInfo:
    _validate(images, classes, seed, quality)
    if root.exists() and not root.is_dir():
        raise SampleDataNotAFolder(f"sample data root {str(root)!r} exists and is not a directory")
    root.mkdir(parents=True, exist_ok=True)
    _check_disk_space(root, images)
    ours = (root / MANIFEST_NAME).is_file()
    if not ours and not overwrite and any(root.iterdir()):
        raise SampleDataExists(
            f"refusing to write sample data into non-empty directory {str(root)!r}: it is not a "
            f"previous sample set (no {MANIFEST_NAME}); pass overwrite=True or use an empty directory"
        )
    params = _params(images, classes, seed, quality)
    old = _read_manifest(root) if ours else None
    resume = resume and old is not None and all(old.get(k) == v for k, v in params.items())

    rels = _relpaths(images, classes)
    names = _class_names(classes)
    # Mark incomplete first: an interrupted run is then detected (and resumable).
    _write_manifest(root, {**params, "complete": False, "class_names": list(names)})
    _remove_stale(root, set(rels))
    for name in names:
        (root / name).mkdir(exist_ok=True)

    total = 0
    done = 0
    tasks = []
    for i, rel in enumerate(rels):
        p = root / rel
        if resume and p.is_file():
            total += p.stat().st_size
            done += 1
        else:
            tasks.append((str(root), rel, i, seed, quality))
    if progress is not None:
        progress(done, images)

    def on_done(nbytes: int) -> None:
        nonlocal total, done
        total += nbytes
        done += 1
        if progress is not None:
            progress(done, images)

    _run_tasks(tasks, (os.cpu_count() or 1) if workers is None else workers, on_done)
    _write_manifest(root, {**params, "complete": True, "class_names": list(names), "bytes_total": total})
    return SampleSetInfo(root, images, classes, seed, names, total)


def generate_sample_data(
    root: str | Path,
    images: int = 1000,
    classes: int = 10,
    seed: int = 0,
    *,
    quality: int = 90,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    overwrite: bool = False,
) -> SampleSetInfo:
    """Write a synthetic ImageFolder JPEG dataset to ``root`` and describe it.

    ``images`` (default 1000) JPEGs are spread round-robin over ``classes``
    (default 10) folders ``class_000``...; needs ``images >= classes``.
    ``seed`` (default 0) selects the content; ``quality`` (default 90) is the
    JPEG quality (baseline, 4:2:0). ``workers`` is the process count (default
    ``os.cpu_count()``; ``<= 1`` renders in-process). ``progress(done, total)``
    is called in the calling process as images complete.

    Always (re)writes every image; files are written to a temporary name and
    renamed, so no partial JPEG ever has a final name. ``root`` may be missing,
    empty, or a previous sample set (stale sample files are removed). Any other
    non-empty directory raises :class:`FileExistsError` unless ``overwrite=True``,
    in which case sample files are written alongside its other content, which
    is left untouched.
    """
    return _generate(Path(root), images, classes, seed, quality, workers, progress, overwrite, resume=False)


def _existing_info(root: Path, images: int, classes: int, seed: int, quality: int) -> SampleSetInfo | None:
    data = _read_manifest(root)
    if data is None or not data.get("complete"):
        return None
    if any(data.get(k) != v for k, v in _params(images, classes, seed, quality).items()):
        return None
    total = 0
    try:
        for rel in _relpaths(images, classes):
            total += (root / rel).stat().st_size
    except OSError:
        return None
    if total != data.get("bytes_total"):
        return None
    return SampleSetInfo(root, images, classes, seed, _class_names(classes), total)


def ensure_sample_data(
    root: str | Path,
    images: int = 1000,
    classes: int = 10,
    seed: int = 0,
    *,
    quality: int = 90,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SampleSetInfo:
    """Return the sample set at ``root``, generating it only if absent or incomplete.

    If ``root/.dali-bridge-samples.json`` records a complete set with the same
    ``images``/``classes``/``seed``/``quality`` (defaults 1000/10/0/90) and all
    files are present with the recorded total size, nothing is written. An
    interrupted run with the same parameters is resumed (existing images kept);
    otherwise the set is regenerated as by :func:`generate_sample_data`
    (which refuses a foreign non-empty directory).
    """
    root = Path(root)
    _validate(images, classes, seed, quality)
    info = _existing_info(root, images, classes, seed, quality)
    if info is not None:
        return info
    return _generate(root, images, classes, seed, quality, workers, progress, overwrite=False, resume=True)
