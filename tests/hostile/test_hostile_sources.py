"""Hostile source descriptions: file lists, labels, brace patterns, manifests and shard indexes end
in a SourceError naming the file and line (or shard and member), in bounded time and memory."""
from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from dali_bridge.cli.main import main
from dali_bridge.cli.options import EXIT_INVALID
from dali_bridge.tools.convert import convert
from dali_bridge.util.braces import MAX_BRACE_NAMES, brace_count, expand_braces
from dali_bridge.data.shards.tar import scan_shard
from dali_bridge.errors import SourceError
from dali_bridge.data.sources.listing import class_bound
from dali_bridge.data.sources.webdataset import list_webdataset
from dali_bridge.data.sources.local import list_file, list_folder
from dali_bridge.spec.model import DEFAULT_EXTENSIONS, DEFAULT_IMAGE_KEYS
from dali_bridge.spec.pipeline import spec_from_dict
from dali_bridge.spec.problems import SpecError
from tests.helpers.hostile import write_image_folder

# ---- file lists

# Child processes import this checkout's package.
_ENV = {**os.environ, "PYTHONPATH": str(REPO)}


@pytest.fixture
def images(tmp_path: Path) -> list[Path]:
    return write_image_folder(tmp_path / "data", classes=2, per_class=2)


def _list(tmp_path: Path, body: bytes) -> Path:
    path = tmp_path / "list.txt"
    path.write_bytes(body)
    return path


def _run_file_list(tmp_path: Path, path: Path) -> int:
    """``dali-bridge run`` of a one-op pipeline over the file list at ``path``: its exit status."""
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(json.dumps({"version": 1, "batch_size": 1, "ops": [{"center_crop": 8}],
                                    "source": {"type": "file_list", "file_list": str(path)},
                                    "backend": "torchvision"}))
    return main(["run", str(pipeline), "--backends", "torchvision", "-q"])


@pytest.mark.parametrize("tail, where", [
    (b"data/class_1/img_000.jpg 1 \xe9\n", ":3:"),                 # Latin-1 in a label field
    (b"data/class_\xff/img_000.jpg 1\n", ":3:"),                    # a path that is not UTF-8
    (b"\xc3\n", ":3:"),                                             # a cut multi-byte sequence
])
def test_a_file_list_that_is_not_utf8_names_its_line(tmp_path, images, tail, where):
    path = _list(tmp_path, b"data/class_0/img_000.jpg 0\ndata/class_0/img_001.jpg 0\n" + tail)
    with pytest.raises(SourceError, match="not UTF-8") as info:
        list_file(path, None, DEFAULT_EXTENSIONS)
    assert f"{path}{where}" in str(info.value)


@pytest.mark.parametrize("label", ["²", "١", "1.0", "0x1", "1e3", "+1", "٣٣"])
def test_labels_that_are_not_ascii_integers_are_reported_by_line(tmp_path, images, label):
    path = _list(tmp_path, f"data/class_0/img_000.jpg 0\ndata/class_0/img_001.jpg {label}\n".encode())
    with pytest.raises(SourceError, match=f"{path}:2: expected 'path label' with an integer label"):
        list_file(path, None, DEFAULT_EXTENSIONS)


@pytest.mark.parametrize("label", [10**9, 10**30, class_bound(2)])
def test_a_label_too_large_to_be_a_class_number_names_its_line(tmp_path, images, label):
    path = _list(tmp_path, f"data/class_0/img_000.jpg 0\n\n# c\ndata/class_0/img_001.jpg {label}\n".encode())
    with pytest.raises(SourceError) as info:
        list_file(path, None, DEFAULT_EXTENSIONS)
    assert f"{path}:4: label {label} is not a class number" in str(info.value)
    assert f"{class_bound(2):,} classes" in str(info.value)


def test_labels_up_to_the_bound_make_that_many_classes(tmp_path, images):
    last = class_bound(2) - 1
    path = _list(tmp_path, f"data/class_0/img_000.jpg 0\ndata/class_0/img_001.jpg {last}\n".encode())
    assert len(list_file(path, None, DEFAULT_EXTENSIONS).classes) == last + 1


def test_cli_exits_2_on_a_file_list_that_is_not_utf8(tmp_path, images, capsys):
    path = _list(tmp_path, b"data/class_0/img_000.jpg \xff\n")
    assert _run_file_list(tmp_path, path) == EXIT_INVALID
    err = capsys.readouterr().err
    assert f"{path}:1:" in err and "Traceback" not in err


def test_a_byte_order_mark_before_the_first_line_is_not_part_of_its_path(tmp_path, images):
    path = _list(tmp_path, "\ufeffdata/class_0/img_000.jpg 0\ndata/class_1/img_000.jpg 1\n".encode())
    listing = list_file(path, None, DEFAULT_EXTENSIONS)
    assert listing.paths == (str(tmp_path / "data/class_0/img_000.jpg"), str(tmp_path / "data/class_1/img_000.jpg"))


