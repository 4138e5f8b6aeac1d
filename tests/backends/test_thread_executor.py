"""``loader.executor: threads``: the torchvision backend's workers as threads of the loader's process
give the batches, skips, errors, resumption and shutdown of its worker processes."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.paths import TRAIN, VAL
from tests.helpers.processes import child_processes, settle
from dali_bridge import build_loader
from dali_bridge.backends.thread_pool import OrderedPool, abandon
from dali_bridge.errors import SampleError
from dali_bridge.loader.loader import Loader
from tests.helpers.hostile import break_file, write_image_folder

WORKERS = 2
POOL_THREADS = "dali-bridge-sample"


def loader_for(pipeline: Path | dict, root: Path, executor: str, **extra: Any) -> Loader:
    overrides = {"source": {"type": "folder", "root": str(root)}, "batch_size": 5, "loader.workers": WORKERS,
                 "loader.executor": executor, "outputs": ["image", "label", "index", "valid"], **extra}
    return build_loader(pipeline, "torchvision", overrides=overrides)


def batches(loader: Loader, limit: int | None = None) -> list[tuple[torch.Tensor, ...]]:
    out = []
    for batch in loader:
        out.append(tuple(value.clone() for value in batch))
        if limit is not None and len(out) == limit:
            break
    return out


def assert_same(got: list[tuple[torch.Tensor, ...]], expected: list[tuple[torch.Tensor, ...]]) -> None:
    assert len(got) == len(expected)
    for number, (ours, theirs) in enumerate(zip(got, expected)):
        for value, reference in zip(ours, theirs):
            assert value.dtype == reference.dtype and torch.equal(value, reference), f"batch {number}"


def pool_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith(POOL_THREADS)]


@pytest.mark.parametrize("pipeline", [TRAIN, VAL], ids=["train", "val"])
def test_threads_give_the_batches_of_worker_processes_on_the_shipped_pipelines(sample_root, pipeline):
    with loader_for(pipeline, sample_root, "processes") as processes, \
            loader_for(pipeline, sample_root, "threads") as threads:
        for _ in range(2):  # two epochs: other orders and draws
            assert_same(batches(threads), batches(processes))


def test_threads_start_no_process_and_close_joins_their_threads(sample_root):
    before = set(child_processes())
    loader = loader_for(TRAIN, sample_root, "threads", **{"ops.0.random_resized_crop.size": 32})
    batches(loader, limit=2)  # left mid-epoch: the batches in flight are cancelled or finished
    assert set(child_processes()) <= before
    assert 0 < len(pool_threads()) <= WORKERS
    assert len(batches(loader)) == len(loader)  # the next epoch, on the same threads
    loader.close()
    assert not pool_threads()


def test_threads_resume_mid_epoch_where_the_processes_would(sample_root):
    extra = {"ops.0.random_resized_crop.size": 32}
    with loader_for(TRAIN, sample_root, "processes", **extra) as whole:
        expected = batches(whole)
    with loader_for(TRAIN, sample_root, "threads", **extra) as first:
        iteration = iter(first)
        head = [tuple(value.clone() for value in next(iteration)) for _ in range(3)]
        state = first.state_dict()  # saved mid-epoch, as a checkpoint is (not after leaving the epoch)
    with loader_for(TRAIN, sample_root, "threads", **extra) as resumed:
        resumed.load_state_dict(state)
        assert_same(head + batches(resumed), expected)


def broken_folder(root: Path) -> tuple[list[Path], dict[int, str]]:
    files = write_image_folder(root, classes=3, per_class=6)
    broken = {2: "zero_bytes", 7: "cut_halfway", 11: "bad_huffman_table", 16: "random_bytes"}
    for index, kind in broken.items():
        break_file(files[index], kind)
    return files, broken


def test_threads_skip_and_record_the_samples_the_processes_skip(tmp_path):
    files, broken = broken_folder(tmp_path / "data")
    extra = {"loader.on_error": "skip", "ops.0.random_resized_crop.size": 24}
    results = {}
    for executor in ("processes", "threads"):
        with loader_for(TRAIN, tmp_path / "data", executor, **extra) as loader:
            results[executor] = (batches(loader), [(s.index, s.path, s.epoch, s.reason) for s in loader.skipped])
    (got, skipped), (expected, expected_skipped) = results["threads"], results["processes"]
    assert_same(got, expected)
    assert skipped == expected_skipped and sorted(s[0] for s in skipped) == sorted(broken)


def test_threads_raise_the_first_broken_sample_after_the_batches_before_it(tmp_path):
    files, broken = broken_folder(tmp_path / "data")
    with loader_for(TRAIN, tmp_path / "data", "threads", **{"ops.0.random_resized_crop.size": 24}) as loader:
        tasks = loader.tasks(0)
        failing = next(task for task in tasks if set(task.indices.tolist()) & set(broken))
        seen = []
        with pytest.raises(SampleError) as info:
            for _, _, index, _ in loader:
                seen.append(index.tolist())
        assert seen == [task.indices.tolist() for task in tasks[:failing.number]]
        first = next(i for i in failing.indices.tolist() if i in broken)
        assert (info.value.index, info.value.path) == (first, str(files[first]))
        assert loader.state_dict()["batch"] == failing.number


def test_a_loader_in_a_daemonic_process_may_use_threads(sample_root, monkeypatch):
    import multiprocessing

    monkeypatch.setattr(multiprocessing.current_process(), "daemon", True, raising=False)
    with loader_for(TRAIN, sample_root, "threads", **{"ops.0.random_resized_crop.size": 24}) as loader:
        assert len(batches(loader, limit=1)) == 1


def test_an_unknown_executor_is_a_positioned_spec_error_naming_the_choices():
    from dali_bridge.spec.pipeline import coerce_spec
    from dali_bridge.spec.problems import SpecError

    with pytest.raises(SpecError, match=r"loader.executor: expected one of processes, threads, ray, found 'fork'"):
        coerce_spec(TRAIN, {"loader.executor": "fork"})


def test_the_executor_key_is_dumped_only_when_it_is_not_the_default():
    from dali_bridge.spec.pipeline import coerce_spec

    assert "executor" not in coerce_spec(TRAIN).to_dict()["loader"]
    assert coerce_spec(TRAIN, {"loader.executor": "threads"}).to_dict()["loader"]["executor"] == "threads"


# ---- the pool itself

def test_the_pool_yields_in_item_order_whatever_order_the_work_ends_in():
    pool = OrderedPool(4, name="test-pool")
    try:
        delays = [0.05, 0.0, 0.03, 0.0, 0.01, 0.0]
        assert list(pool.map(lambda i: time.sleep(delays[i]) or i, range(6), in_flight=4)) == list(range(6))
    finally:
        pool.close()


def test_the_pool_holds_at_most_in_flight_items_ahead_of_the_consumer():
    pool = OrderedPool(3, name="test-pool")
    submitted, lock = [], threading.Lock()

    def items():
        for i in range(12):
            with lock:
                submitted.append(i)
            yield i

    try:
        for handed, _ in enumerate(pool.map(lambda i: i, items(), in_flight=3)):
            assert len(submitted) - handed <= 3
    finally:
        pool.close()


def test_a_failure_is_raised_at_its_turn_after_the_results_before_it():
    pool = OrderedPool(2, name="test-pool")

    def work(i: int) -> int:
        if i == 3:
            raise ValueError("item 3")
        return i

    seen = []
    try:
        with pytest.raises(ValueError, match="item 3"):
            for result in pool.map(work, range(8), in_flight=4):
                seen.append(result)
    finally:
        pool.close()
    assert seen == [0, 1, 2]


def test_leaving_a_map_early_cancels_what_has_not_started():
    pool = OrderedPool(1, name="test-pool")
    started = []
    results = pool.map(lambda i: started.append(i) or time.sleep(0.02) or i, range(50), in_flight=10)
    assert next(results) == 0
    results.close()  # waits for the running item, cancels the queued ones
    count = len(started)
    time.sleep(0.1)
    assert len(started) == count < 50
    pool.close()
    assert settle(lambda: not [t for t in threading.enumerate() if t.name.startswith("test-pool")])


def test_the_initializer_runs_in_each_thread_before_its_first_item():
    state = threading.local()
    initialized = []

    def initializer():
        state.ready = True
        initialized.append(threading.get_ident())

    pool = OrderedPool(3, name="test-pool", initializer=initializer)
    try:
        def work(i):
            time.sleep(0.01)
            return getattr(state, "ready", False), threading.get_ident()

        results = list(pool.map(work, range(12), in_flight=6))
    finally:
        pool.close()
    assert all(ready for ready, _ in results)
    assert {ident for _, ident in results} <= set(initialized) and len(initialized) == len(set(initialized)) <= 3


def test_the_sample_threads_run_torch_on_one_intra_op_thread_as_worker_processes_do(sample_root, monkeypatch):
    from dali_bridge.backends.torchvision import BatchDataset

    real_batch, counts = BatchDataset.batch, set()

    def batch(self, *args, **kwargs):
        counts.add(torch.get_num_threads())
        return real_batch(self, *args, **kwargs)

    monkeypatch.setattr(BatchDataset, "batch", batch)
    consumer = torch.get_num_threads()
    with loader_for(TRAIN, sample_root, "threads") as loader:
        batches(loader, limit=3)
    assert counts == {1} and torch.get_num_threads() == consumer


def test_abandon_returns_for_a_future_its_pool_cancelled_at_shutdown_and_waits_for_a_running_one():
    pool, release, finished = ThreadPoolExecutor(1), threading.Event(), []
    running = pool.submit(lambda: release.wait(timeout=60) and finished.append(True))
    queued = pool.submit(lambda: None)
    pool.shutdown(wait=False, cancel_futures=True)
    assert queued.cancelled() and not wait([queued], timeout=0.1).done   # plain wait() would never return
    threading.Timer(0.2, release.set).start()
    abandon([running, queued])
    assert running.done() and finished == [True]
