"""Hostile inputs and source problems, run on every backend with the same expected behaviour.

* ``on_error: raise`` (default): every batch before the failing one is yielded, then
  :class:`SampleError` names the sample's index, its file and the reason; ``state_dict()`` then
  points at the failing batch.
* ``on_error: skip``: the bad sample is left out of its batch, every skip is recorded in
  ``loader.skipped`` (index, path, epoch, reason) and logged; per epoch every sample is either
  yielded once or recorded once. A batch whose every sample fails is not yielded (warning logged).
* Source problems are refused by ``build_loader`` before any sample is read.
* Breaking out, two loaders at once, deleting a loader mid-epoch: no stray processes or threads.
"""
from __future__ import annotations

import gc
import logging
import os
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch

from tests.helpers.backends import backend_params
from tests.helpers.processes import child_processes, os_threads, settle
from dali_bridge import build_loader
from dali_bridge.errors import SampleError
from dali_bridge.loader.loader import Loader
from dali_bridge.errors import SourceError
from tests.helpers.hostile import (BROKEN_KINDS, BROKEN_REASONS, break_file, make_unreadable, tiny_jpeg,
    write_image_folder)

pytestmark = pytest.mark.slow  # every failure case on each backend, loaders' lifecycle

BACKENDS = backend_params()
BATCH = 4
SIZE = 24


def pipeline(root: Path | None = None, *, on_error: str = "raise", workers: int = 1, shuffle: bool = True,
             source: dict[str, Any] | None = None, **loader: Any) -> dict[str, Any]:
    """A small train pipeline (random crop + flip, uint8 output so pixels compare exactly)."""
    return {"version": 1, "name": "hostile", "source": source or {"type": "folder", "root": str(root)},
            "batch_size": BATCH, "seed": 3,
            "ops": [{"random_resized_crop": {"size": SIZE}}, {"horizontal_flip": {"probability": 0.5}},
                    {"normalize": {"dtype": "uint8"}}],
            "outputs": ["image", "label", "index", "valid"],
            "loader": {"workers": workers, "prefetch": 2, "on_error": on_error, "shuffle": shuffle, **loader}}


def run_epoch(loader: Loader) -> list[dict[str, Any]]:
    """One iteration as host data: per batch, the indices and each sample's image."""
    return [{"index": index.tolist(), "image": image.cpu().clone()} for image, _, index, _ in loader]


def prepare(tmp_path: Path, kind: str, bad: list[int], monkeypatch, *, classes: int = 2,
            per_class: int = 6) -> tuple[list[Path], Callable[[Loader], None]]:
    """A folder with ``kind`` broken files at indices ``bad``; returns the files and a hook to call
    after building the loader (deletes ``deleted_after_listing`` files)."""
    files = write_image_folder(tmp_path / "data", classes, per_class)
    for index in bad:
        break_file(files[index], kind)
        if kind == "unreadable":
            make_unreadable(files[index], monkeypatch)

    def after_listing(loader: Loader) -> None:
        if kind == "deleted_after_listing":
            for index in bad:
                files[index].unlink()

    return files, after_listing


# ---------------------------------------------------------------------------------------------
# Broken files

