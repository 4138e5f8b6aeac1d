"""Pinned outputs: digests of whole batches (images, labels, indices) and of the sampler's draws.

The op layer may be reorganised freely, but not one output pixel, order or random draw of an
existing pipeline may change on any backend. The digests (tests/helpers/pinned_outputs.json, one per batch)
were computed from the pipelines of tests/helpers/pinned_variants.py on the generated sample set of
tests/conftest.py, which is the same bytes on every CPU (its own digest is pinned too, so a change
of the generated images is told apart). torch's CPU kernels take other arithmetic paths under
other CPU capabilities, so the batches are computed in a worker process under one stated
capability (tests/helpers/pinned_worker.py, ``ATEN_CPU_CAPABILITY=default``); what holds across
capabilities is compare's bound, measured below. A failing digest says which batch moved, by how
much, and against the other backend's batch.

Re-pin after an intended change: ``ATEN_CPU_CAPABILITY=default python tests/helpers/pinned_worker.py ROOT
OUT --print-pins > tests/helpers/pinned_outputs.json`` (ROOT: the set of ``sample_root``).
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tests.helpers.backends import CPU_BACKENDS, needs_cpu_backends, plan_of
from tests.helpers.paths import REPO
from tests.helpers.pinned_variants import VARIANTS

HERE = REPO / "tests" / "helpers"  # the worker and the pins
WORKER = HERE / "pinned_worker.py"
PINNED: dict[str, dict[str, list[str]]] = json.loads((HERE / "pinned_outputs.json").read_text())
SAMPLE_SET = "c6d831f8"  # first 8 hex digits of the generated set's digest (see sample_set_digest)


def sample_set_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.jpg")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:8]


def run_worker(root: Path, out: Path, *variants: str, capability: str = "default") -> dict:
    """The worker's digests for ``variants`` (all when none), computed under ``capability``."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, str(WORKER), str(root), str(out), *variants], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"pinned worker failed ({done.returncode}):\n{done.stderr[-4000:]}"
    return json.loads((out / "digests.json").read_text())


@pytest.fixture(scope="module")
def pinned_run(sample_root, tmp_path_factory) -> tuple[dict, Path]:
    if CPU_BACKENDS != ["dali-cpu", "torchvision"]:
        pytest.skip(f"the pinned outputs need dali-cpu and torchvision; this host has {CPU_BACKENDS}")
    out = tmp_path_factory.mktemp("pinned")
    return run_worker(sample_root, out), out


def load_batches(out: Path, name: str, backend: str) -> dict[str, np.ndarray]:
    with np.load(out / f"{name}.{backend}.npz") as arrays:
        return {key: arrays[key] for key in arrays.files}


def what_moved(out: Path, name: str, backend: str, got: list[str]) -> str:
    """Each batch whose digest moved: its largest change against the other backend's batch."""
    other = next(b for b in ("dali-cpu", "torchvision") if b != backend)
    mine, theirs = load_batches(out, name, backend), load_batches(out, name, other)
    keys = sorted({key.split("|")[0] for key in mine}, key=list({k.split("|")[0]: 0 for k in mine}).index)
    lines = []
    for key, want, have in zip(keys, PINNED[name][backend], got):
        if want == have:
            continue
        image, reference = mine[f"{key}|image"], theirs[f"{key}|image"]
        same_order = all(np.array_equal(mine[f"{key}|{part}"], theirs[f"{key}|{part}"]) for part in ("label", "index"))
        if image.shape != reference.shape:
            detail = f"shape {image.shape} vs {other}'s {reference.shape}"
        else:
            delta = np.abs(image.astype(np.float64) - reference.astype(np.float64))
            detail = f"max |difference| against {other}'s batch {delta.max():.6g} (mean {delta.mean():.3g})"
        lines.append(f"  {key}: {detail}; labels and indices {'as' if same_order else 'NOT as'} on {other}")
    return f"{name} on {backend}: {len(lines)} of {len(got)} batches moved\n" + "\n".join(lines)


def test_the_generated_sample_set_is_the_one_the_digests_were_computed_on(sample_root):
    assert sample_set_digest(sample_root) == SAMPLE_SET


