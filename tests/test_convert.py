"""``dali-bridge convert``: an image folder or file list packed into shards without re-encoding,
with DALI index files, a manifest, refusal to overwrite, and clean failure."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from dali_bridge.cli import EXIT_INVALID, main
from dali_bridge.convert import ConvertError, brace_pattern, check_pattern, convert, verify_shards
from dali_bridge.shards import manifest_path
from dali_bridge.sources import list_folder, list_webdataset
from dali_bridge.spec import DEFAULT_EXTENSIONS, DEFAULT_IMAGE_KEYS


def members(path: Path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as archive:
        return [(m.name, archive.extractfile(m).read()) for m in archive]


def test_convert_writes_the_folder_in_listing_order_as_label_then_original_bytes(sample_root, tmp_path):
    result = convert(sample_root, str(tmp_path / "out" / "train-%06d.tar"), shard_size=16)
    assert result.shards == tuple(str(tmp_path / "out" / f"train-{n:06d}.tar") for n in range(3))
    assert result.samples == 37 and result.pattern == str(tmp_path / "out" / "train-{000000..000002}.tar")
    folder = list_folder(sample_root, DEFAULT_EXTENSIONS)
    written = [m for shard in result.shards for m in members(Path(shard))]
    expected = []
    for path, label in zip(folder.paths, folder.labels.tolist()):
        key = os.path.splitext(os.path.relpath(path, sample_root))[0]
        expected += [(f"{key}.cls", str(label).encode()), (f"{key}.jpg", Path(path).read_bytes())]
    assert written == expected
    assert [len(members(Path(s))) // 2 for s in result.shards] == [16, 16, 5]


def test_the_manifest_records_counts_classes_labels_and_each_shards_sha256(sample_root, tmp_path):
    result = convert(sample_root, str(tmp_path / "train-%04d.tar"), shard_size=20)
    assert result.manifest == str(tmp_path / "train.manifest.json")
    manifest = json.loads(Path(result.manifest).read_text())
    assert manifest["samples"] == 37 and manifest["shard_size"] == 20
    assert manifest["shards_pattern"] == "train-{0000..0001}.tar"
    assert manifest["classes"] == ["class_000", "class_001", "class_002"]
    assert manifest["label_mapping"] == {"class_000": 0, "class_001": 1, "class_002": 2}
    folder = list_folder(sample_root, DEFAULT_EXTENSIONS)
    assert list(manifest["class_counts"].values()) == [folder.labels.tolist().count(c) for c in range(3)]
    assert manifest["image_extensions"] == {"jpg": 37}
    for entry, shard in zip(manifest["shards"], result.shards):
        data = Path(shard).read_bytes()
        assert entry["file"] == os.path.basename(shard) and entry["bytes"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
    assert [(e["samples"], e["first_sample"]) for e in manifest["shards"]] == [(20, 0), (17, 20)]
    assert verify_shards(result.manifest) == []


def test_verify_names_a_shard_whose_bytes_changed(sample_root, tmp_path):
    result = convert(sample_root, str(tmp_path / "train-%06d.tar"), shard_size=20)
    shard = Path(result.shards[1])
    data = bytearray(shard.read_bytes())
    data[3000] ^= 0xFF
    shard.write_bytes(bytes(data))
    (problem,) = verify_shards(result.manifest)
    assert problem.startswith(f"{shard}: sha256 ") and "differs from the manifest's" in problem


def test_conversion_is_byte_for_byte_reproducible(sample_root, tmp_path):
    first = convert(sample_root, str(tmp_path / "a" / "s-%03d.tar"), shard_size=10)
    second = convert(sample_root, str(tmp_path / "b" / "s-%03d.tar"), shard_size=10)
    sums = [[e["sha256"] for e in json.loads(Path(r.manifest).read_text())["shards"]] for r in (first, second)]
    assert sums[0] == sums[1] and len(sums[0]) == 4


def test_the_index_files_equal_what_dalis_wds2idx_writes(sample_root, tmp_path):
    wds2idx = pytest.importorskip("wds2idx", reason="DALI's wds2idx tool is not installed")
    if shutil.which("tar") is None:
        pytest.skip("wds2idx needs GNU tar to list block numbers")
    result = convert(sample_root, str(tmp_path / "train-%06d.tar"), shard_size=20)
    for shard in result.shards:
        reference = tmp_path / "reference.idx"
        with wds2idx.IndexCreator(shard, str(reference), verbose=False) as creator:
            creator.create_index()
        assert Path(shard[:-4] + ".idx").read_text() == reference.read_text()


def test_convert_refuses_existing_output_and_overwrite_removes_stale_higher_shards(sample_root, tmp_path):
    out = str(tmp_path / "train-%06d.tar")
    convert(sample_root, out, shard_size=10)
    with pytest.raises(ConvertError, match=r"output exists: .*train-000000.tar.* \(pass --overwrite to replace it\)"):
        convert(sample_root, out, shard_size=10)
    result = convert(sample_root, out, shard_size=20, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train-000000.idx", "train-000000.tar", "train-000001.idx",
                                                           "train-000001.tar", "train.manifest.json"]
    assert len(list_webdataset(result.pattern, DEFAULT_IMAGE_KEYS)) == 37


def test_a_file_list_source_keeps_png_extensions_and_the_lists_labels(sample_root, tmp_path):
    from PIL import Image

    Image.new("RGB", (20, 10), (200, 30, 30)).save(tmp_path / "red.png")
    jpg = sorted(sample_root.rglob("*.jpg"))[0]
    (tmp_path / "list.txt").write_text(f"red.png 4\n{jpg} 2\n")
    result = convert(tmp_path / "list.txt", str(tmp_path / "s" / "x-%d.tar"), shard_size=5)
    assert [name for name, _ in members(Path(result.shards[0]))] == \
           ["red.cls", "red.png", "sample_00000001.cls", "sample_00000001.jpg"]
    listing = list_webdataset(result.pattern, DEFAULT_IMAGE_KEYS)
    assert listing.labels.tolist() == [4, 2]
    assert listing.classes == ("0", "1", "2", "3", "4")
    assert listing.read(0) == (tmp_path / "red.png").read_bytes()


def test_files_whose_keys_collide_are_named_and_nothing_is_written(sample_root, tmp_path):
    root = tmp_path / "images" / "cat"
    root.mkdir(parents=True)
    data = sorted(sample_root.rglob("*.jpg"))[0].read_bytes()
    (root / "a.b.jpg").write_bytes(data)
    (root / "a_b.jpg").write_bytes(data)
    with pytest.raises(ConvertError, match=r"a_b.jpg and .*a.b.jpg map to the same shard key 'cat/a_b'"):
        convert(tmp_path / "images", str(tmp_path / "out" / "s-%d.tar"))
    assert not (tmp_path / "out").exists()


def test_an_unreadable_file_stops_the_conversion_without_leaving_a_partial_shard(sample_root, tmp_path):
    root = tmp_path / "images"
    shutil.copytree(sample_root, root)
    victim = sorted(root.rglob("*.jpg"))[25]
    victim.unlink()
    victim.symlink_to(tmp_path / "gone.jpg")  # listed (a name ending .jpg), unreadable
    with pytest.raises(ConvertError, match=f"cannot read {victim}"):
        convert(root, str(tmp_path / "out" / "s-%02d.tar"), shard_size=10)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["s-00.idx", "s-00.tar", "s-01.idx", "s-01.tar"]


@pytest.mark.parametrize("text, snippet", [
    ("shards/train.tar", "exactly one shard-number directive"),
    ("shards/train-%06d-%06d.tar", "exactly one shard-number directive"),
    ("shards/train-%s.tar", "exactly one shard-number directive"),
    ("shards/train-%6d.tar", "pad the shard number with zeros"),
    ("shards/train-%06d.tgz", "ending in .tar"),
])
def test_bad_output_patterns_are_refused(text, snippet):
    with pytest.raises(ConvertError, match=snippet):
        check_pattern(text)


def test_patterns_map_to_brace_patterns_and_manifest_names():
    assert brace_pattern("d/train-%06d.tar", 128) == "d/train-{000000..000127}.tar"
    assert brace_pattern("d/%d.tar", 3) == "d/{0..2}.tar"
    assert manifest_path("d/train-%06d.tar") == manifest_path("d/train-{000000..000127}.tar") == \
        "d/train.manifest.json"
    assert manifest_path("d/%06d.tar") == "d/manifest.json"


def test_cli_convert_prints_the_pipeline_source_and_refuses_to_overwrite(sample_root, tmp_path, capsys):
    out = str(tmp_path / "train-%06d.tar")
    assert main(["convert", str(sample_root), out, "--shard-size", "20", "-q"]) == 0
    printed = capsys.readouterr().out
    assert "wrote 2 shard(s), 37 samples" in printed
    assert f'source: {{type: webdataset, shards: "{tmp_path}/train-{{000000..000001}}.tar"}}' in printed
    assert main(["convert", str(sample_root), out, "-q"]) == EXIT_INVALID
    assert "pass --overwrite to replace it" in capsys.readouterr().err


def test_cli_verify_checks_shards_by_manifest_or_pattern_and_exits_1_naming_a_bad_one(sample_root, tmp_path,
                                                                                     capsys):
    result = convert(sample_root, str(tmp_path / "train-%06d.tar"), shard_size=20)
    assert main(["verify", str(tmp_path / "train-%06d.tar")]) == 0
    assert "every shard matches its recorded size and sha256" in capsys.readouterr().out
    Path(result.shards[0]).unlink()
    shard = Path(result.shards[1])
    shard.write_bytes(shard.read_bytes()[:-512])
    assert main(["verify", result.manifest]) == 1
    out = capsys.readouterr().out
    assert f"{result.shards[0]}: missing" in out and f"{shard}: " in out and "the manifest records" in out
    assert "2 shard(s) missing or different" in out
    (tmp_path / "other.json").write_text('{"name": "not a manifest"}')
    assert main(["verify", str(tmp_path / "other.json")]) == 2
    assert "not a dali-bridge shard manifest" in capsys.readouterr().err
    assert main(["verify", str(tmp_path / "absent.manifest.json")]) == 2
