"""Every shard is checked against the converter's manifest, wherever the manifest is found (beside the
shards or named by ``source.manifest``), local or at a URL: listed in it, its size, its sample count,
its labels, and the index it is read through (the sha256 the manifest records). A shard that is not
the one the manifest describes is refused naming it and ``dali-bridge verify``."""
from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest

from dali_bridge.data.sources.webdataset import list_webdataset
from dali_bridge.data.storage.store import ObjectStore
from dali_bridge.errors import SourceError
from dali_bridge.spec.model import DEFAULT_IMAGE_KEYS
from dali_bridge.tools.convert import convert
from tests.helpers.object_storage import SHARDS
from tests.helpers.s3_fixtures import upload_folder

# fixtures, used by name
from tests.helpers.object_storage import private_listing_cache  # noqa: F401
from tests.helpers.s3_fixtures import moto_endpoint  # noqa: F401


@pytest.fixture(scope="module")
def converted(sample_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("manifest-checks")
    convert(sample_root, str(out / "train-%06d.tar"), shard_size=10)
    return out


def _copy(converted: Path, tmp_path: Path) -> Path:
    out = tmp_path / "copy"
    shutil.copytree(converted, out)
    return out


def _relabel_first_sample(shard: Path) -> str:
    """Change the first sample's label in place (same length, same size, the index still right); its key."""
    with tarfile.open(shard) as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith(".cls"))
    with open(shard, "r+b") as handle:
        handle.seek(member.offset_data)
        label = handle.read(member.size)
        handle.seek(member.offset_data)
        handle.write(b"2" if label != b"2" else b"1")
    return member.name.rsplit(".", 1)[0]


def _crlf_index(index: Path) -> None:
    """The same index with CRLF line ends: it reads the same members, but it is not the file the manifest records."""
    index.write_bytes(index.read_bytes().replace(b"\n", b"\r\n"))


def test_a_relabelled_shard_of_the_same_size_and_count_is_refused(converted, tmp_path):
    copy = _copy(converted, tmp_path)
    key = _relabel_first_sample(copy / "train-000001.tar")
    with pytest.raises(SourceError) as caught:
        list_webdataset(str(copy / SHARDS), DEFAULT_IMAGE_KEYS)
    message = str(caught.value)
    assert f"{copy / 'train-000001.tar'}: sample {key} has label" in message
    assert f"the manifest {copy / 'train.manifest.json'} records" in message
    assert f"dali-bridge verify {copy / 'train.manifest.json'}" in message and "1 problem(s)" in message


def test_the_checks_hold_for_a_manifest_named_elsewhere(converted, tmp_path):
    copy = _copy(converted, tmp_path)
    named = tmp_path / "elsewhere" / "set.json"
    named.parent.mkdir()
    shutil.move(copy / "train.manifest.json", named)
    assert len(list_webdataset(str(copy / SHARDS), DEFAULT_IMAGE_KEYS, manifest=str(named)).paths) == 37
    _relabel_first_sample(copy / "train-000002.tar")
    with pytest.raises(SourceError, match=rf"train-000002.tar: sample .* has label .*, the manifest {named} records"):
        list_webdataset(str(copy / SHARDS), DEFAULT_IMAGE_KEYS, manifest=str(named))


def test_an_index_other_than_the_one_the_manifest_records_is_refused(converted, tmp_path):
    copy = _copy(converted, tmp_path)
    _crlf_index(copy / "train-000003.idx")
    with pytest.raises(SourceError, match=r"train-000003.tar: its index train-000003.idx has sha256 [0-9a-f]{64}, "
                                          r"the manifest .* records [0-9a-f]{64}"):
        list_webdataset(str(copy / SHARDS), DEFAULT_IMAGE_KEYS)


def test_a_shard_the_manifest_does_not_list_is_refused(converted, tmp_path):
    copy = _copy(converted, tmp_path)
    shutil.copy(copy / "train-000003.tar", copy / "train-000004.tar")
    with pytest.raises(SourceError, match=r"train-000004.tar: not among the shards the manifest .* records"):
        list_webdataset(str(copy / "train-{000000..000004}.tar"), DEFAULT_IMAGE_KEYS)


def test_a_manifest_of_class_names_only_checks_no_shard(converted, tmp_path):
    named = tmp_path / "names.json"
    named.write_text('{"classes": ["a", "b", "c"]}')
    assert list_webdataset(str(converted / SHARDS), DEFAULT_IMAGE_KEYS, manifest=str(named)).classes == ("a", "b", "c")


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["unlisted", "index"])
@pytest.mark.usefixtures("private_listing_cache")
def test_shards_at_a_url_are_checked_against_the_manifest(converted, tmp_path, request, damage):
    # (Listed from the manifest's labels, a URL's shard is not read at listing: its labels are the
    # index's record; its bytes are checked against the manifest's sha256 when the cache reads it whole.)
    copy = _copy(converted, tmp_path)
    shards = SHARDS
    if damage == "unlisted":
        shutil.copy(copy / "train-000003.tar", copy / "train-000004.tar")
        shutil.copy(copy / "train-000003.idx", copy / "train-000004.idx")
        shards, expected = "train-{000000..000004}.tar", r"train-000004.tar: not among the shards the manifest s3://"
    else:
        _crlf_index(copy / "train-000000.idx")
        expected = r"train-000000.idx: sha256 [0-9a-f]{64} differs from the manifest's [0-9a-f]{64}"
    prefix = upload_folder(request.getfixturevalue("moto_endpoint"), copy, f"checks-{damage}", "train")
    with pytest.raises(SourceError, match=expected):
        list_webdataset(f"{prefix}/{shards}", DEFAULT_IMAGE_KEYS, store=ObjectStore("s3"))