@pytest.mark.parametrize("backend", ["dali-cpu", "torchvision"])
@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.slow
def test_pipeline_outputs_are_bit_identical_to_the_pinned_digests(pinned_run, name, backend):
    digests, out = pinned_run
    got = digests[name][backend]
    assert got == PINNED[name][backend], what_moved(out, name, backend, got)


@pytest.mark.slow
def test_a_moved_batch_is_reported_by_pipeline_batch_and_difference(pinned_run):
    digests, out = pinned_run
    changed = list(digests["train"]["torchvision"])
    pinned = PINNED["train"]["torchvision"]
    try:
        PINNED["train"]["torchvision"] = ["0" * 16] + pinned[1:]
        report = what_moved(out, "train", "torchvision", changed)
    finally:
        PINNED["train"]["torchvision"] = pinned
    assert report.startswith("train on torchvision: 1 of 4 batches moved")
    assert "epoch 0 batch 0: max |difference| against dali-cpu's batch" in report
    assert "labels and indices as on dali-cpu" in report


@needs_cpu_backends
@pytest.mark.slow
def test_outputs_across_cpu_capabilities_stay_within_compares_bound(sample_root, tmp_path):
    """What holds from one CPU to another: dali-cpu's batches do not depend on torch's capability;
    the torchvision backend's differ by at most compare's bound for a resize (1 level of 255)."""
    import torch

    host = torch.backends.cpu.get_cpu_capability().lower()
    if host == "default":
        pytest.skip("this CPU runs torch's default kernels only: there is no second capability to compare")
    variants = ("train", "val")
    at_default = run_worker(sample_root, tmp_path / "default", *variants)
    at_host = run_worker(sample_root, tmp_path / "host", *variants, capability=host)
    for name in variants:
        assert at_host[name]["dali-cpu"] == at_default[name]["dali-cpu"], name
        for key, image in load_batches(tmp_path / "host", name, "torchvision").items():
            if key.endswith("|image"):
                reference = load_batches(tmp_path / "default", name, "torchvision")[key]
                delta = np.abs(image.astype(np.float64) - reference.astype(np.float64)).max()
                assert delta <= 1 / 255 / min(0.229, 0.224, 0.225) + 1e-5, (name, key, delta)


# ---------------------------------------------------------------------------------------------
# The sampler's draws and the geometry they give

@pytest.mark.parametrize("ops, streams, expected", [
    ([{"random_resized_crop": 32}, {"resize": 40}, {"center_crop": 32}, {"horizontal_flip": 0.5}, {"normalize": {}}],
     [0, 3], "27a05283098c24a6b85c608b83eadbf71b73591c94079d47a048c4ee7f80b171"),
    ([{"resize": 64}, {"crop_mirror_normalize": {"crop": 48, "mirror": 0.3}}],
     [2], "4eed0eaab42ceeb93cb9e943cd98f29f8b40d3432fd9235d29a377d612272f31"),
], ids=["every-geometry-op", "crop-mirror-normalize"])
def test_draws_are_bit_identical_to_the_pinned_digests(ops, streams, expected):
    from dali_bridge.pipeline.sampling import draws

    got = draws(plan_of(ops), 7, 3, np.arange(100, 164))
    assert sorted(got) == streams
    digest = hashlib.sha256()
    for position in sorted(got):
        digest.update(str((position, got[position].shape)).encode())
        digest.update(got[position].tobytes())
    assert digest.hexdigest() == expected


def test_train_crop_windows_and_flips_are_the_pinned_ones():
    from dali_bridge.pipeline.sampling import draws, sample_geometry

    plan = plan_of([{"random_resized_crop": 224}, {"horizontal_flip": 0.5}, {"normalize": {}}])
    indices = np.array([0, 1, 5, 8, 11])
    sample_draws = draws(plan, 0, 2, indices)
    got = []
    for row in range(len(indices)):
        crop, resize, flip = sample_geometry(plan, 375, 500, {k: v[row] for k, v in sample_draws.items()})
        assert (resize.height, resize.width) == (224, 224)
        got.append((crop.top, crop.left, crop.height, crop.width, flip.apply))
    assert got == [(103, 252, 192, 200, False), (72, 61, 289, 245, True), (48, 11, 302, 283, False),
                   (125, 110, 240, 299, False), (27, 115, 310, 382, True)]
