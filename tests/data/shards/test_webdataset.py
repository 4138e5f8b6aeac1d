"""WebDataset shards as a source: brace patterns, the spec keys, the shard listing, broken shards,
and the loader contract on shards — the same samples, labels, order and pixels as the folder they
were converted from, on every backend."""
from __future__ import annotations

import io
import os
import pickle
import shutil
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from tests.helpers.backends import backend_params
from tests.helpers.paths import TRAIN
from dali_bridge import build_loader
from dali_bridge.tools.convert import convert
from dali_bridge.errors import ImageError, SampleError
from dali_bridge.util.braces import expand_braces
from dali_bridge.data.shards.tar import ShardSamples, scan_shard, split_member
from dali_bridge.errors import SourceError
from dali_bridge.data.sources.webdataset import list_webdataset
from dali_bridge.data.sources.local import list_folder
from dali_bridge.spec.model import DEFAULT_EXTENSIONS, DEFAULT_IMAGE_KEYS
from dali_bridge.spec.pipeline import load_spec, spec_from_dict
from dali_bridge.spec.problems import SpecError

BACKENDS = backend_params()
SHARD_SIZE = 10  # 37 samples → shards of 10, 10, 10, 7
SIZE = 48


@pytest.fixture(scope="session")
def shard_dir(sample_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 37-image sample set converted to 4 shards with indexes and a manifest."""
    out = tmp_path_factory.mktemp("shards")
    convert(sample_root, str(out / "train-%06d.tar"), shard_size=SHARD_SIZE)
    return out


def pattern(folder: Path) -> str:
    return str(folder / "train-{000000..000003}.tar")


def copy_shards(shard_dir: Path, tmp_path: Path, manifest: bool = True, index: bool = True) -> Path:
    out = tmp_path / "copy"
    out.mkdir()
    for path in shard_dir.iterdir():
        if (path.suffix == ".idx" and not index) or (path.suffix == ".json" and not manifest):
            continue
        shutil.copy2(path, out / path.name)
    return out


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w") as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def jpeg(sample_root: Path, n: int = 0) -> bytes:
    return sorted(sample_root.rglob("*.jpg"))[n].read_bytes()


# ---- brace patterns

@pytest.mark.parametrize("text, expected", [
    ("a-{000..002}.tar", ["a-000.tar", "a-001.tar", "a-002.tar"]),
    ("a-{8..11}.tar", ["a-8.tar", "a-9.tar", "a-10.tar", "a-11.tar"]),
    ("a-{2..0}", ["a-2", "a-1", "a-0"]),
    ("{train,val}-{0..1}", ["train-0", "train-1", "val-0", "val-1"]),
    ("x{a,{b,c}}", ["xa", "xb", "xc"]),
    ("plain.tar", ["plain.tar"]),
])
def test_brace_expansion_gives_bash_order_and_zero_padding(text, expected):
    assert expand_braces(text) == expected


@pytest.mark.parametrize("text, snippet", [
    ("a-{000..002.tar", "unbalanced '{'"),
    ("a-000..002}.tar", "unbalanced '}'"),
    ("a-{0-9}.tar", "neither a range"),
])
def test_malformed_brace_patterns_are_refused_with_the_reason(text, snippet):
    with pytest.raises(ValueError, match=snippet.replace("{", r"\{")):
        expand_braces(text)


def test_member_names_split_at_the_first_dot_of_the_last_component():
    assert split_member("class_0/img.v2/x_1.seg.png") == ("class_0/img.v2/x_1", "seg.png")
    assert split_member("a/b") == ("a/b", "")


# ---- the spec keys

WDS_HEAD = """version: 1
source:
  type: webdataset
  shards: data/train-{000000..000127}.tar
batch_size: 8
ops:
  - center_crop: 32
"""


def test_webdataset_source_defaults_and_resolves_shards_against_the_yaml_folder(tmp_path):
    path = tmp_path / "sub" / "pipe.yaml"
    path.parent.mkdir()
    path.write_text(WDS_HEAD)
    source = load_spec(path).source
    assert source.type == "webdataset"
    assert source.shards == str(tmp_path.resolve() / "sub" / "data" / "train-{000000..000127}.tar")
    assert source.image_keys == ("jpg", "jpeg", "png", "webp")
    assert source.label_key == "cls"
    assert source.manifest is None


def test_webdataset_keys_accept_a_list_or_semicolons_and_round_trip_through_yaml(tmp_path):
    data = yaml.safe_load(WDS_HEAD)
    data["source"].update(image_key="JPG;.png", label_key=".CLS", manifest="shards/train.manifest.json")
    spec = spec_from_dict(data, base_dir=tmp_path)
    assert spec.source.image_keys == ("jpg", "png")
    assert spec.source.label_key == "cls"
    assert spec.source.manifest == str((tmp_path / "shards/train.manifest.json").resolve())
    data["source"]["image_key"] = ["jpg", "png"]
    assert spec_from_dict(data, base_dir=tmp_path).source.image_keys == ("jpg", "png")
    assert spec_from_dict(yaml.safe_load(spec.to_yaml())) == spec


@pytest.mark.parametrize("source, path, snippet", [
    ({"type": "webdataset", "shards": "a-{0..3.tar"}, "source.shards",
     "unbalanced '{' at character 3 of 'a-{0..3.tar'"),
    ({"type": "webdataset", "shards": "a.tar", "image_key": []}, "source.image_key", "found a list []"),
    ({"type": "webdataset", "shards": "a.tar", "label_key": "cls;txt"}, "source.label_key", "one member extension"),
    ({"type": "webdataset", "shards": "a.tar", "label_key": "jpg"}, "source.label_key", "also an image key"),
    ({"type": "webdataset", "shards": "a.tar", "root": "/x"}, "source.root", "unknown key 'root' in a 'webdataset'"),
])
def test_invalid_webdataset_keys_are_reported_at_their_key(source, path, snippet):
    data = yaml.safe_load(WDS_HEAD)
    data["source"] = source
    with pytest.raises(SpecError) as info:
        spec_from_dict(data)
    (problem,) = info.value.problems
    assert problem.path == path and snippet in problem.message


# ---- the listing

def test_shard_listing_has_the_folder_listings_samples_labels_classes_and_bytes(sample_root, shard_dir):
    folder = list_folder(sample_root, DEFAULT_EXTENSIONS)
    shards = list_webdataset(pattern(shard_dir), DEFAULT_IMAGE_KEYS)
    assert len(shards) == len(folder) == 37
    assert shards.labels.tolist() == folder.labels.tolist()
    assert shards.classes == folder.classes == ("class_000", "class_001", "class_002")
    assert [shards.read(i) for i in range(37)] == [folder.read(i) for i in range(37)]
    first = os.path.relpath(folder.paths[0], sample_root)
    assert shards.paths[0] == f"{shard_dir / 'train-000000.tar'}#{first}"
    assert shards.shards.shard.tolist() == [0] * 10 + [1] * 10 + [2] * 10 + [3] * 7


def test_index_files_and_tar_headers_give_the_same_listing(shard_dir):
    for number in range(4):
        path = str(shard_dir / f"train-{number:06d}.tar")
        indexed = scan_shard(path, DEFAULT_IMAGE_KEYS, "cls")
        scanned = scan_shard(path, DEFAULT_IMAGE_KEYS, "cls", use_index=False)
        assert indexed.from_index and not scanned.from_index
        assert (indexed.keys, indexed.offsets, indexed.sizes, indexed.labels) == \
               (scanned.keys, scanned.offsets, scanned.sizes, scanned.labels)


def test_a_shard_changed_after_its_index_is_scanned_not_trusted(shard_dir, tmp_path):
    copy = copy_shards(shard_dir, tmp_path)
    shard = copy / "train-000001.tar"
    os.utime(copy / "train-000001.idx", (1, 1))  # the index predates the shard
    scan = scan_shard(str(shard), DEFAULT_IMAGE_KEYS, "cls")
    assert not scan.from_index and len(scan.keys) == 10


def test_classes_come_from_the_manifest_else_are_the_label_numbers(shard_dir, tmp_path):
    bare = copy_shards(shard_dir, tmp_path, manifest=False)
    assert list_webdataset(pattern(bare), DEFAULT_IMAGE_KEYS).classes == ("0", "1", "2")
    elsewhere = tmp_path / "names.json"
    elsewhere.write_text('{"classes": ["cat", "dog", "owl"]}')
    assert list_webdataset(pattern(bare), DEFAULT_IMAGE_KEYS, manifest=str(elsewhere)).classes == ("cat", "dog", "owl")


def test_a_manifest_whose_counts_disagree_with_the_shards_is_refused(shard_dir, tmp_path):
    copy = copy_shards(shard_dir, tmp_path)
    manifest = copy / "train.manifest.json"
    manifest.write_text(manifest.read_text().replace('"samples": 7', '"samples": 8'))
    with pytest.raises(SourceError, match="train-000003.tar: 7 samples, the manifest .* records 8"):
        list_webdataset(pattern(copy), DEFAULT_IMAGE_KEYS)


def test_a_shard_from_another_conversion_with_the_same_counts_is_refused_naming_verify(shard_dir, sample_root,
                                                                                       tmp_path):
    from tests.helpers.hostile import tiny_jpeg

    changed = tmp_path / "changed"
    shutil.copytree(sample_root, changed)
    first = list_folder(changed, DEFAULT_EXTENSIONS).paths[0]
    Path(first).write_bytes(tiny_jpeg(7, 60, 70))
    convert(changed, str(tmp_path / "other" / "train-%06d.tar"), shard_size=SHARD_SIZE)
    copy = copy_shards(shard_dir, tmp_path)
    shutil.copy2(tmp_path / "other" / "train-000000.tar", copy / "train-000000.tar")
    shutil.copy2(tmp_path / "other" / "train-000000.idx", copy / "train-000000.idx")
    with pytest.raises(SourceError) as info:
        list_webdataset(pattern(copy), DEFAULT_IMAGE_KEYS)
    message = str(info.value)
    manifest = copy / "train.manifest.json"
    assert f"{copy / 'train-000000.tar'}: {(copy / 'train-000000.tar').stat().st_size} bytes, the manifest " \
           f"{manifest} records {(shard_dir / 'train-000000.tar').stat().st_size}" in message
    assert f"dali-bridge verify {manifest}" in message and "1 problem(s)" in message


def test_a_shard_grown_by_trailing_bytes_is_refused(shard_dir, tmp_path):
    copy = copy_shards(shard_dir, tmp_path)
    with open(copy / "train-000002.tar", "ab") as handle:
        handle.write(bytes(10240))  # still a valid tar, same samples
    with pytest.raises(SourceError, match="train-000002.tar: .* bytes, the manifest .* records"):
        list_webdataset(pattern(copy), DEFAULT_IMAGE_KEYS)


def test_missing_shards_are_all_named(shard_dir):
    with pytest.raises(SourceError, match=r"2 of 6 shard\(s\) do not exist: .*train-000004.tar, .*train-000005.tar"):
        list_webdataset(str(shard_dir / "train-{000000..000005}.tar"), DEFAULT_IMAGE_KEYS)


def test_image_key_order_picks_the_member_and_other_members_are_counted_as_ignored(sample_root, tmp_path):
    data = jpeg(sample_root)
    write_tar(tmp_path / "s.tar", [("a.cls", b"1"), ("a.jpg", data), ("a.png", b"not used"), ("a.json", b"{}"),
                                   ("b.cls", b"0"), ("b.png", data)])
    listing = list_webdataset(str(tmp_path / "s.tar"), ("png", "jpg"))
    assert listing.paths == (f"{tmp_path / 's.tar'}#a.png", f"{tmp_path / 's.tar'}#b.png")
    assert listing.labels.tolist() == [1, 0]
    assert listing.ignored == {".jpg": 1, ".json": 1}


# ---- broken shards: listing problems, reported before anything runs

@pytest.mark.parametrize("members, snippet", [
    ([("a.cls", b"0"), ("a.jpg", b"J"), ("b.jpg", b"J")],
     "s.tar: sample b has no label member b.cls (found b.jpg)"),
    ([("a.cls", b"0"), ("b.cls", b"1"), ("b.jpg", b"J")],
     "s.tar: sample a has no image member (expected a.jpg or .png; found a.cls)"),
    ([("a.cls", b"zero"), ("a.jpg", b"J")], "s.tar: a.cls holds 'zero'; expected a non-negative integer"),
    ([("a.cls", b"0"), ("a.jpg", b"J"), ("b.cls", b"0"), ("a.png", b"J")],
     "s.tar: sample key a appears again after other samples"),
])
def test_samples_missing_a_member_or_with_a_bad_label_are_reported_with_shard_and_key(tmp_path, members, snippet):
    write_tar(tmp_path / "s.tar", members)
    with pytest.raises(SourceError) as info:
        list_webdataset(str(tmp_path / "s.tar"), ("jpg", "png"))
    assert snippet in str(info.value)


def test_every_problem_of_every_shard_is_reported_at_once(tmp_path):
    write_tar(tmp_path / "s-0.tar", [("a.jpg", b"J")])
    write_tar(tmp_path / "s-1.tar", [("b.cls", b"0")])
    with pytest.raises(SourceError) as info:
        list_webdataset(str(tmp_path / "s-{0..1}.tar"), ("jpg",))
    text = str(info.value)
    assert "2 problem(s)" in text
    assert "s-0.tar: sample a has no label" in text and "s-1.tar: sample b has no image" in text


def _member_offset(path: Path, name: str) -> tuple[int, int]:
    with tarfile.open(path) as archive:
        info = archive.getmember(name)
        return info.offset, info.offset_data


def test_a_shard_cut_inside_a_header_is_a_listing_problem_naming_the_last_good_member(shard_dir, tmp_path):
    copy = copy_shards(shard_dir, tmp_path, index=False)
    shard = copy / "train-000003.tar"
    keys = scan_shard(str(shard), DEFAULT_IMAGE_KEYS, "cls").keys
    header, _ = _member_offset(shard, f"{keys[4]}.cls")
    os.truncate(shard, header + 300)
    with pytest.raises(SourceError) as info:
        list_webdataset(pattern(copy), DEFAULT_IMAGE_KEYS)
    assert f"train-000003.tar: truncated or damaged tar header at byte {header} after member {keys[3]}.jpg" \
        in str(info.value)


def test_a_shard_cut_between_members_is_a_listing_problem(shard_dir, tmp_path):
    copy = copy_shards(shard_dir, tmp_path, index=False)
    shard = copy / "train-000002.tar"
    keys = scan_shard(str(shard), DEFAULT_IMAGE_KEYS, "cls").keys
    header, _ = _member_offset(shard, f"{keys[6]}.cls")
    os.truncate(shard, header)
    with pytest.raises(SourceError, match=f"train-000002.tar: truncated tar: the file ends at byte {header} "
                                          f"after member {keys[5]}.jpg without the end-of-archive marker"):
        list_webdataset(pattern(copy), DEFAULT_IMAGE_KEYS)


def test_a_shard_cut_inside_an_image_is_refused_naming_the_member_and_the_lost_samples(shard_dir, tmp_path):
    copy = copy_shards(shard_dir, tmp_path)  # with its index: the cut shard must not be trusted to it
    shard = copy / "train-000003.tar"
    scan = scan_shard(str(shard), DEFAULT_IMAGE_KEYS, "cls")
    cut = scan.offsets[4] + 1000
    os.truncate(shard, cut)
    with pytest.raises(SourceError) as info:
        list_webdataset(pattern(copy), DEFAULT_IMAGE_KEYS)
    assert (f"train-000003.tar: truncated tar: the file ends at byte {cut} inside member {scan.image_names[4]} "
            f"({scan.sizes[4]} bytes declared from byte {scan.offsets[4]}); samples after it, if any, are lost"
            ) in str(info.value)
    assert "1 problem(s)" in str(info.value)  # the cut sample's missing members are not reported again


def test_a_shard_cut_inside_a_label_is_refused_naming_the_label_member(shard_dir, tmp_path):
    copy = copy_shards(shard_dir, tmp_path, index=False)
    shard = copy / "train-000003.tar"
    keys = scan_shard(str(shard), DEFAULT_IMAGE_KEYS, "cls").keys
    _, data = _member_offset(shard, f"{keys[6]}.cls")
    os.truncate(shard, data)  # the label's header survives, its payload and the image do not
    with pytest.raises(SourceError, match=f"train-000003.tar: truncated tar: .* inside member {keys[6]}.cls"):
        list_webdataset(pattern(copy), DEFAULT_IMAGE_KEYS)


def test_a_broken_shard_stops_build_loader_before_any_backend_starts(shard_dir, tmp_path):
    copy = copy_shards(shard_dir, tmp_path)
    os.truncate(copy / "train-000001.tar", 5000)
    with pytest.raises(SourceError, match="train-000001.tar"):
        build_loader(TRAIN, "torchvision", overrides={"source": {"type": "webdataset", "shards": pattern(copy)}})


def test_a_shard_cut_after_listing_fails_only_the_reads_past_the_cut(shard_dir, tmp_path):
    copy = copy_shards(shard_dir, tmp_path)
    listing = list_webdataset(pattern(copy), DEFAULT_IMAGE_KEYS)
    shard = copy / "train-000003.tar"
    os.truncate(shard, int(listing.shards.offset[36]) + 100)  # e.g. a copy still in progress
    with pytest.raises(ImageError, match=r"truncated image member: \d+ bytes expected at byte \d+, 100 found"):
        listing.read(36)
    assert listing.read(35)[:2] == b"\xff\xd8"


# ---- a broken image inside a sound shard: its read fails under on_error, like a broken file

@pytest.fixture
def broken_member(sample_root: Path, tmp_path: Path) -> tuple[Path, int, str]:
    """Shards of the sample set where the second half of sample 12's JPEG member was zeroed after
    packing (convert itself leaves out files the loader would refuse)."""
    images = tmp_path / "images"
    shutil.copytree(sample_root, images)
    victim = Path(list_folder(images, DEFAULT_EXTENSIONS).paths[12])
    convert(images, str(tmp_path / "shards" / "train-%06d.tar"), shard_size=SHARD_SIZE)
    shards = list_webdataset(pattern(tmp_path / "shards"), DEFAULT_IMAGE_KEYS).shards
    offset, size = int(shards.offset[12]), int(shards.size[12])
    with open(shards.shards[shards.shard[12]], "r+b") as handle:
        handle.seek(offset + size // 2)
        handle.write(bytes(size - size // 2))
    member = os.path.relpath(victim, images)
    return tmp_path / "shards", 12, f"{tmp_path / 'shards' / 'train-000001.tar'}#{member}"


def shard_overrides(folder: Path, **extra: Any) -> dict[str, Any]:
    base = {"source": {"type": "webdataset", "shards": pattern(folder)}, "batch_size": 5, "loader.workers": 1,
            "outputs": ["image", "label", "index", "valid"], "ops.0.random_resized_crop.size": SIZE}
    base.update(extra)
    return base


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_broken_image_member_raises_a_sample_error_naming_shard_and_member(backend, broken_member):
    folder, index, path = broken_member
    loader = build_loader(TRAIN, backend, overrides=shard_overrides(folder, **{"loader.shuffle": False}))
    with pytest.raises(SampleError) as info:
        for _ in loader:
            pass
    loader.close()
    assert (info.value.index, info.value.path) == (index, path)
    assert info.value.reason.startswith("truncated JPEG")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_broken_image_member_is_skipped_and_counted_under_on_error_skip(backend, broken_member):
    folder, index, path = broken_member
    loader = build_loader(TRAIN, backend, overrides=shard_overrides(folder, **{"loader.on_error": "skip"}))
    seen = [i for _, _, idx, _ in loader for i in idx.tolist()]
    loader.close()
    assert sorted(seen) == [i for i in range(37) if i != index]
    assert [(s.index, s.path) for s in loader.skipped] == [(index, path)]


# ---- the loader contract on shards

def folder_overrides(root: Path, **extra: Any) -> dict[str, Any]:
    base = shard_overrides(root, **extra)
    base["source"] = {"type": "folder", "root": str(root)}
    return base


def batches(loader) -> list[tuple[torch.Tensor, ...]]:
    out = [tuple(t.cpu() for t in batch) for batch in loader]
    loader.close()
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_shards_give_the_folders_batches_pixel_for_pixel(backend, sample_root, shard_dir):
    uint8 = {"ops.2": {"normalize": {"dtype": "uint8", "layout": "HWC"}}}
    for epoch in (0, 1):
        from_folder = build_loader(TRAIN, backend, overrides=folder_overrides(sample_root, **uint8))
        from_shards = build_loader(TRAIN, backend, overrides=shard_overrides(shard_dir, **uint8))
        from_folder.set_epoch(epoch)
        from_shards.set_epoch(epoch)
        a, b = batches(from_folder), batches(from_shards)
        assert len(a) == len(b) == 8
        for (image_a, *rest_a), (image_b, *rest_b) in zip(a, b):
            assert all(torch.equal(x, y) for x, y in zip(rest_a, rest_b))  # labels, indices, valid
            assert torch.equal(image_a, image_b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ranks_read_every_shard_sample_exactly_once_per_epoch(backend, shard_dir):
    seen = []
    for rank in range(3):
        loader = build_loader(TRAIN, backend, overrides=shard_overrides(shard_dir, **{"loader.last_batch": "drop"}),
                              rank=rank, world_size=3)
        seen.extend(i for _, _, idx, _ in batches(loader) for i in idx.tolist())
    assert len(seen) == len(set(seen)) == 30  # 37 samples, 3 ranks × 2 full batches of 5
    assert set(seen) <= set(range(37))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_a_shard_run_resumes_mid_epoch_with_the_same_batches(backend, shard_dir):
    whole = build_loader(TRAIN, backend, overrides=shard_overrides(shard_dir))
    whole.set_epoch(2)
    expected = batches(whole)
    first = build_loader(TRAIN, backend, overrides=shard_overrides(shard_dir))
    first.set_epoch(2)
    iterator = iter(first)
    for _ in range(3):
        next(iterator)
    state = first.state_dict()
    iterator.close()
    first.close()
    resumed = build_loader(TRAIN, backend, overrides=shard_overrides(shard_dir))
    resumed.load_state_dict(state)
    rest = batches(resumed)
    assert len(rest) == len(expected) - 3
    for got, want in zip(rest, expected[3:]):
        assert all(torch.equal(x, y) for x, y in zip(got, want))


def test_torchvision_workers_read_shards_through_forked_descriptors(sample_root, shard_dir):
    uint8 = {"ops.2": {"normalize": {"dtype": "uint8", "layout": "HWC"}}, "loader.workers": 2}
    a = batches(build_loader(TRAIN, "torchvision", overrides=folder_overrides(sample_root, **uint8)))
    b = batches(build_loader(TRAIN, "torchvision", overrides=shard_overrides(shard_dir, **uint8)))
    assert all(torch.equal(x, y) for batch_a, batch_b in zip(a, b) for x, y in zip(batch_a, batch_b))


# ---- positioned reads

def test_shard_samples_survive_pickling_and_a_one_descriptor_cache(shard_dir, monkeypatch):
    import dali_bridge.data.shards.tar as shards_module

    listing = list_webdataset(pattern(shard_dir), DEFAULT_IMAGE_KEYS)
    expected = [listing.read(i) for i in range(37)]
    copy: ShardSamples = pickle.loads(pickle.dumps(listing.shards))
    assert len(copy._open) == 0  # descriptors never cross a pickle
    monkeypatch.setattr(shards_module, "MAX_OPEN_SHARDS", 1)
    order = np.random.default_rng(0).permutation(37)
    assert [copy.read(int(i)) for i in order] == [expected[int(i)] for i in order]
    assert len(copy._open) == 1
    copy.close()
    assert len(copy._open) == 0


def test_dalis_webdataset_reader_reads_the_converters_shards_and_indexes_in_listing_order(shard_dir):
    pytest.importorskip("nvidia.dali", reason="DALI is not installed")
    from nvidia.dali import fn, pipeline_def

    listing = list_webdataset(pattern(shard_dir), DEFAULT_IMAGE_KEYS)
    paths = [str(shard_dir / f"train-{n:06d}.tar") for n in range(4)]

    @pipeline_def(batch_size=37, num_threads=1, device_id=None)
    def reader():
        images, labels = fn.readers.webdataset(paths=paths, index_paths=[p[:-4] + ".idx" for p in paths],
                                               ext=["jpg", "cls"], missing_component_behavior="error",
                                               random_shuffle=False)
        return images, labels

    pipe = reader()
    pipe.build()
    images, labels = pipe.run()
    assert [bytes(np.array(images[i])) for i in range(37)] == [listing.read(i) for i in range(37)]
    assert [int(bytes(np.array(labels[i]))) for i in range(37)] == listing.labels.tolist()
