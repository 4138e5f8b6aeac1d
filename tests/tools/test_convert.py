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

from dali_bridge.cli.main import main
from dali_bridge.cli.options import EXIT_INVALID
from dali_bridge.tools.convert import brace_pattern, convert, verify_shards
from dali_bridge.tools.convert_staging import ConvertError, check_pattern
from dali_bridge.data.shards.tar import index_path, manifest_path
from dali_bridge.errors import SourceError
from dali_bridge.data.sources.webdataset import list_webdataset
from dali_bridge.data.sources.local import list_folder
from dali_bridge.spec.model import DEFAULT_EXTENSIONS, DEFAULT_IMAGE_KEYS


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


def test_verify_names_an_index_whose_bytes_differ_from_the_recorded_digest(sample_root, tmp_path):
    result = convert(sample_root, str(tmp_path / "train-%06d.tar"), shard_size=20)
    index = Path(index_path(result.shards[1]))
    expected = json.loads(Path(result.manifest).read_text())["shards"][1]["index_sha256"]
    index.write_text(index.read_text().replace("jpg", "png", 1))   # a damaged index, the shard intact
    (problem,) = verify_shards(result.manifest)
    assert problem.startswith(f"{index}: sha256 {hashlib.sha256(index.read_bytes()).hexdigest()} differs from "
                              f"the manifest's {expected}: not the index {result.manifest} records")
    assert "convert again to rewrite the shards, their indexes and the manifest together" in problem
    index.unlink()
    (problem,) = verify_shards(result.manifest)
    assert problem.startswith(f"{index}: missing: not the index")


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


def test_an_unreadable_file_is_left_out_and_named_and_no_partial_shard_remains(sample_root, tmp_path):
    root = tmp_path / "images"
    shutil.copytree(sample_root, root)
    victim = sorted(root.rglob("*.jpg"))[25]
    victim.unlink()
    victim.symlink_to(tmp_path / "gone.jpg")  # listed (a name ending .jpg), unreadable
    result = convert(root, str(tmp_path / "out" / "s-%02d.tar"), shard_size=10)
    assert result.samples == 36 and [(path, reason[:16]) for path, reason in result.skipped] == \
        [(str(victim), "cannot read file")]
    assert not list((tmp_path / "out").glob("*.partial"))


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
    assert "2 file(s) missing or different" in out
    (tmp_path / "other.json").write_text('{"name": "not a manifest"}')
    assert main(["verify", str(tmp_path / "other.json")]) == 2
    assert "not a dali-bridge shard manifest" in capsys.readouterr().err
    assert main(["verify", str(tmp_path / "absent.manifest.json")]) == 2


# ---- hostile inputs: only what the loader would read is packed; only what the pattern owns is removed


def _folder_with(tmp_path: Path, sample_root: Path, make) -> tuple[Path, Path]:
    """A one-class folder of two good JPEGs plus ``make(folder)``'s hostile file; (root, hostile path)."""
    root = tmp_path / "images"
    folder = root / "cat"
    folder.mkdir(parents=True)
    for n, good in enumerate(sorted(sample_root.rglob("*.jpg"))[:2]):
        shutil.copy(good, folder / f"good{n}.jpg")
    return root, make(folder)


def _fifo(folder: Path) -> Path:
    os.mkfifo(folder / "pipe.jpg")
    return folder / "pipe.jpg"


def _dev_zero(folder: Path) -> Path:
    (folder / "zero.jpg").symlink_to("/dev/zero")
    return folder / "zero.jpg"


def _text(folder: Path) -> Path:
    (folder / "notes.jpg").write_text("not an image at all\n")
    return folder / "notes.jpg"


