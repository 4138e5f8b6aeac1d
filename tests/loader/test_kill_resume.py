"""Kill and resume: a training-like loop in a subprocess, killed with SIGKILL twice at random points,
restarted from its last saved state, yields exactly the batches of an uninterrupted run — with a
plain pipeline, and with a recipe's policy, random erasing and MixUp/CutMix (images and soft targets).

The loop (this file run as a script) saves ``{"loader": loader.state_dict(), "batches": [...],
"skipped": [...]}`` after every batch, atomically (write a temporary file, fsync, rename): the
file on disk is always "everything up to and including batch k", and a restart continues with
batch k+1. Each batch is recorded as its epoch, indices, labels and a SHA-256 of its pixels, so
order, sample choice and crops are all compared. One file of the set is broken and
``on_error: skip`` is on, so skips are part of what must come out exactly once.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.backends import backend_params
from tests.helpers.paths import REPO

pytestmark = pytest.mark.slow  # kills a training process and resumes it in another

EPOCHS = 2
SAMPLES = 14
BATCH = 3
BROKEN = 6   # index of the broken file (skipped, recorded)
DELAY_S = 0.1  # per batch in the child, so a kill lands mid-run


def pipeline(root: str, variant: str = "plain") -> dict:
    """``plain``: crop and flip; ``mixing``: a recipe's policy, erasing and batch mixing with soft targets."""
    ops: list = [{"random_resized_crop": {"size": 20}}, {"horizontal_flip": {}}, {"normalize": {"dtype": "uint8"}}]
    outputs = ["image", "label", "index", "valid"]
    if variant == "mixing":
        ops = [{"random_resized_crop": {"size": 20}}, {"horizontal_flip": {}}, "trivial_augment_wide",
               {"normalize": {}}, {"random_erasing": {"probability": 0.5, "value": "random"}}, "batch_mix"]
        outputs = outputs + ["target"]
    return {"version": 1, "name": "resume", "source": {"type": "folder", "root": root}, "batch_size": BATCH,
            "seed": 5, "ops": ops, "outputs": outputs, "loader": {"workers": 1, "on_error": "skip"}}


def save_atomically(path: Path, data: dict) -> None:
    """Write ``data`` as JSON so that ``path`` holds either the old or the new content, never a mix."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w") as handle:
        json.dump(data, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


def train(backend: str, root: str, state_path: Path, delay: float, variant: str) -> None:
    """The training-like loop: resume from ``state_path`` if present, save after every batch."""
    from dali_bridge import build_loader

    loader = build_loader(pipeline(root, variant), backend)
    state = {"loader": None, "batches": [], "skipped": [], "starts": 0}
    if state_path.exists():
        state = json.loads(state_path.read_text())
        loader.load_state_dict(state["loader"])
    state["starts"] += 1
    while loader.epoch < EPOCHS:
        epoch = loader.epoch
        for image, label, index, valid, *target in loader:
            state["batches"].append({"epoch": epoch, "index": index.tolist(), "label": label.tolist(),
                                     "pixels": hashlib.sha256(image.cpu().numpy().tobytes()).hexdigest(),
                                     "target": [t.cpu().tolist() for t in target]})
            state["skipped"] += [[s.index, s.epoch, s.reason] for s in loader.skipped]
            loader.skipped.clear()
            state["loader"] = loader.state_dict()
            save_atomically(state_path, state)
            time.sleep(delay)   # the "training step"
    loader.close()


def child(backend: str, root: Path, state_path: Path, variant: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    return subprocess.Popen([sys.executable, str(Path(__file__).resolve()), backend, str(root), str(state_path),
                             str(DELAY_S), variant], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def saved_batches(state_path: Path) -> int:
    try:
        return len(json.loads(state_path.read_text())["batches"])
    except (OSError, ValueError):
        return 0


@pytest.fixture(scope="module")
def resume_root(tmp_path_factory) -> Path:
    from tests.helpers.hostile import break_file, write_image_folder

    root = tmp_path_factory.mktemp("resume")
    files = write_image_folder(root, classes=2, per_class=SAMPLES // 2)
    break_file(files[BROKEN], "cut_halfway")
    return root


@pytest.mark.parametrize("backend", backend_params(["dali-cpu", "torchvision", "dali"]))
@pytest.mark.parametrize("variant", ["plain", "mixing"])
def test_sigkilled_training_resumes_from_its_saved_state_with_exactly_the_uninterrupted_batches(
        resume_root, tmp_path, backend, variant):
    reference_path = tmp_path / "reference.json"
    process = child(backend, resume_root, reference_path, variant)
    output = process.communicate(timeout=300)[0].decode(errors="replace")
    assert process.returncode == 0, output[-4000:]
    reference = json.loads(reference_path.read_text())
    total = len(reference["batches"])
    assert total == EPOCHS * 5  # 13 readable samples in batches of 3, per epoch
    assert [s[:2] for s in reference["skipped"]] == [[BROKEN, 0], [BROKEN, 1]]

    seed = random.randrange(1 << 30)
    chooser = random.Random(seed)
    per_epoch = total // EPOCHS
    # two kills: after a random batch of epoch 0, then after a random batch of epoch 1
    kill_after = [chooser.randrange(1, per_epoch - 1), chooser.randrange(per_epoch + 1, total - 1)]
    state_path = tmp_path / "state.json"
    for target in kill_after:
        process = child(backend, resume_root, state_path, variant)
        deadline = time.monotonic() + 120
        while saved_batches(state_path) < target:
            assert process.poll() is None, f"seed {seed}: child ended before batch {target}"
            assert time.monotonic() < deadline, f"seed {seed}: no progress to batch {target}"
            time.sleep(0.005)
        time.sleep(chooser.uniform(0, DELAY_S))  # anywhere inside the next batch's work
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=60)
        assert process.returncode == -signal.SIGKILL, f"seed {seed}: the child was not killed mid-run"
        assert saved_batches(state_path) < total, f"seed {seed}: the child finished before the kill"
    process = child(backend, resume_root, state_path, variant)
    output = process.communicate(timeout=300)[0].decode(errors="replace")
    assert process.returncode == 0, output[-4000:]
    resumed = json.loads(state_path.read_text())
    assert resumed["starts"] == 3
    assert resumed["batches"] == reference["batches"], f"seed {seed}, kills after batches {kill_after}"
    assert resumed["skipped"] == reference["skipped"], f"seed {seed}, kills after batches {kill_after}"


if __name__ == "__main__":  # the training-like child: backend root state_path delay
    train(sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4]), sys.argv[5])
