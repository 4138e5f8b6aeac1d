"""A cached shard rewritten on disk while a loader runs (eight bytes of image data flipped, its
modification time put back) is noticed at the next read, checked against the manifest's sha256
again and fetched again: the next epoch gives the same pixels, with a warning."""
from __future__ import annotations

import logging
import os
import tarfile
from pathlib import Path

import pytest
import torch

from dali_bridge import build_loader
from tests.helpers.object_storage import SHARDS, overrides
from tests.helpers.paths import TRAIN
from tests.helpers.s3_fixtures import upload_folder

# fixtures, used by name
from tests.helpers.object_storage import local_shards, private_listing_cache  # noqa: F401
from tests.helpers.s3_fixtures import moto_endpoint  # noqa: F401

pytestmark = pytest.mark.slow  # a local S3 server


def _flip_image_bytes(shard: Path) -> None:
    with tarfile.open(shard) as archive:
        images = [m for m in archive.getmembers() if m.name.endswith(".jpg")]
    status = shard.stat()
    with open(shard, "r+b") as handle:
        for member in images:
            handle.seek(member.offset_data + member.size // 2)
            flipped = bytes(b ^ 0x5A for b in handle.read(8))
            handle.seek(member.offset_data + member.size // 2)
            handle.write(flipped)
    os.utime(shard, ns=(status.st_atime_ns, status.st_mtime_ns))


def _epoch(loader, epoch: int) -> list:
    loader.set_epoch(epoch)
    return [tuple(t.clone() for t in batch) for batch in loader]


@pytest.mark.usefixtures("private_listing_cache")
def test_a_cached_shard_changed_between_epochs_is_verified_and_fetched_again(request, tmp_path, caplog):
    prefix = upload_folder(request.getfixturevalue("moto_endpoint"), request.getfixturevalue("local_shards"),
                           "tampered-cache", "train")
    cache = tmp_path / "cache"
    loader = build_loader(TRAIN, "torchvision", overrides=overrides(
        f"{prefix}/{SHARDS}", source={"cache": {"dir": str(cache), "max_bytes": "1GB"}}, **{"loader.workers": 0}))
    try:
        first = _epoch(loader, 0)
        shards = sorted(cache.glob("*.tar"))
        assert len(shards) == 4
        for shard in shards:
            _flip_image_bytes(shard)
        with caplog.at_level(logging.WARNING, logger="dali_bridge"):
            again = _epoch(loader, 0)
    finally:
        loader.close()
    assert len(again) == len(first)
    assert all(torch.equal(a, b) for x, y in zip(first, again) for a, b in zip(x, y))
    assert "changed since it was verified" in caplog.text and "is damaged: deleted, fetching it again" in caplog.text