def _truncated(folder: Path) -> Path:
    data = (folder / "good0.jpg").read_bytes()
    (folder / "cut.jpg").write_bytes(data[: len(data) // 2])
    return folder / "cut.jpg"


def _directory(folder: Path) -> Path:
    (folder / "dir.jpg").mkdir()
    return folder / "dir.jpg"


@pytest.mark.parametrize("make, reason", [
    (_fifo, "not a regular file (a FIFO)"),
    (_dev_zero, "not a regular file (a device or socket)"),
    (_text, "not a JPEG, PNG or WebP image"),
    (_truncated, "truncated JPEG"),
])
def test_convert_leaves_out_what_the_loader_refuses_and_names_it(sample_root, tmp_path, make, reason):
    root, hostile = _folder_with(tmp_path, sample_root, make)
    result = convert(root, str(tmp_path / "out" / "s-%d.tar"), shard_size=10)
    assert result.samples == 2 and [p for p, _ in result.skipped] == [str(hostile)]
    assert reason in result.skipped[0][1]
    manifest = json.loads(Path(result.manifest).read_text())
    assert manifest["samples"] == 2 and manifest["skipped"] == [{"file": str(hostile), "reason": result.skipped[0][1]}]
    assert [name for name, _ in members(Path(result.shards[0]))] == ["cat/good0.cls", "cat/good0.jpg",
                                                                      "cat/good1.cls", "cat/good1.jpg"]
    assert not list((tmp_path / "out").glob("*.partial"))
    assert len(list_webdataset(result.pattern, DEFAULT_IMAGE_KEYS)) == 2


def test_convert_leaves_out_a_file_over_the_size_limit_without_reading_it(sample_root, tmp_path):
    def sparse(folder: Path) -> Path:
        with open(folder / "huge.jpg", "wb") as handle:
            handle.truncate(1 << 40)  # 1 TiB, sparse: reading it would never end
        return folder / "huge.jpg"

    root, hostile = _folder_with(tmp_path, sample_root, sparse)
    result = convert(root, str(tmp_path / "out" / "s-%d.tar"), max_image_bytes=1 << 20)
    assert result.skipped == ((str(hostile), f"{1 << 40} bytes, over the {1 << 20}-byte limit for one image"),)


def test_convert_of_a_file_list_naming_non_images_packs_only_images(sample_root, tmp_path):
    good = sorted(sample_root.rglob("*.jpg"))[0]
    (tmp_path / "passwd.txt").write_text("root:x:0:0\n")
    (tmp_path / "fake.jpg").write_bytes(b"\xff\xd8\xff" + b"\0" * 100)
    (tmp_path / "list.txt").write_text(f"{good} 0\npasswd.txt 1\nfake.jpg 0\n")
    result = convert(tmp_path / "list.txt", str(tmp_path / "out" / "s-%d.tar"))
    assert result.samples == 1
    assert [p for p, _ in result.skipped] == [str(tmp_path / "passwd.txt"), str(tmp_path / "fake.jpg")]
    (tmp_path / "list.txt").write_text(f"{good} 0\n/dev/zero 1\n")  # not a file: refused when listed
    with pytest.raises(SourceError, match="list.txt:2: file /dev/zero is not a regular file"):
        convert(tmp_path / "list.txt", str(tmp_path / "out2" / "s-%d.tar"))


def test_convert_with_nothing_packable_is_an_error_naming_a_file(tmp_path):
    (tmp_path / "img" / "a").mkdir(parents=True)
    (tmp_path / "img" / "a" / "x.jpg").write_text("text")
    with pytest.raises(ConvertError, match=r"all 1 file\(s\) were left out, e.g. .*x.jpg: not a JPEG"):
        convert(tmp_path / "img", str(tmp_path / "out" / "s-%d.tar"))


def test_cli_convert_reports_the_files_left_out(sample_root, tmp_path, capsys):
    root, hostile = _folder_with(tmp_path, sample_root, _text)
    assert main(["convert", str(root), str(tmp_path / "out" / "s-%d.tar"), "-q"]) == 0
    err = capsys.readouterr().err
    assert "left out 1 file(s)" in err and f"{hostile}: not a JPEG, PNG or WebP image" in err


@pytest.mark.parametrize("unrelated", [["7.tar", "7.idx"], ["2.tar"], ["notes.idx", "3.tar", "9.idx"]])
def test_overwrite_removes_only_what_the_old_manifest_lists_under_the_pattern(sample_root, tmp_path, unrelated):
    out = tmp_path / "out"
    convert(sample_root, str(out / "%d.tar"), shard_size=20)        # 0.tar, 1.tar and their indexes
    for name in unrelated:
        (out / name).write_bytes(b"user data")
    result = convert(sample_root, str(out / "%d.tar"), shard_size=40, overwrite=True)  # one shard now
    assert result.shards == (str(out / "0.tar"),)
    assert not (out / "1.tar").exists() and not (out / "1.idx").exists()   # listed by the old manifest
    assert all((out / name).read_bytes() == b"user data" for name in unrelated)


def test_overwrite_without_a_manifest_replaces_only_the_shards_it_writes(sample_root, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    for name in ("0.tar", "0.idx", "1.tar", "5.tar"):
        (out / name).write_bytes(b"user data")
    convert(sample_root, str(out / "%d.tar"), shard_size=40, overwrite=True)
    assert (out / "0.tar").read_bytes() != b"user data"
    assert all((out / name).read_bytes() == b"user data" for name in ("1.tar", "5.tar"))


@pytest.mark.parametrize("name", ["../outside.tar", "/etc/passwd", "/proc/self/environ", "sub/../../x.tar", "..",
                                  "a\\..\\b.tar"])
def test_verify_refuses_manifest_entries_outside_its_folder(sample_root, tmp_path, capsys, name):
    result = convert(sample_root, str(tmp_path / "out" / "s-%d.tar"), shard_size=40)
    manifest = json.loads(Path(result.manifest).read_text())
    manifest["shards"][0]["file"] = name
    Path(result.manifest).write_text(json.dumps(manifest))
    assert main(["verify", result.manifest]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert "expected the name of a file in the manifest's own folder" in err and "Traceback" not in err


def test_verify_reads_no_more_than_the_recorded_bytes_of_a_linked_file(sample_root, tmp_path):
    result = convert(sample_root, str(tmp_path / "out" / "s-%d.tar"), shard_size=40)
    shard = Path(result.shards[0])
    shard.unlink()
    shard.symlink_to("/dev/zero")
    (problem,) = verify_shards(result.manifest)
    assert problem == f"{shard}: not a regular file"
