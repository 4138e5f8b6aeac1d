"""A file list's images and Parquet files at a URL read as shards at a URL are: the same batches as
their local copies, faults retried within source.timeout, an object replaced since its listing an
error naming it (never other bytes), and the node's cache of whole objects with its size checks.
Against Python's HTTP server and moto's S3 on 127.0.0.1 (tests/helpers/remote_sources.py)."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from dali_bridge import build_loader
from dali_bridge.data.sources.local import list_source
from dali_bridge.errors import ImageError, SourceError
from dali_bridge.spec.pipeline import spec_from_dict
from tests.helpers import remote_sources, s3_fixtures
from tests.helpers.backends import CPU_BACKENDS
from tests.helpers.paths import TRAIN
from tests.helpers.remote_sources import FILE_LIST, PARQUET, remote_source

pytest.importorskip("pyarrow", reason="the Parquet sources need the [parquet] extra")

moto_endpoint, fault_proxy = s3_fixtures.moto_endpoint, s3_fixtures.fault_proxy
local_tree, http_tree, s3_tree = remote_sources.local_tree, remote_sources.http_tree, remote_sources.s3_tree


def overrides(source: dict, **extra) -> dict:
    return {"source": source, "batch_size": 5, "loader.workers": 1, "ops.0.random_resized_crop.size": 24,
            "outputs": ["image", "label", "index"], **extra}


def epoch(source: dict, backend: str = "torchvision", **extra) -> list[tuple]:
    with build_loader(TRAIN, backend, overrides=overrides(source, **extra)) as loader:
        return [(image.cpu().numpy().tobytes(), label.tolist(), index.tolist()) for image, label, index in loader]


def local_source(kind: str, tree: Path) -> dict:
    return {"file_list": {"type": "file_list", "file_list": str(tree / FILE_LIST)},
            "parquet": {"type": "parquet", "files": str(tree / PARQUET)}}[kind]


def listing_of(source: dict, tmp_path: Path):
    spec = spec_from_dict({"version": 1, "batch_size": 2, "ops": [{"center_crop": 8}], "source": source},
                          base_dir=tmp_path)
    return list_source(spec.source)


@pytest.fixture
def served_copy(local_tree: Path, tmp_path: Path):
    """A copy of the source tree served on 127.0.0.1 (its files may be changed by the test): (folder, base URL)."""
    root = tmp_path / "served"
    shutil.copytree(local_tree, root)
    server, base = s3_fixtures.serve_folder(root)
    yield root, base
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("kind", ["file_list", "parquet"])
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_source_at_a_url_gives_its_local_copys_batches(kind, backend, local_tree, http_tree, s3_tree):
    here = epoch(local_source(kind, local_tree), backend)
    assert len(here) == 8
    for base in (http_tree, s3_tree):
        assert epoch(remote_source(kind, base), backend) == here


@pytest.mark.parametrize("kind", ["file_list", "parquet"])
def test_faults_at_a_url_are_retried_within_the_timeout(kind, local_tree, http_tree, fault_proxy):
    proxy = fault_proxy(http_tree)
    proxy.every = (3, ["503", "reset", "short"])   # every third ranged GET: images, footers and row groups alike
    assert epoch(remote_source(kind, proxy.endpoint, timeout=30)) == epoch(local_source(kind, local_tree))
    assert set(proxy.injected) == {"503", "reset", "short"}


@pytest.mark.parametrize("kind", ["file_list", "parquet"])
def test_an_object_replaced_after_its_listing_is_an_error_naming_it_not_other_bytes(kind, served_copy, tmp_path):
    root, base = served_copy
    listing = listing_of(remote_source(kind, base, timeout=5), tmp_path)
    replaced = root / ("images/class_000/img_00000.jpg" if kind == "file_list" else "parquet/train-00000.parquet")
    replaced.write_bytes(replaced.read_bytes())   # the same bytes, written again: a new ETag
    with pytest.raises(ImageError, match="changed since it was listed"):
        listing.read(0)


@pytest.mark.parametrize("store", ["http_tree", "s3_tree"])
@pytest.mark.parametrize("kind", ["file_list", "parquet"])
def test_the_node_cache_holds_each_object_once_and_fetches_a_damaged_copy_again(kind, store, local_tree, tmp_path,
                                                                                 caplog, request):
    cache = tmp_path / "node-cache"
    source = remote_source(kind, request.getfixturevalue(store), cache={"dir": str(cache), "max_bytes": "1GB"})
    in_process = {"loader.workers": 0}   # the cache's warnings logged here, where caplog sees them
    here = epoch(local_source(kind, local_tree), **in_process)

    def copies() -> dict[str, int]:   # each cached object's file and its inode (a download makes a new one)
        return {p.name: p.stat().st_ino for p in cache.iterdir() if p.suffix == ".tar"}

    assert epoch(source, **in_process) == here
    first = copies()
    assert len(first) == (37 if kind == "file_list" else 2)
    assert epoch(source, **in_process) == here and copies() == first   # read from the node's copies
    damaged = sorted(first)[0]
    with open(cache / damaged, "r+b") as handle:
        handle.truncate(10)
    with caplog.at_level(logging.WARNING, logger="dali_bridge"):
        assert epoch(source, **in_process) == here
    assert "is damaged: deleted, fetching it again" in caplog.text
    assert copies().keys() == first.keys() and (cache / damaged).stat().st_size > 10   # whole again


def test_a_file_lists_images_are_all_in_the_lists_store(http_tree, tmp_path):
    listed = tmp_path / "list.txt"
    listed.write_text(f"{http_tree}/images/class_000/img_00000.jpg 0\ns3://elsewhere/img.jpg 1\n")
    with pytest.raises(SourceError, match=r"list.txt:2: s3://elsewhere/img.jpg is not at a http:// URL"):
        listing_of({"type": "file_list", "file_list": str(listed), "root": f"{http_tree}/images"}, tmp_path)
    listed.write_text("class_000/img_00000.jpg 0\nclass_000/absent.jpg 1\n")
    with pytest.raises(SourceError, match=r"list.txt:2: .*/images/class_000/absent.jpg does not exist"):
        listing_of({"type": "file_list", "file_list": str(listed), "root": f"{http_tree}/images"}, tmp_path)
    listed.write_text("class_000/img_00000.jpg 0\n")
    listing = listing_of({"type": "file_list", "file_list": str(listed), "root": f"{http_tree}/images"}, tmp_path)
    assert listing.paths == (f"{http_tree}/images/class_000/img_00000.jpg",)


def test_a_local_list_naming_urls_without_a_root_at_a_url_says_where_to_put_them(http_tree, tmp_path):
    listed = tmp_path / "list.txt"
    listed.write_text(f"{http_tree}/images/class_000/img_00000.jpg 0\n")
    with pytest.raises(SourceError, match=r"list.txt:1: http://.*img_00000.jpg is a URL, and this list and its root "
                                          r"are local: put the list in the store"):
        listing_of({"type": "file_list", "file_list": str(listed)}, tmp_path)
