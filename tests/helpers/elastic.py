"""The elastic-resume tests' pipeline, reference order and row bookkeeping."""
from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from dali_bridge import build_loader


SAMPLES = 11    # odd, not a multiple of any world x batch used here


BATCH = 3


REPEATS = 2


KEPT = 2        # batches every rank of the first world takes before it stops


def pipeline(root: Path, last_batch: str = "partial", workers: int = 0, repeats: int = REPEATS) -> dict:
    return {"version": 1, "name": "elastic", "source": {"type": "folder", "root": str(root)},
            "batch_size": BATCH, "seed": 7,
            "ops": [{"random_resized_crop": {"size": 12}}, {"horizontal_flip": {}}, {"normalize": {"dtype": "uint8"}}],
            "outputs": ["image", "label", "index", "valid"],
            "loader": {"workers": workers, "last_batch": last_batch, "repeated_augmentations": repeats}}


def image_folder(folder: Path) -> Path:
    """The tiny dataset of these tests: SAMPLES JPEGs of one class."""
    from tests.helpers.hostile import write_image_folder

    write_image_folder(folder, classes=1, per_class=SAMPLES)
    return folder


def rows(batch) -> list[tuple[int, bool, str]]:
    """(index, valid, digest of its pixels) of every row of a batch."""
    image, _, index, valid = batch
    return [(i, ok, hashlib.sha256(picture.contiguous().numpy().tobytes()).hexdigest())
            for picture, i, ok in zip(image, index.tolist(), valid.tolist())]


def kept(batches: list[list[tuple[int, bool, str]]]) -> Counter:
    """The valid rows of some batches as a multiset of (index, pixels)."""
    return Counter((i, digest) for batch in batches for i, ok, digest in batch if ok)


def take(loader) -> list[list[tuple[int, bool, str]]]:
    """The rows of every batch of the loader's next iteration."""
    return [rows(batch) for batch in loader]


def reference(root: Path, backend: str = "torchvision") -> dict[int, Counter]:
    """Every entry of epochs 0 and 1 with its pixels (one process: augmentation ignores the layout)."""
    with build_loader(pipeline(root), backend, rank=0, world_size=1) as loader:
        return {epoch: kept(take(loader)) for epoch in (0, 1)}