def test_a_path_component_over_255_bytes_is_a_positioned_problem_exit_2(tmp_path, images, capsys):
    path = _list(tmp_path, f"data/class_0/img_000.jpg 0\ndata/{'x' * 300}.jpg 1\n".encode())
    with pytest.raises(SourceError) as info:
        list_file(path, None, DEFAULT_EXTENSIONS)
    assert f"{path}:2: file " in str(info.value) and "cannot be read: File name too long" in str(info.value)
    assert _run_file_list(tmp_path, path) == EXIT_INVALID
    err = capsys.readouterr().err
    assert f"{path}:2:" in err and "Traceback" not in err


@pytest.mark.slow
def test_a_huge_path_line_is_reported_shortened(tmp_path, images):
    path = _list(tmp_path, b"data/class_0/img_000.jpg 0\n" + b"y" * (20 << 20) + b".jpg 1\n")
    with pytest.raises(SourceError) as info:
        list_file(path, None, DEFAULT_EXTENSIONS)
    assert f"{path}:2: file " in str(info.value) and len(str(info.value)) < 2000


# ---- folders: class-folder links


def test_a_class_folder_link_to_itself_is_refused_by_name(tmp_path, images):
    loop = tmp_path / "data" / "loop"
    os.symlink("loop", loop)
    with pytest.raises(SourceError) as info:
        list_folder(tmp_path / "data", DEFAULT_EXTENSIONS)
    assert f"cannot follow {loop}: Too many levels of symbolic links" in str(info.value)


@pytest.mark.parametrize("target", [".", ".."])
def test_a_class_folder_linking_to_the_root_or_above_is_refused_not_listed_twice(tmp_path, images, target):
    link = tmp_path / "data" / "zzz_all"
    os.symlink(os.path.abspath(tmp_path / "data" / target), link)
    with pytest.raises(SourceError) as info:
        list_folder(tmp_path / "data", DEFAULT_EXTENSIONS)
    assert f"class folder {link} links to" in str(info.value) and "holds the root itself" in str(info.value)


def test_a_class_folder_linking_elsewhere_is_still_followed(tmp_path, images):
    other = write_image_folder(tmp_path / "other", classes=1, per_class=3)
    os.symlink(other[0].parent, tmp_path / "data" / "linked")
    listing = list_folder(tmp_path / "data", DEFAULT_EXTENSIONS)
    assert listing.classes == ("class_0", "class_1", "linked") and len(listing) == 7


# ---- brace patterns


@pytest.mark.parametrize("pattern, count", [
    ("x-{0..999999999}.tar", 10**9),
    ("x-{000000..999999}-{0..9}.tar", 10**7),
    ("{a,b}" * 40, 2**40),
    ("x{0..99999999999999999999}", 10**20),
])
def test_brace_patterns_too_large_are_refused_with_their_count_before_expanding(pattern, count):
    assert brace_count(pattern) == count
    with pytest.raises(ValueError, match=f"makes {count:,} names; at most {MAX_BRACE_NAMES:,}"):
        expand_braces(pattern)


@pytest.mark.parametrize("pattern", ["a{0..9}{x,{y,z}}b{00..11}", "{a,b}-{0..2}", "x-{7..3}", "s{1,2,3}{4,5}"])
def test_brace_count_matches_the_expansion(pattern):
    assert brace_count(pattern) == len(expand_braces(pattern))


def test_many_brace_groups_are_refused_not_a_recursion_error():
    with pytest.raises(ValueError, match="brace groups"):
        expand_braces("{0..0}" * 5000)


@pytest.mark.slow
def test_validate_of_a_huge_brace_pattern_is_a_problem_in_bounded_memory(tmp_path):
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text("version: 1\nbatch_size: 1\nops: [center_crop: 8]\n"
                        "source: {type: webdataset, shards: 'x-{0..999999999}.tar'}\n")
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30));"
            "from dali_bridge.cli.main import main; sys.exit(main(['validate', sys.argv[1]]))")
    done = subprocess.run([sys.executable, "-c", code, str(pipeline)], capture_output=True, text=True,
                          timeout=120, env=_ENV)
    assert done.returncode == EXIT_INVALID and "makes 1,000,000,000 names" in done.stderr, done.stderr[-2000:]


def test_spec_reports_a_huge_brace_pattern_as_a_problem():
    with pytest.raises(SpecError, match="source.shards: .*makes 1,000,000 names"):
        spec_from_dict({"version": 1, "batch_size": 1, "ops": [{"center_crop": 8}],
                        "source": {"type": "webdataset", "shards": "/x/s-{000000..999999}.tar"}})


