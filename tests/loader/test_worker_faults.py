"""The torchvision backend's DataLoader workers: a worker that dies ends the iteration with an error
that says how and what to do (and the next iteration starts new workers and resumes), a stopped
worker is reported after a bounded wait, and a loader with workers built inside a DataLoader
worker is refused with the setting to use."""
from __future__ import annotations

import logging
import os
import signal
import threading

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import dali_bridge.backends.torchvision as tv
from tests.helpers.paths import REPO, VAL
from tests.helpers.processes import child_processes
from dali_bridge import build_loader
from dali_bridge.backends.torchvision import WorkerError
from dali_bridge.spec.pipeline import load_spec
from dali_bridge.spec.problems import SpecError

pytestmark = pytest.mark.slow  # kills and stops DataLoader workers and waits out the stall bound

BATCH = 2  # 37 samples: 19 batches, far more than the 2 a worker prefetches


@pytest.fixture
def spec(sample_root, write_pipeline):
    return load_spec(write_pipeline(VAL, source={"type": "folder", "root": str(sample_root)}, batch_size=BATCH,
                                    loader={"workers": 1, "shuffle": False}))


def _labels(loader) -> list[int]:
    return [int(label) for _, labels in loader for label in labels]


@pytest.mark.parametrize("how, says", [
    (signal.SIGKILL, "was killed by SIGKILL (also what the kernel's out-of-memory killer sends"),
    (signal.SIGBUS, "was killed by SIGBUS (usually /dev/shm full:"),
])
def test_a_dead_worker_is_an_error_saying_how_and_the_next_iteration_resumes(spec, how, says):
    expected = _labels(build_loader(spec, "torchvision", device="cpu"))
    before = set(child_processes())  # a loopback server of another folder's fixture is not a worker
    loader = build_loader(spec, "torchvision", device="cpu")
    try:
        batches = iter(loader)
        seen = [int(label) for label in next(batches)[1]]
        (worker,) = set(child_processes()) - before
        os.kill(worker, how)
        with pytest.raises(WorkerError) as info:
            for _, labels in batches:
                seen += [int(label) for label in labels]
        message = str(info.value)
        assert f"DataLoader worker pid {worker} {says}" in message
        assert "iterate the loader again to start new workers" in message
        assert "to resume at the failed batch instead, first loader.load_state_dict(loader.state_dict())" in message
        assert worker not in child_processes()
        loader.load_state_dict(loader.state_dict())
        seen += _labels(loader)  # new workers, from the failed batch on
        assert seen == expected
    finally:
        loader.close()


def test_a_stopped_worker_is_named_in_a_warning_after_the_stall_bound(spec, monkeypatch, caplog):
    monkeypatch.setattr(tv, "STALL_SECONDS", 0.5)
    before = set(child_processes())
    loader = build_loader(spec, "torchvision", device="cpu")
    try:
        batches = iter(loader)
        next(batches)
        (worker,) = set(child_processes()) - before
        os.kill(worker, signal.SIGSTOP)
        resume = threading.Timer(3.0, os.kill, (worker, signal.SIGCONT))
        resume.start()
        with caplog.at_level(logging.WARNING, logger="dali_bridge"):
            rest = sum(1 for _ in batches)
        resume.join()
    finally:
        os.kill(worker, signal.SIGCONT)
        loader.close()
    assert rest == len(loader) - 1  # it waited, then finished the epoch
    warnings = [r.getMessage() for r in caplog.records if "no batch from the DataLoader workers" in r.getMessage()]
    assert warnings and f"pid {worker} is stopped (SIGSTOP, Ctrl-Z or a debugger): resume it with kill -CONT " \
                        f"{worker}" in warnings[0]


def test_no_stall_warning_while_batches_arrive(spec, monkeypatch, caplog):
    monkeypatch.setattr(tv, "STALL_SECONDS", 30.0)
    loader = build_loader(spec, "torchvision", device="cpu")
    try:
        with caplog.at_level(logging.WARNING, logger="dali_bridge"):
            assert sum(1 for _ in loader) == len(loader)
    finally:
        loader.close()
    assert not [r for r in caplog.records if "no batch from" in r.getMessage()]


class _BuildsALoader(Dataset):
    """A dataset whose item is what building a loader with workers inside a DataLoader worker says."""

    def __init__(self, spec):
        self.spec = spec

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> str:
        try:
            build_loader(self.spec, "torchvision", device="cpu").close()
        except SpecError as exc:
            return str(exc)
        return "built"


def test_a_loader_with_workers_inside_a_dataloader_worker_is_refused_naming_workers_0(spec, sample_root,
                                                                                     write_pipeline):
    (message,) = list(DataLoader(_BuildsALoader(spec), batch_size=None, num_workers=1))
    assert "loader.workers: 1 worker processes cannot be started here" in message
    assert "set loader.workers: 0 for a loader built there" in message
    zero = load_spec(write_pipeline(VAL, source={"type": "folder", "root": str(sample_root)},
                                    loader={"workers": 0}))
    assert list(DataLoader(_BuildsALoader(zero), batch_size=None, num_workers=1)) == ["built"]
    assert torch.utils.data.get_worker_info() is None


_ITERATE = """
import sys
from dali_bridge import build_loader
from dali_bridge.backends.torchvision import WorkerError
from dali_bridge.spec.pipeline import load_spec
spec = load_spec(sys.argv[1], {"source": {"type": "folder", "root": sys.argv[2]}, "batch_size": 16,
                               "loader": {"workers": 2}})
loader = build_loader(spec, "torchvision", device="cpu")
try:
    sum(1 for _ in loader)
except WorkerError as exc:
    print("WorkerError:", exc)
finally:
    loader.close()
"""


def test_a_full_dev_shm_is_a_clear_error_and_leaves_no_segment_behind(sample_root, tmp_path):
    """/dev/shm of 1 MiB in a private mount namespace (root only): the batch buffers do not fit."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux unshare")
    script = tmp_path / "iterate.py"
    script.write_text(_ITERATE)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = (f"mount -t tmpfs -o size=1m tmpfs /dev/shm || exit 77; "
               f"{sys.executable} {script} {VAL} {sample_root}; echo left: $(ls /dev/shm)")
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", command], env=env,
                          capture_output=True, text=True, timeout=300)
    if done.returncode == 77 or "unshare failed" in done.stderr or "Operation not permitted" in done.stderr:
        pytest.skip("a private /dev/shm needs root with mount rights")
    assert "WorkerError: a DataLoader worker cannot allocate its batch buffers" in done.stdout, done.stderr
    assert "in /dev/shm (1 MiB free of 1 MiB" in done.stdout and "docker --shm-size" in done.stdout
    assert done.stdout.rstrip().endswith("left:"), done.stdout  # no torch_* segment after the process ended
