"""The remote shard listings cached on the node (``$XDG_CACHE_HOME/dali-bridge/listings``) are never
read or written through a link planted at their names."""
from __future__ import annotations

import os
import shutil

import pytest

from dali_bridge.data.sources.webdataset import list_webdataset
from dali_bridge.data.storage.store import ObjectStore
from dali_bridge.spec.model import DEFAULT_IMAGE_KEYS
from tests.helpers.object_storage import SHARDS
from tests.helpers.s3_fixtures import upload_folder

# fixtures, used by name
from tests.helpers.object_storage import local_shards, private_listing_cache  # noqa: F401
from tests.helpers.s3_fixtures import moto_endpoint  # noqa: F401

pytestmark = pytest.mark.slow  # a local S3 server


def test_links_planted_at_the_cached_listings_are_neither_read_nor_written_through(request, tmp_path):
    listings = request.getfixturevalue("private_listing_cache")
    prefix = upload_folder(request.getfixturevalue("moto_endpoint"), request.getfixturevalue("local_shards"),
                           "listing-links", "train")
    store = ObjectStore("s3")
    first = list_webdataset(f"{prefix}/{SHARDS}", DEFAULT_IMAGE_KEYS, store=store)
    folder = listings / "dali-bridge" / "listings"
    names = sorted(os.listdir(folder))
    outside = tmp_path / "outside"
    outside.mkdir()
    # Each listing's name now a link to another shard's listing: followed, it would give other labels.
    for number, name in enumerate(names):
        shutil.copy(folder / names[(number + 1) % len(names)], outside / name)
    for name in names:
        os.remove(folder / name)
        os.symlink(outside / name, folder / name)
    kept = {name: (outside / name).read_bytes() for name in names}
    again = list_webdataset(f"{prefix}/{SHARDS}", DEFAULT_IMAGE_KEYS, store=store)
    assert again.paths == first.paths and again.labels.tolist() == first.labels.tolist()
    assert {name: (outside / name).read_bytes() for name in names} == kept
    assert not any((folder / name).is_symlink() for name in names)   # replaced by listings of their own
