"""The listing's packed sample names (dali_bridge.data.sources.path_table): every string back exactly,
the fingerprint's bytes fed from the arrays equal to hashing name by name, and the index small and
shared: bytes per sample under a bound for folders and shards, and a forked worker that looks every
sample up copying none of it."""
from __future__ import annotations

import hashlib
import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest

from dali_bridge.bench.scale import index_bytes, index_copied_by_workers
from dali_bridge.data.sources.listing import Listing
from dali_bridge.data.sources.local import list_folder
from dali_bridge.data.sources.path_table import PathTable, PathTableBuilder
from dali_bridge.data.sources.webdataset import list_webdataset
from dali_bridge.spec.model import DEFAULT_EXTENSIONS, DEFAULT_IMAGE_KEYS

ODD = ["root/a/x.jpg", "root/a/y.jpg", "root/b/z.jpg", "elsewhere.jpg", "", "/", "root/", "rootx/a.jpg",
       "é/ü 1.jpg", "root/a/not-utf8-\udcff.jpg", "lone-\ud800.jpg", "s.tar#key/1.jpg", "s.tar#2.jpg",
       "root/a/x.jpg"]


def _imagenet_names(count: int, root: str = "/data/train") -> list[str]:
    """ImageNet-like paths: 1,000 class folders (fewer for small counts), files named after them."""
    classes = min(1000, count)
    return [f"{root}/n{i * classes // count:08d}/n{i * classes // count:08d}_{i}.JPEG" for i in range(count)]


def test_every_name_comes_back_exactly_by_index_slice_and_iteration_and_after_pickling():
    table = PathTable.of(ODD)
    assert len(table) == len(ODD) and list(table) == ODD
    assert [table[i] for i in range(-len(ODD), 0)] == ODD
    assert table[2:5] == tuple(ODD[2:5]) and table[::-3] == tuple(ODD[::-3])
    assert table == tuple(ODD) and table == ODD and table != tuple(ODD[:-1])
    assert pickle.loads(pickle.dumps(table)) == table
    with pytest.raises(IndexError, match="sample 14 is outside the 14 listed"):
        table[len(ODD)]


def test_names_added_in_a_folder_may_hold_slashes_and_nul_characters():
    builder = PathTableBuilder()
    builder.add_in_folder("dir/", ["a/b.jpg", "nul\0inside.jpg", ""])
    builder.add_in_folder("other/", ["c.jpg"])
    builder.add_in_folder("empty/", [])
    assert list(builder.build()) == ["dir/a/b.jpg", "dir/nul\0inside.jpg", "dir/", "other/c.jpg"]


@pytest.mark.parametrize("strip", ["root/", "", "/", "é/", "s.tar#key/"])
@pytest.mark.parametrize("names", [[n for n in ODD if "\ud800" not in n], ["root/a/x.jpg"], [],
                                   _imagenet_names(5000, "root")],
                         ids=["odd", "one", "none", "imagenet"])
def test_feeding_a_digest_from_the_arrays_hashes_what_name_by_name_updates_would(names, strip):
    expected = hashlib.sha256()
    for name in names:
        expected.update((name[len(strip):] if strip and name.startswith(strip) else name)
                        .encode("utf-8", "surrogateescape") + b"\0")
    for chunk in (1, 7, 1 << 14):
        digest = hashlib.sha256()
        PathTable.of(names).feed(digest, strip=strip, chunk=chunk)
        assert digest.hexdigest() == expected.hexdigest()


def test_feeding_a_name_surrogateescape_cannot_write_fails_as_hashing_it_would():
    with pytest.raises(UnicodeEncodeError):
        PathTable.of(ODD).feed(hashlib.sha256(), strip="root/")


def test_a_listing_packs_names_given_as_a_tuple_and_labels_given_as_a_list():
    listing = Listing(("r/a/x.jpg", "r/b/y.jpg"), [0, 1], ("a", "b"), "r")
    assert isinstance(listing.paths, PathTable) and listing.paths == ("r/a/x.jpg", "r/b/y.jpg")
    assert listing.labels.dtype == np.int64 and listing.labels.tolist() == [0, 1]


# ---- the index's size and sharing

MAX_INDEX_BYTES_PER_SAMPLE = 64


def _folder_of_empty_files(root: Path, count: int) -> Path:
    """An ImageFolder of ``count`` empty .JPEG files in ImageNet's naming (listing never reads them)."""
    for path in _imagenet_names(count, str(root)):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "wb").close()
    return root


def _shard(path: Path, keys: list[str]) -> None:
    """A WebDataset shard of ``keys`` (convert's layout: class folder/name), a label and a tiny
    image member each (never decoded by the listing)."""
    with tarfile.open(path, "w") as archive:
        for number, key in enumerate(keys):
            for ext, payload in (("cls", str(number % 10).encode()), ("jpg", b"\xff\xd8" + bytes(30))):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(payload)
                archive.addfile(info, io.BytesIO(payload))


def test_a_folder_of_ten_thousand_files_is_indexed_in_at_most_64_bytes_a_sample(tmp_path):
    listing = list_folder(_folder_of_empty_files(tmp_path / "train", 10_000), DEFAULT_EXTENSIONS)
    assert len(listing) == 10_000 and listing.paths[1234] == _imagenet_names(10_000, str(tmp_path / "train"))[1234]
    size = index_bytes(listing)
    assert size["total"] / len(listing) <= MAX_INDEX_BYTES_PER_SAMPLE, size


def test_shards_of_ten_thousand_samples_are_indexed_in_at_most_64_bytes_a_sample(tmp_path):
    keys = [name.rsplit("/", 2)[-2] + "/" + name.rsplit("/", 1)[-1].removesuffix(".JPEG")
            for name in _imagenet_names(10_000)]
    for shard in range(10):
        _shard(tmp_path / f"train-{shard:06d}.tar", keys[shard * 1000:(shard + 1) * 1000])
    listing = list_webdataset(str(tmp_path / "train-{000000..000009}.tar"), DEFAULT_IMAGE_KEYS)
    assert len(listing) == 10_000 and listing.paths[0] == f"{tmp_path}/train-000000.tar#{keys[0]}.jpg"
    size = index_bytes(listing)
    assert size["total"] / len(listing) <= MAX_INDEX_BYTES_PER_SAMPLE, size


def test_a_forked_worker_that_looks_every_sample_up_copies_almost_none_of_the_index():
    # A tuple of 10^5 strings would be copied whole (~13 MiB): each look-up writes a reference count.
    listing = Listing(_imagenet_names(100_000), np.zeros(100_000, dtype=np.int64), ("c",), "/data/train")
    size = index_bytes(listing)["total"]
    (worker,) = index_copied_by_workers(listing, workers=1)
    assert worker["private_growth"] < size / 4, (worker, size)