@pytest.mark.parametrize("kind", BROKEN_KINDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_raise_yields_the_batches_before_the_broken_file_then_names_index_path_and_reason(
        tmp_path, monkeypatch, backend, kind):
    bad = 5
    files, after_listing = prepare(tmp_path, kind, [bad], monkeypatch)
    loader = build_loader(pipeline(tmp_path / "data"), backend)
    after_listing(loader)
    tasks = loader.tasks(0)
    failing = next(task for task in tasks if bad in task.indices)
    seen = []
    with pytest.raises(SampleError) as info:
        for _, _, index, _ in loader:
            seen.append(index.tolist())
    error = info.value
    assert (error.index, error.path) == (bad, str(files[bad]))
    assert error.reason.startswith(BROKEN_REASONS[kind]), error.reason
    assert str(error).startswith(f"sample {bad} ({files[bad]}): {BROKEN_REASONS[kind]}")
    assert seen == [task.indices.tolist() for task in tasks[:failing.number]]
    state = loader.state_dict()
    assert (state["epoch"], state["batch"]) == (0, failing.number)
    loader.close()
    # Replace the file by a good one and restart from the state: the failing batch and the rest follow.
    monkeypatch.undo()
    if files[bad].is_symlink() or files[bad].exists():
        files[bad].unlink()
    files[bad].write_bytes(tiny_jpeg(99))
    restarted = build_loader(pipeline(tmp_path / "data"), backend)
    restarted.load_state_dict(state)
    assert [b["index"] for b in run_epoch(restarted)] == [task.indices.tolist() for task in tasks[failing.number:]]
    restarted.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_skip_leaves_each_broken_file_out_of_its_batch_and_records_every_skip(tmp_path, monkeypatch, caplog,
                                                                              backend):
    # One folder holding every broken kind, next to a clean copy with the same names.
    files = write_image_folder(tmp_path / "data", classes=4, per_class=9)
    clean = tmp_path / "clean"
    shutil.copytree(tmp_path / "data", clean)
    kind_of = {2 + 2 * number: kind for number, kind in enumerate(BROKEN_KINDS)}  # 14 of 36 samples
    for index, kind in kind_of.items():
        break_file(files[index], kind)
        if kind == "unreadable":
            make_unreadable(files[index], monkeypatch)
    caplog.set_level(logging.WARNING, logger="dali_bridge")
    loader = build_loader(pipeline(tmp_path / "data", on_error="skip"), backend)
    reference = build_loader(pipeline(clean), backend)
    for index, kind in kind_of.items():
        if kind == "deleted_after_listing":
            files[index].unlink()
    for epoch in range(2):
        skipped_before = len(loader.skipped)
        batches, clean_batches = run_epoch(loader), run_epoch(reference)
        tasks = loader.tasks(epoch)
        expected = [[i for i in task.indices.tolist() if i not in kind_of] for task in tasks]
        assert [batch["index"] for batch in batches] == [b for b in expected if b]
        # the kept samples' pixels are those of the clean run: skipping shifts no random draw
        clean_images = {i: batch["image"][row] for batch in clean_batches for row, i in enumerate(batch["index"])}
        for batch in batches:
            for row, index in enumerate(batch["index"]):
                assert torch.equal(batch["image"][row], clean_images[index]), f"sample {index} epoch {epoch}"
        skipped = loader.skipped[skipped_before:]
        assert sorted(item.index for item in skipped) == sorted(kind_of)
        assert all(item.epoch == epoch for item in skipped)
        for item in skipped:
            assert item.path == str(files[item.index])
            assert item.reason.startswith(BROKEN_REASONS[kind_of[item.index]]), (kind_of[item.index], item.reason)
        # exactly once: every sample is yielded once or recorded once, never both
        yielded = [i for batch in batches for i in batch["index"]]
        assert Counter(yielded + [item.index for item in skipped]) == Counter(range(len(files)))
    messages = [record.getMessage() for record in caplog.records if record.getMessage().startswith("skipped sample")]
    assert len(messages) == 2 * len(kind_of)
    assert f"skipped sample 2 ({files[2]}) in epoch 1: {BROKEN_REASONS[kind_of[2]]}" in messages
    loader.close()
    reference.close()


def test_skip_gives_the_same_batches_and_records_on_the_cpu_backends(tmp_path, monkeypatch):
    from tests.helpers.backends import CPU_BACKENDS

    if len(CPU_BACKENDS) < 2:
        pytest.skip(f"needs dali-cpu and torchvision; this host has {CPU_BACKENDS}")
    files = write_image_folder(tmp_path / "data", classes=3, per_class=8)
    kinds = ["zero_bytes", "cut_halfway", "bad_huffman_table", "random_bytes", "fifo", "dangling_symlink"]
    for index, kind in zip((1, 4, 9, 10, 17, 23), kinds):
        break_file(files[index], kind)
    results = {}
    for backend in CPU_BACKENDS:
        loader = build_loader(pipeline(tmp_path / "data", on_error="skip"), backend)
        batches = [batch["index"] for epoch in range(2) for batch in run_epoch(loader)]
        results[backend] = (batches, [(s.index, s.path, s.epoch, s.reason) for s in loader.skipped])
        loader.close()
    (batches_a, skipped_a), (batches_b, skipped_b) = results.values()
    assert batches_a == batches_b
    assert sorted(skipped_a) == sorted(skipped_b)
    assert len(skipped_a) == 12


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_batch_whose_every_sample_fails_is_not_yielded_but_counted_and_logged(tmp_path, monkeypatch, caplog,
                                                                              backend):
    files = write_image_folder(tmp_path / "data", classes=2, per_class=5)  # 10 samples: batches 4, 4, 2
    for index, kind in zip(range(4, 8), ("zero_bytes", "cut_halfway", "bad_huffman_table", "fifo")):
        break_file(files[index], kind)
    caplog.set_level(logging.WARNING, logger="dali_bridge")
    loader = build_loader(pipeline(tmp_path / "data", on_error="skip", shuffle=False), backend)
    assert len(loader) == 3  # len() counts planned batches, before any sample is read
    batches = run_epoch(loader)
    assert [batch["index"] for batch in batches] == [[0, 1, 2, 3], [8, 9]]
    assert [item.index for item in loader.skipped] == [4, 5, 6, 7]
    assert loader.state_dict()["batch"] == 0 and loader.epoch == 1  # the epoch counts as finished
    assert any("epoch 0 batch 1: every sample was skipped" in r.getMessage() for r in caplog.records)
    # the next epoch runs normally after the all-skipped batch (DALI never saw it)
    assert [batch["index"] for batch in run_epoch(loader)] == [[0, 1, 2, 3], [8, 9]]
    assert all(batch["image"].shape == (len(batch["index"]), 3, SIZE, SIZE) for batch in batches)
    loader.close()


@pytest.mark.parametrize("backend", [p for p in backend_params(["dali-cpu", "dali"])])
def test_dali_finds_the_culprit_of_a_failed_batch_rebuilds_once_and_remembers_it_until_it_changes(tmp_path, monkeypatch,
                                                                                                   backend):
    import dali_bridge.backends.dali.executor as dali_backend

    files = write_image_folder(tmp_path / "data", classes=2, per_class=6)
    break_file(files[7], "bad_huffman_table")  # passes every header check: only the decoder fails
    builds = []
    real_build = dali_backend.build_pipeline
    monkeypatch.setattr(dali_backend, "build_pipeline", lambda *a, **k: builds.append(1) or real_build(*a, **k))
    loader = build_loader(pipeline(tmp_path / "data", on_error="skip"), backend)
    first = run_epoch(loader)
    failing = next(task for task in loader.tasks(0) if 7 in task.indices)
    assert first[failing.number]["index"] == [i for i in failing.indices.tolist() if i != 7]
    assert len(builds) == 2  # the first build, one rebuild after the failed batch
    run_epoch(loader)
    assert len(builds) == 2  # the culprit is remembered: the next epoch does not fail again
    assert [(s.index, s.epoch, s.reason) for s in loader.skipped] == [
        (7, 0, BROKEN_REASONS["bad_huffman_table"]), (7, 1, BROKEN_REASONS["bad_huffman_table"])]
    files[7].write_bytes(tiny_jpeg(7, 60, 80))  # repaired: read again from the next epoch, as torchvision does
    assert 7 in {i for batch in run_epoch(loader) for i in batch["index"]}
    assert len(loader.skipped) == 2 and len(builds) == 2
    loader.close()
    break_file(files[7], "bad_huffman_table")
    raising = build_loader(pipeline(tmp_path / "data"), backend)
    with pytest.raises(SampleError) as info:
        run_epoch(raising)
    assert info.value.index == 7 and info.value.__cause__ is not None  # DALI's own error is kept as the cause
    raising.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_truncated_jpeg_is_refused_even_when_its_crop_lies_in_the_part_that_is_there(tmp_path, backend):
    # DALI decodes only the crop window (ROI decode) and can stop before a missing tail that
    # libjpeg-turbo's full decode (torchvision) rejects; the shared reader refuses the file first.
    files = write_image_folder(tmp_path / "data", classes=2, per_class=6)
    data = tiny_jpeg(5, 400, 300)
    files[5].write_bytes(data[:int(len(data) * 0.9)])  # ~90% of the rows are still there
    for seed in range(4):  # four loaders, four different small windows, most clear of the missing rows
        spec = pipeline(tmp_path / "data", on_error="skip")
        spec["seed"] = seed
        spec["ops"][0] = {"random_resized_crop": {"size": SIZE, "scale": [0.02, 0.05]}}
        loader = build_loader(spec, backend)
        assert sorted(i for batch in run_epoch(loader) for i in batch["index"]) == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
        assert [item.index for item in loader.skipped] == [5]
        assert loader.skipped[0].reason.startswith("truncated JPEG: no end-of-image marker")
        loader.close()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_an_image_too_thin_for_a_max_size_resize_is_a_sample_error_naming_its_shape(tmp_path, backend, on_error):
    # 256 on the shorter side, capped at 300 on the longer: a 2 x 1000 image would be 0 pixels wide.
    files = write_image_folder(tmp_path / "data", classes=2, per_class=6)
    files[7].write_bytes(tiny_jpeg(7, 2, 1000))
    spec = pipeline(tmp_path / "data", on_error=on_error, shuffle=False)
    spec["ops"] = [{"resize": {"size": 256, "max_size": 300}}, {"center_crop": SIZE}, {"normalize": {"dtype": "uint8"}}]
    loader = build_loader(spec, backend)
    reason = "too thin to resize: shorter side 256 with max_size 300 would make this 2x1000 image 300 pixels long"
    if on_error == "raise":
        with pytest.raises(SampleError) as info:
            run_epoch(loader)
        assert info.value.index == 7 and info.value.path == str(files[7]) and info.value.reason.startswith(reason)
    else:
        assert sorted(i for batch in run_epoch(loader) for i in batch["index"]) == [i for i in range(12) if i != 7]
        assert [item.index for item in loader.skipped] == [7] and loader.skipped[0].reason.startswith(reason)
    loader.close()


def test_check_encoded_skips_exif_thumbnails_when_looking_for_the_end_marker():
    from dali_bridge.errors import ImageError
    from dali_bridge.data.sources.images import check_encoded

    data = tiny_jpeg(1)
    # An APP1 segment holding a thumbnail-like JPEG (its own SOS and EOI) right after SOI.
    thumbnail = b"\xff\xd8\xff\xda\x00\x02\x00\xff\xd9"
    app1 = b"\xff\xe1" + (len(thumbnail) + 8).to_bytes(2, "big") + b"Exif\x00\x00" + thumbnail
    with_thumbnail = data[:2] + app1 + data[2:]
    assert check_encoded(with_thumbnail) == "jpeg"
    assert check_encoded(with_thumbnail + b"\x00" * 64) == "jpeg"  # trailing bytes after EOI are fine
    cut = with_thumbnail[:len(with_thumbnail) // 2]
    with pytest.raises(ImageError, match="no end-of-image marker after the image data"):
        check_encoded(cut)  # the thumbnail's EOI does not count


# ---------------------------------------------------------------------------------------------
# Valid but unusual images: decoded to RGB, the same on every backend

@pytest.fixture(scope="module")
def unusual_root(tmp_path_factory) -> Path:
    """tests/helpers/corpus.py's kinds, plus awkward names and an 8000x6000 JPEG, as one ImageFolder."""
    from tests.helpers.corpus import write_unusual_images
    from tests.helpers.hostile import write_awkward_names, write_large_jpeg

    root = tmp_path_factory.mktemp("unusual")
    write_unusual_images(root)
    write_awkward_names(root / "awkward names")
    (root / "large_8000x6000").mkdir()
    write_large_jpeg(root / "large_8000x6000" / "large 8000x6000.jpg")
    return root


def _reference_rgb(path: str, size: int) -> torch.Tensor:
    """PIL's reading of the file (EXIF orientation applied, 16-bit levels scaled by 1/257) resized
    to size x size with torchvision's antialiased bilinear resize: CHW uint8."""
    from PIL import Image, ImageOps
    from torchvision.transforms.v2 import functional as F

    with Image.open(path) as image:
        image = ImageOps.exif_transpose(image)
        if image.mode.startswith("I"):  # 16-bit grayscale: PIL's convert("RGB") would clip
            gray = np.rint(np.asarray(image, dtype=np.float64) / 257).astype(np.uint8)
            pixels = np.repeat(gray[..., None], 3, axis=-1)
        else:
            pixels = np.asarray(image.convert("RGB"))
    return F.resize(torch.from_numpy(pixels.copy()).permute(2, 0, 1), [size, size], antialias=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unusual_valid_images_decode_to_the_right_rgb_pixels(unusual_root, backend):
    from tests.helpers.corpus import KINDS

    size = 32
    spec = pipeline(unusual_root, shuffle=False)
    spec["ops"] = [{"resize": {"size": [size, size]}}, {"normalize": {"dtype": "uint8"}}]
    loader = build_loader(spec, backend)
    paths = loader.listing.paths
    assert len(paths) == len(KINDS) + 6 + 1 and not loader.listing.ignored
    images = {i: batch["image"][row] for batch in run_epoch(loader) for row, i in enumerate(batch["index"])}
    assert sorted(images) == list(range(len(paths))) and loader.skipped == []
    for index, path in enumerate(paths):
        got, want = images[index].int(), _reference_rgb(path, size).int()
        assert got.shape == (3, size, size)
        # within one level of rounding: a missed EXIF rotation, CMYK inversion or channel mix-up is far off
        assert (got - want).abs().float().mean() < 1.0 and (got - want).abs().max() <= 2, path
    loader.close()


def test_unusual_valid_images_give_the_same_pixels_on_the_cpu_backends(unusual_root):
    from tests.helpers.backends import CPU_BACKENDS

    if len(CPU_BACKENDS) < 2:
        pytest.skip(f"needs dali-cpu and torchvision; this host has {CPU_BACKENDS}")
    outputs = []
    for backend in CPU_BACKENDS:  # the train pipeline: random crops of images smaller than the crop too
        loader = build_loader(pipeline(unusual_root, on_error="skip"), backend)
        outputs.append(run_epoch(loader))
        assert loader.skipped == []
        loader.close()
    first, second = outputs
    assert [b["index"] for b in first] == [b["index"] for b in second]
    for a, b in zip(first, second):
        assert a["image"].shape == b["image"].shape == (len(a["index"]), 3, SIZE, SIZE)
        assert (a["image"].int() - b["image"].int()).abs().max() <= 3  # resampling rounding only


# ---------------------------------------------------------------------------------------------
# Source problems: refused by build_loader before any sample is read

@pytest.mark.parametrize("backend", BACKENDS)
def test_missing_and_empty_roots_are_refused_with_the_folder_named(tmp_path, backend):
    with pytest.raises(SourceError, match=f"source.root: folder {tmp_path / 'absent'} does not exist"):
        build_loader(pipeline(tmp_path / "absent"), backend)
    (tmp_path / "empty").mkdir()
    with pytest.raises(SourceError, match="has no class sub-folders"):
        build_loader(pipeline(tmp_path / "empty"), backend)
    (tmp_path / "file").write_text("x")
    with pytest.raises(SourceError, match="is not a folder"):
        build_loader(pipeline(tmp_path / "file"), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_class_folder_without_images_is_refused_by_name(tmp_path, backend):
    write_image_folder(tmp_path / "data", classes=3, per_class=2)
    for path in (tmp_path / "data" / "class_1").iterdir():
        path.rename(path.with_suffix(".txt"))
    with pytest.raises(SourceError, match=r"class folder\(s\) with no images .*: class_1 —"):
        build_loader(pipeline(tmp_path / "data"), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_image_files_are_ignored_counted_and_logged(tmp_path, caplog, backend):
    files = write_image_folder(tmp_path / "data", classes=2, per_class=3)
    (tmp_path / "data" / "class_0" / "notes.txt").write_text("not an image")
    (tmp_path / "data" / "class_1" / "labels.TXT").write_text("not an image")
    (tmp_path / "data" / "class_1" / "README").write_text("no extension")
    (tmp_path / "data" / "class_1" / "scan.tiff").write_bytes(b"II*\x00")
    caplog.set_level(logging.INFO, logger="dali_bridge")
    loader = build_loader(pipeline(tmp_path / "data", shuffle=False), backend)
    assert loader.listing.ignored == Counter({".txt": 2, "": 1, ".tiff": 1})
    assert list(loader.listing.paths) == [str(path) for path in files]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("6 samples in 2 classes" in m and "4 non-image files ignored ((no extension): 1, .tiff: 1, .txt: 2)"
               in m for m in warnings), warnings
    assert sorted(i for batch in run_epoch(loader) for i in batch["index"]) == list(range(6))
    loader.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_symlinked_files_and_folders_are_followed_and_symlink_loops_are_cut(tmp_path, caplog, backend):
    outside = write_image_folder(tmp_path / "elsewhere", classes=2, per_class=2)
    data = tmp_path / "data"
    write_image_folder(data, classes=1, per_class=2)
    (data / "class_0" / "linked.jpg").symlink_to(outside[0])                 # a linked file
    (data / "class_0" / "nested").symlink_to(tmp_path / "elsewhere" / "class_1", target_is_directory=True)
    (data / "class_0" / "loop").symlink_to(data / "class_0", target_is_directory=True)  # a loop
    (data / "class_9").symlink_to(tmp_path / "elsewhere" / "class_0", target_is_directory=True)  # a linked class
    caplog.set_level(logging.WARNING, logger="dali_bridge")
    loader = build_loader(pipeline(data, shuffle=False), backend)
    relative = [os.path.relpath(path, data) for path in loader.listing.paths]
    assert relative == ["class_0/img_000.jpg", "class_0/img_001.jpg", "class_0/linked.jpg",
                        "class_0/nested/img_000.jpg", "class_0/nested/img_001.jpg",
                        "class_9/img_000.jpg", "class_9/img_001.jpg"]
    assert loader.listing.classes == ("class_0", "class_9")
    assert any("links back to" in r.getMessage() and "a symlink loop" in r.getMessage() for r in caplog.records)
    assert sorted(i for batch in run_epoch(loader) for i in batch["index"]) == list(range(7))
    loader.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_unlistable_subfolder_is_an_error_not_silently_skipped(tmp_path, monkeypatch, backend):
    write_image_folder(tmp_path / "data", classes=2, per_class=2)
    hidden = tmp_path / "data" / "class_1" / "more"
    hidden.mkdir()
    (hidden / "x.jpg").write_bytes(tiny_jpeg(9))
    real_scandir = os.scandir

    def scandir(path="."):  # root ignores permission bits: deny the listing the way the kernel would
        if os.fspath(path) == str(hidden):
            raise PermissionError(13, "Permission denied", str(hidden))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(SourceError, match=f"cannot list folder {hidden}: Permission denied"):
        build_loader(pipeline(tmp_path / "data"), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_file_list_problems_are_all_reported_with_line_numbers_before_anything_runs(tmp_path, backend):
    files = write_image_folder(tmp_path / "data", classes=1, per_class=2)
    listing = tmp_path / "list.txt"
    listing.write_text("# path label\n"
                       f"{files[0]} 0\n"
                       "data/class_0/img_001.jpg 1\n"
                       "data/missing.jpg 0\n"
                       "\n"
                       "no-label-here.jpg\n"
                       "data/class_0/img_000.jpg -1\n"
                       "data/class_0/img_000.jpg one\n", encoding="utf-8")
    with pytest.raises(SourceError) as info:
        build_loader(pipeline(source={"type": "file_list", "file_list": str(listing)}), backend)
    message = str(info.value)
    assert "4 problem(s)" in message
    assert f"{listing}:4: file {tmp_path / 'data' / 'missing.jpg'} does not exist" in message
    assert f"{listing}:6: expected 'path label' with an integer label, found 'no-label-here.jpg'" in message
    assert f"{listing}:7: labels must be >= 0, found -1" in message
    assert f"{listing}:8: expected 'path label'" in message


# ---------------------------------------------------------------------------------------------
# Lifecycle: nothing left behind




def _scenarios(root: Path, backend: str) -> None:
    # 1. break out of an epoch early
    loader = build_loader(pipeline(root, workers=2), backend)
    for number, _ in enumerate(loader):
        if number == 1:
            break
    assert len(run_epoch(loader)) == len(loader)  # the next epoch still runs in full
    loader.close()
    # 2. train and val iterated at once, the val loader finishing first
    train = build_loader(pipeline(root, workers=2), backend)
    val = build_loader(pipeline(root, workers=2, shuffle=False, last_batch="drop"), backend)
    pairs = list(zip(train, val))
    assert len(pairs) == min(len(train), len(val)) == 3
    del pairs, train, val
    # 3. a loader deleted mid-epoch, without close()
    loader = build_loader(pipeline(root, workers=2), backend)
    iterator = iter(loader)
    next(iterator)
    del loader, iterator


@pytest.mark.parametrize("backend", backend_params(["dali-cpu", "dali"]))
def test_a_process_forked_while_failed_dali_loaders_are_garbage_collects_them_without_hanging(tmp_path, backend):
    # A SampleError's traceback keeps the loader's pipeline alive in a reference cycle; a DataLoader
    # worker forked then (any torch DataLoader with workers) used to hang for ever when its garbage
    # collector destroyed that pipeline without DALI's threads.
    import signal

    files = write_image_folder(tmp_path / "data", classes=2, per_class=6)
    break_file(files[5], "zero_bytes")
    gc.collect()
    gc.disable()
    try:
        for _ in range(2):
            loader = build_loader(pipeline(tmp_path / "data"), backend)
            try:
                run_epoch(loader)
            except SampleError as error:
                cycle: list = [error]
                cycle.append(cycle)
            loader.close()
            del loader, cycle
        child = os.fork()
        if child == 0:  # the child: collect the inherited garbage, then leave without any cleanup
            gc.collect()
            os._exit(0)
    finally:
        gc.enable()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        finished, status = os.waitpid(child, os.WNOHANG)
        if finished:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
        pytest.fail("the forked child hung destroying an inherited DALI pipeline")
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_breaking_early_two_loaders_at_once_and_deleting_mid_epoch_leave_no_processes_or_threads(tmp_path,
                                                                                               backend):
    write_image_folder(tmp_path / "data", classes=2, per_class=7)
    before = set(child_processes())  # a loopback server of another folder's fixture is not the loaders'
    _scenarios(tmp_path / "data", backend)  # warm-up: process-wide pools (torch, DALI) are created once
    gc.collect()
    assert settle(lambda: not set(child_processes()) - before), \
        f"child processes left after warm-up: {sorted(set(child_processes()) - before)}"
    threads, python_threads = os_threads(), set(threading.enumerate())
    for _ in range(2):
        _scenarios(tmp_path / "data", backend)
        gc.collect()
    assert settle(lambda: not set(child_processes()) - before), \
        f"child processes left: {sorted(set(child_processes()) - before)}"
    assert settle(lambda: os_threads() <= threads), f"OS threads grew from {threads} to {os_threads()}"
    assert set(threading.enumerate()) <= python_threads, set(threading.enumerate()) - python_threads