# ---- shards, indexes and manifests


@pytest.fixture
def shards(images: list[Path], tmp_path: Path) -> Path:
    out = tmp_path / "shards"
    convert(images[0].parent.parent, str(out / "s-%02d.tar"), shard_size=2)
    return out


def _pattern(folder: Path) -> str:
    return str(folder / "s-{00..01}.tar")


def _index_lines(folder: Path, shard: int = 0) -> tuple[Path, list[str]]:
    path = folder / f"s-{shard:02d}.idx"
    return path, path.read_text().splitlines()


def _rewrite_index(path: Path, header: str, lines: list[str]) -> None:
    path.write_text(header + "\n" + "\n".join(lines) + "\n")
    os.utime(path, (2**31, 2**31))  # newer than the shard: the index is used, not skipped as stale


def _swap(line: str, a: int, b: int) -> str:
    fields = line.split(" ")
    fields[a], fields[b] = fields[b], fields[a]
    return " ".join(fields)


def _index_variants() -> list:
    def negative(lines):  # a negative size
        fields = lines[0].split(" ")
        fields[6] = "-" + fields[6]
        return [" ".join(fields)] + lines[1:]

    def swapped(lines):  # two samples' image offsets exchanged (labels follow the wrong images)
        a, b = lines[0].split(" "), lines[1].split(" ")
        a[5], b[5] = b[5], a[5]
        a[6], b[6] = b[6], a[6]
        return [" ".join(a), " ".join(b)]

    def aliased(lines):  # both samples point at the first image
        a, b = lines[0].split(" "), lines[1].split(" ")
        b[5], b[6] = a[5], a[6]
        return [" ".join(a), " ".join(b)]

    def shifted(lines):  # an offset a few bytes off
        fields = lines[1].split(" ")
        fields[5] = str(int(fields[5]) + 8)
        return [lines[0], " ".join(fields)]

    return [pytest.param(negative, "expected non-negative integers", id="negative-size"),
            pytest.param(swapped, "disagrees with s-00.tar", id="swapped"),
            pytest.param(aliased, "disagrees with s-00.tar", id="aliased"),
            pytest.param(shifted, "disagrees with s-00.tar", id="shifted")]


@pytest.mark.parametrize("edit, message", _index_variants())
def test_an_index_that_disagrees_with_its_shard_is_refused_naming_both(shards, edit, message):
    path, lines = _index_lines(shards)
    _rewrite_index(path, lines[0], edit(lines[1:]))
    with pytest.raises(SourceError, match="s-00.idx") as info:
        list_webdataset(_pattern(shards), DEFAULT_IMAGE_KEYS)
    assert message in str(info.value)


@pytest.mark.parametrize("drop", [0, 1])
def test_an_index_missing_a_line_is_refused(shards, drop):
    path, lines = _index_lines(shards)
    kept = [line for n, line in enumerate(lines[1:]) if n != drop]
    _rewrite_index(path, f"v1.2 {len(kept)}", kept)
    with pytest.raises(SourceError, match="s-00.idx disagrees with s-00.tar: member .* missing from the index"):
        list_webdataset(_pattern(shards), DEFAULT_IMAGE_KEYS)


def test_a_consistent_index_lists_what_the_tar_scan_lists(shards):
    for shard in sorted(shards.glob("*.tar")):
        indexed = scan_shard(str(shard), DEFAULT_IMAGE_KEYS, "cls")
        scanned = scan_shard(str(shard), DEFAULT_IMAGE_KEYS, "cls", use_index=False)
        assert indexed.from_index and not indexed.problems
        assert (indexed.keys, indexed.offsets, indexed.labels) == (scanned.keys, scanned.offsets, scanned.labels)


def _tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("members", [
    [("a.cls", b"0"), ("a.jpg", b"x"), ("a.jpg", b"y")],            # the same member twice
    [("a.cls", b"0"), ("a.jpg", b"x"), ("a.JPG", b"y")],            # extensions differing in case
    [("a.cls", b"0"), ("a.cls", b"1"), ("a.jpg", b"x")],            # two labels
])
def test_duplicate_members_of_a_sample_are_refused_not_dropped(tmp_path, members):
    _tar(tmp_path / "d-0.tar", members)
    with pytest.raises(SourceError, match="d-0.tar: sample a has 3 members for 2 extensions"):
        list_webdataset(str(tmp_path / "d-{0..0}.tar"), DEFAULT_IMAGE_KEYS)


