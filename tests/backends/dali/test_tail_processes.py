"""dali-cpu's torch tail in worker processes (``loader.executor: processes``, the default): the batches
of the tail in threads, its errors raised as they were raised, a dead worker named, and the threads
wherever this process may not fork."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.backends import backend_params
from dali_bridge import build_loader
from dali_bridge.backends.dali import tail_processes
from dali_bridge.backends.dali import tail_runner
from dali_bridge.backends.dali.tail_processes import TailProcessError, tail_processes_possible
from dali_bridge.ops.auto_augment import TrivialAugmentWide
from tests.helpers.hostile import write_image_folder

DALI_CPU = backend_params(["dali-cpu"])
pytestmark = pytest.mark.slow  # each loader forks its tail workers


def tail_pipeline(root: Path, *, executor: str = "processes", workers: int = 2) -> dict[str, Any]:
    """Four batches of five through a torch tail: the recipes' crop and policy in torch (parity exact)."""
    return {"version": 1, "name": "tail-processes", "source": {"type": "folder", "root": str(root)},
            "batch_size": 5, "seed": 4,
            "ops": [{"random_resized_crop": {"size": 24}}, {"horizontal_flip": 0.5}, {"trivial_augment_wide": {}},
                    {"normalize": {}}],
            "outputs": ["image", "label", "index"],
            "loader": {"workers": workers, "executor": executor, "shuffle": True}}


def epochs(loader, count: int = 2) -> list[tuple[list[int], torch.Tensor]]:
    return [(index.tolist(), image.clone()) for _ in range(count) for image, _, index in loader]


def assert_same(got: list, expected: list) -> None:
    assert [indices for indices, _ in got] == [indices for indices, _ in expected]
    for (_, image), (_, reference) in zip(got, expected):
        assert torch.equal(image, reference)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tail-processes")
    write_image_folder(root, classes=2, per_class=10)
    return root


@pytest.fixture(scope="module")
def in_threads(images) -> list:
    with build_loader(tail_pipeline(images, executor="threads"), "dali-cpu") as loader:
        assert loader._executor.tail.runs_in == "threads"
        return epochs(loader)


@pytest.mark.parametrize("backend", DALI_CPU)
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_the_tail_in_processes_gives_the_batches_of_the_tail_in_threads(images, in_threads, backend, workers):
    with build_loader(tail_pipeline(images, workers=workers), backend) as loader:
        assert loader._executor.tail.runs_in == "processes"
        assert loader._executor.tail.processes.workers == min(workers, 4)
        assert_same(epochs(loader), in_threads)


@pytest.mark.parametrize("backend", DALI_CPU)
def test_a_batch_larger_than_the_memory_reserved_for_it_goes_in_a_buffer_shared_then(images, in_threads, backend,
                                                                                    monkeypatch):
    monkeypatch.setattr(tail_processes, "RESERVED_PER_IMAGE", 64)  # far less than an image: every chunk grows
    with build_loader(tail_pipeline(images), backend) as loader:
        assert_same(epochs(loader), in_threads)


@pytest.mark.parametrize("backend", DALI_CPU)
def test_leaving_an_epoch_early_leaves_no_stale_batch_for_the_next(images, in_threads, backend):
    with build_loader(tail_pipeline(images), backend) as loader:
        for _ in loader:  # one batch, then out: the batches already sent to the workers are discarded
            break
        loader.set_epoch(0)
        assert_same(epochs(loader), in_threads)


@pytest.mark.parametrize("backend", DALI_CPU)
def test_an_error_in_a_tail_process_is_raised_in_the_loop_as_it_was_raised(images, backend, monkeypatch):
    def failing(self, image, concrete, params):
        raise ValueError(f"no kernel for a {tuple(image.shape)} image here")

    monkeypatch.setattr(TrivialAugmentWide, "torchvision_kernel", failing)  # before the fork: the workers have it
    with build_loader(tail_pipeline(images), backend) as loader:
        with pytest.raises(ValueError, match=r"no kernel for a \(3, 24, 24\) image here"):
            next(iter(loader))


@pytest.mark.parametrize("backend", DALI_CPU)
def test_a_tail_process_that_dies_is_named_with_how_it_ended(images, backend):
    loader = build_loader(tail_pipeline(images), backend)
    workers = loader._executor.tail.processes._processes
    for process in workers:
        os.kill(process.pid, signal.SIGKILL)
        process.join(timeout=10)
    with pytest.raises(TailProcessError, match=rf"worker process ({'|'.join(str(p.pid) for p in workers)}) "
                                               r"was killed by signal 9 .*rebuild the loader"):
        next(iter(loader))
    loader.close()


@pytest.mark.parametrize("backend", DALI_CPU)
def test_closing_the_loader_ends_its_tail_processes(images, backend):
    loader = build_loader(tail_pipeline(images), backend)
    next(iter(loader))
    workers = list(loader._executor.tail.processes._processes)
    assert all(process.is_alive() for process in workers)
    loader.close()
    assert not any(process.is_alive() for process in workers)


@pytest.mark.parametrize("backend", DALI_CPU)
def test_where_this_process_may_not_fork_the_tail_runs_in_threads_and_says_why(images, in_threads, backend,
                                                                               monkeypatch, caplog):
    monkeypatch.setattr(tail_runner, "tail_processes_possible", lambda: "this process is daemonic")
    with caplog.at_level("INFO", logger="dali_bridge"), build_loader(tail_pipeline(images), backend) as loader:
        assert "the torch tail runs in threads, not processes: this process is daemonic" in caplog.text
        assert loader._executor.tail.runs_in == "threads" and loader._executor.tail.processes is None
        assert_same(epochs(loader), in_threads)


def test_a_daemonic_process_may_not_start_tail_processes(monkeypatch):
    import multiprocessing

    assert tail_processes_possible() is None
    monkeypatch.setattr(multiprocessing.current_process(), "daemon", True, raising=False)
    assert "daemonic" in tail_processes_possible()


@pytest.mark.parametrize("backend", DALI_CPU)
def test_a_loader_process_that_exits_abruptly_leaves_its_tail_workers_ending_quietly(images, backend, tmp_path):
    import json
    import subprocess
    import sys

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(tail_pipeline(images)))
    script = ("import json, os, sys\nfrom dali_bridge import build_loader\n"
              f"loader = build_loader(json.load(open({str(spec)!r})), {backend!r})\n"
              "it = iter(loader); next(it)\n"
              "print(' '.join(str(p.pid) for p in loader._executor.tail.processes._processes), flush=True)\n"
              "os._exit(0)  # no close, no finalizer: the workers find their pipe closed\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    for pid in map(int, done.stdout.split()):
        for _ in range(100):  # each worker ends on its own once it sees the parent's end closed
            if not running(pid):
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"tail worker {pid} outlived its loader's process")


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie nobody has reaped yet has ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")
