"""Fuzzing both backends' decode paths with mutated JPEGs, PNGs and WebPs.

Every mutated file (:func:`hostile.mutated_images`: bit flips, cuts, overwritten bytes, edited
chunk/segment lengths, PNG chunks changed behind a recomputed CRC or recompressed image data) must
be refused by the shared check, or decoded by both decoders to the same pixels, or refused by
both — never crash the process, never decode on one backend only. The decoding runs in a
subprocess (``fuzz_decode_worker.py``): torchvision's PNG decoder kills the process on damage,
and a regression must show as a failing test, not a dead pytest.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.backends import CPU_BACKENDS
from tests.helpers.hostile import mutated_images, tiny_jpeg
from tests.helpers.fuzz import crashed, run_worker

pytestmark = pytest.mark.slow  # decodes thousands of mutated images in child processes

FILES = 600  # 200 of each format: ~8 s with both decoders


def test_mutated_images_never_crash_a_decoder_and_both_decoders_agree_on_each(tmp_path):
    report = tmp_path / "decoders.json"
    result = run_worker("decoders", str(FILES), "11", str(report))
    assert result.returncode == 0, crashed(result, report.with_suffix(".current"))
    outcomes = json.loads(report.read_text())
    assert len(outcomes) == FILES
    disagreements = []
    tally: Counter = Counter()
    for item in outcomes:
        if item["check"] != "ok":
            tally[item["format"], "refused by the check"] += 1
            continue
        torchvision, dali = item["torchvision"], item["dali"]
        if torchvision is None and dali is None:
            tally[item["format"], "refused by both decoders"] += 1
        elif torchvision is None or dali is None or torchvision != dali or item["max_difference"] > 1:
            disagreements.append(item)
        else:
            tally[item["format"], "decoded alike"] += 1
    assert not disagreements, f"decoders disagree on {len(disagreements)} checked file(s): {disagreements[:5]}"
    # The fuzz reaches the decoders: some damaged files pass the check and decode, in every format.
    for format in ("jpeg", "png", "webp"):
        assert tally[format, "refused by the check"] > 0 and tally[format, "decoded alike"] > 0, tally


def _mutated_folder(root: Path, per_format: int, seed: int) -> int:
    """A two-class folder of mutated images (each under the extension of its format) and some intact
    JPEGs; returns the number of files."""
    count = 0
    for number, (format, _, data) in enumerate(mutated_images(3 * per_format, seed)):
        folder = root / f"class_{number % 2}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{number:04d}.{ {'jpeg': 'jpg'}.get(format, format)}").write_bytes(data)
        count += 1
    for number in range(6):
        (root / f"class_{number % 2}" / f"intact_{number}.jpg").write_bytes(tiny_jpeg(number))
        count += 1
    return count


def _pipeline(root: Path, *, workers: int) -> dict:
    return {"version": 1, "name": "fuzz", "source": {"type": "folder", "root": str(root)}, "batch_size": 8,
            "seed": 5, "ops": [{"random_resized_crop": {"size": 16}}, {"normalize": {"dtype": "uint8"}}],
            "outputs": ["image", "index"], "loader": {"workers": workers, "on_error": "skip", "shuffle": False}}


@pytest.mark.skipif(len(CPU_BACKENDS) < 2, reason="needs both CPU backends (dali-cpu and torchvision)")
def test_a_skip_loader_on_each_cpu_backend_yields_or_skips_every_mutated_file_alike(tmp_path):
    total = _mutated_folder(tmp_path / "data", per_format=30, seed=23)
    epochs = {}
    for backend, workers in (("torchvision", 0), ("torchvision", 2), ("dali-cpu", 2)):
        pipeline = tmp_path / f"{backend}-{workers}.json"
        pipeline.write_text(json.dumps(_pipeline(tmp_path / "data", workers=workers)))
        report = tmp_path / f"{backend}-{workers}.npz"
        result = run_worker("loader", str(pipeline), backend, str(report))
        assert result.returncode == 0, crashed(result)
        with np.load(report) as epoch:
            epochs[backend, workers] = {key: epoch[key] for key in epoch.files}
    reference = epochs["torchvision", 0]
    yielded, skipped = reference["indices"].tolist(), reference["skipped_indices"].tolist()
    assert sorted(yielded + skipped) == list(range(total))  # every file once: yielded or counted
    assert 0 < len(skipped) < total
    for key, epoch in epochs.items():
        assert epoch["indices"].tolist() == yielded, key
        assert epoch["skipped_indices"].tolist() == skipped, key
        assert epoch["skipped_reasons"].tolist() == reference["skipped_reasons"].tolist(), key
        difference = np.abs(epoch["images"].astype(np.int16) - reference["images"]).max()
        assert difference <= 1, (key, difference)