@pytest.mark.parametrize("label", [b"\xc2\xb2", b"99999999999999999999999", b"1" * 100])
def test_shard_labels_that_are_not_class_numbers_are_refused(tmp_path, label):
    _tar(tmp_path / "d-0.tar", [("a.cls", b"0"), ("a.jpg", b"x"), ("b.cls", label), ("b.jpg", b"y")])
    with pytest.raises(SourceError, match=r"d-0.tar: (b\.cls|label member b\.cls|b\.jpg: label)"):
        list_webdataset(str(tmp_path / "d-{0..0}.tar"), DEFAULT_IMAGE_KEYS)


@pytest.mark.parametrize("body, message", [
    (b'{"classes": ["a", "\xff"]}', "not UTF-8"),
    (b'{"classes": ["a"], "shards": [1, 2]}', "'shards' entry"),
    (b'{"classes": ["a"], "shards": {"file": "x"}}', "'shards' entry"),
    (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
])
def test_a_hostile_manifest_is_a_source_error(shards, body, message):
    (shards / "s.manifest.json").write_bytes(body)
    with pytest.raises(SourceError, match=message):
        list_webdataset(_pattern(shards), DEFAULT_IMAGE_KEYS)


def test_verify_exits_2_on_a_manifest_that_is_not_utf8(shards, capsys):
    manifest = shards / "s.manifest.json"
    manifest.write_bytes(manifest.read_bytes().replace(b'"classes"', b'"cl\xffasses"'))
    assert main(["verify", str(manifest)]) == EXIT_INVALID
    assert "not UTF-8" in capsys.readouterr().err


def test_an_index_used_by_a_copied_folder_still_matches(shards, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(shards, copy)
    assert len(list_webdataset(_pattern(copy), DEFAULT_IMAGE_KEYS)) == 4


@pytest.mark.parametrize("stem", ["n" * 150, "é" * 20, "deep/" * 30 + "x"])
def test_an_index_of_long_or_non_ascii_names_agrees_with_its_shard(tmp_path, images, stem):
    """Names beyond the header's 100-byte field (or not ASCII) sit in pax records before the header."""
    root = tmp_path / "long"
    target = root / "cat" / f"{stem}.jpg"
    target.parent.mkdir(parents=True)
    shutil.copy(images[0], target)
    out = tmp_path / "long-shards"
    convert(root, str(out / "s-%d.tar"))
    scan = scan_shard(str(out / "s-0.tar"), DEFAULT_IMAGE_KEYS, "cls")
    assert scan.from_index and not scan.problems and scan.keys == [f"cat/{stem}"]


def _gnu_tar_with_wds2idx_index(tmp_path: Path, images: list[Path], long_name: bool) -> Path:
    """A GNU-format tar holding a folder entry, a hidden file and two samples, indexed by DALI's wds2idx."""
    wds2idx = pytest.importorskip("wds2idx", reason="DALI's wds2idx tool is not installed")
    if shutil.which("tar") is None:
        pytest.skip("wds2idx needs GNU tar to list block numbers")
    shard = tmp_path / "g-0.tar"
    second = "d/" + ("L" * 120 if long_name else "b")
    with tarfile.open(shard, "w", format=tarfile.GNU_FORMAT) as archive:
        folder = tarfile.TarInfo("d")
        folder.type = tarfile.DIRTYPE
        archive.addfile(folder)
        for name, data in [("d/.hidden.txt", b"x"), ("d/a.cls", b"0"), ("d/a.jpg", images[0].read_bytes()),
                           (second + ".cls", b"1"), (second + ".jpg", images[1].read_bytes())]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    with wds2idx.IndexCreator(str(shard), str(tmp_path / "g-0.idx"), verbose=False) as creator:
        creator.create_index()
    return shard


def test_an_index_by_dalis_wds2idx_of_a_tar_with_folders_and_hidden_files_is_used(tmp_path, images):
    """wds2idx leaves folders and hidden files out of its index: such gaps are not missing samples."""
    shard = _gnu_tar_with_wds2idx_index(tmp_path, images, long_name=False)
    scan = scan_shard(str(shard), DEFAULT_IMAGE_KEYS, "cls")
    assert scan.from_index and not scan.problems and scan.labels == [0, 1]


def test_a_wds2idx_index_pointing_at_a_gnu_long_name_record_is_refused(tmp_path, images):
    """For a name over 100 bytes in GNU format, wds2idx records where the long-name record's data
    starts, not the member's: trusting it would read the name as the label and image."""
    shard = _gnu_tar_with_wds2idx_index(tmp_path, images, long_name=True)
    scan = scan_shard(str(shard), DEFAULT_IMAGE_KEYS, "cls")
    assert len(scan.problems) == 1 and "g-0.idx disagrees with g-0.tar" in scan.problems[0]
    assert "where the tar holds ././@LongLink" in scan.problems[0]
    scanned = scan_shard(str(shard), DEFAULT_IMAGE_KEYS, "cls", use_index=False)  # the tar itself is sound
    assert not scanned.problems and scanned.labels == [0, 1]
