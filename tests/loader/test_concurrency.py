"""One loader, one iteration at a time, in the process that built it: a second thread or a forked
child gets a clear error instead of wrong pixels or a hang."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tests.helpers.backends import HOST_BACKENDS, backend_params
from tests.helpers.paths import REPO
from dali_bridge import build_loader

pytestmark = pytest.mark.slow  # threads and forked children iterating loaders

CPU = backend_params(["dali-cpu", "torchvision"])

# Child processes import this checkout's package.
_ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def _pipeline(root: Path, workers: int = 1) -> dict:
    return {"version": 1, "name": "concurrency", "source": {"type": "folder", "root": str(root)}, "batch_size": 4,
            "seed": 2, "ops": [{"random_resized_crop": {"size": 16}}, {"normalize": {"dtype": "uint8"}}],
            "outputs": ["image", "label", "index"], "loader": {"workers": workers}}


def _in_thread(action) -> BaseException | None:
    """Run ``action`` on another thread; what it raised (None if nothing)."""
    raised: list[BaseException] = []

    def body() -> None:
        try:
            action()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            raised.append(exc)

    thread = threading.Thread(target=body, name="second-consumer")
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    return raised[0] if raised else None


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("second", ["next-iter", "list", "for-loop"])
def test_a_second_thread_iterating_a_busy_loader_is_refused(sample_root, backend, second):
    with build_loader(_pipeline(sample_root), backend) as loader:
        first = iter(loader)
        image, _, index = next(first)
        actions = {"next-iter": lambda: next(iter(loader)), "list": lambda: list(loader),
                   "for-loop": lambda: [batch for batch in loader]}
        error = _in_thread(actions[second])
        assert isinstance(error, RuntimeError) and "already being iterated by another thread" in str(error)
        assert "MainThread" in str(error)
        rest = list(first)  # the first iteration is untouched
        seen = index.tolist() + [i for _, _, idx in rest for i in idx.tolist()]
        assert sorted(seen) == list(range(loader.num_samples))


@pytest.mark.parametrize("backend", CPU)
def test_threads_taking_turns_each_get_a_whole_epoch(sample_root, backend):
    with build_loader(_pipeline(sample_root), backend) as loader:
        first = [idx for _, _, idx in loader]
        seen: list[int] = []
        assert _in_thread(lambda: seen.extend(i for _, _, idx in loader for i in idx.tolist())) is None
        assert sorted(seen) == list(range(loader.num_samples)) and len(first) == len(loader)


@pytest.mark.parametrize("backend", CPU)
def test_a_new_iteration_on_the_same_thread_ends_the_unfinished_one(sample_root, backend):
    with build_loader(_pipeline(sample_root), backend) as loader:
        first = iter(loader)
        next(first)
        second = list(loader)
        assert sum(len(idx) for _, _, idx in second) == loader.num_samples
        with pytest.raises(StopIteration):
            next(first)


FORK_SCRIPT = textwrap.dedent("""
    import os, sys
    from dali_bridge import build_loader

    backend, root = sys.argv[1], sys.argv[2]
    spec = {"version": 1, "name": "fork", "source": {"type": "folder", "root": root}, "batch_size": 4,
            "ops": [{"center_crop": 16}, {"normalize": {"dtype": "uint8"}}], "outputs": ["image", "index"],
            "loader": {"workers": int(sys.argv[3])}}
    loader = build_loader(spec, backend)
    expected = next(iter(loader))[1].tolist()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            next(iter(loader))
            code = 3  # iterated a loader it does not own
        except RuntimeError as exc:
            if "cannot be iterated in process" not in str(exc):
                code = 4
        try:
            with build_loader(spec, backend) as own:
                if next(iter(own))[1].tolist() != expected:
                    code = 5
        except Exception:
            code = 6
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status))
    loader.close()
""")


@pytest.mark.parametrize("backend, workers", [pytest.param(*p.values, w, marks=p.marks, id=f"{p.id}-{w}")
                                              for p, w in zip(CPU, (1, 2))])
def test_a_forked_child_is_refused_the_parents_loader_and_can_build_its_own(sample_root, tmp_path, backend, workers):
    script = tmp_path / "fork.py"
    script.write_text(FORK_SCRIPT)
    done = subprocess.run([sys.executable, str(script), backend, str(sample_root), str(workers)],
                          capture_output=True, text=True, timeout=240, env=_ENV)
    assert done.returncode == 0 and "child exit 0" in done.stdout, (done.stdout, done.stderr[-3000:])


GC_AT_FORK_SCRIPT = textwrap.dedent("""
    import gc, os, sys
    # A collection inside the first after-fork hook: what an allocation in threading's own
    # after-fork hook (registered before any of ours) may trigger.
    os.register_at_fork(after_in_child=gc.collect)
    from dali_bridge import build_loader

    spec = {"version": 1, "name": "gc-at-fork", "source": {"type": "folder", "root": sys.argv[1]},
            "batch_size": 4, "ops": [{"center_crop": 16}, {"normalize": {"dtype": "uint8"}}],
            "loader": {"workers": 1}}
    loader = build_loader(spec, "dali-cpu")
    batches = iter(loader)
    next(batches)  # the pipeline is mid-epoch, its threads prefetching
    gc.disable()
    garbage = [loader, batches]  # left in a reference cycle, as a traceback leaves a loader
    garbage.append(garbage)
    del loader, batches, garbage
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("child exit", os.waitstatus_to_exitcode(status))
""")


def test_a_fork_collecting_a_discarded_dali_pipeline_in_the_child_does_not_hang(sample_root, tmp_path):
    if "dali-cpu" not in HOST_BACKENDS:
        pytest.skip("dali-cpu is not available here")
    script = tmp_path / "gc_fork.py"
    script.write_text(GC_AT_FORK_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(sample_root)], capture_output=True, text=True,
                          timeout=120, env=_ENV)
    assert done.returncode == 0 and "child exit 0" in done.stdout, (done.stdout, done.stderr[-3000:])
