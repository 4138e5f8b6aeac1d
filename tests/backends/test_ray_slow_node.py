"""``loader.executor: ray`` with one slow batch: the cluster's other CPU makes the batches behind it
up to the in-flight window (never more), the loop waits only for the slow one, every batch comes in
order with the pixels of local workers, and ``loader.stats()["executor"]`` shows the stall."""
from __future__ import annotations

import pytest
import torch

from dali_bridge import build_loader
from dali_bridge.backends import ray_executor
from dali_bridge.backends.ray_executor import RayExecutor
from tests.helpers.paths import TRAIN
from tests.helpers.ray_cluster import ray_cluster, slowed_make_batch, stamped

pytestmark = pytest.mark.slow

SLOW = 2          # the slow batch (not the first: an iteration's first wait is its start-up)
WINDOW = 4        # batches in flight
SECONDS = 2.0     # how long the slow batch takes once the window behind it is made


@pytest.fixture(scope="module", autouse=True)
def cluster():
    with ray_cluster() as running:
        yield running


def overrides(sample_root, executor: str) -> dict:
    return {"source": {"type": "folder", "root": str(sample_root)}, "batch_size": 4,
            "outputs": ["image", "label", "index"], "ops.0.random_resized_crop.size": 48,
            "loader.executor": executor, "loader.workers": 0 if executor == "processes" else 2}


def test_a_slow_batch_stalls_the_loop_only_for_itself_and_stats_show_the_stall(sample_root, tmp_path,
                                                                               monkeypatch):
    with build_loader(TRAIN, "torchvision", overrides=overrides(sample_root, "processes")) as local:
        expected = [tuple(value.clone() for value in batch) for batch in local]
    behind = list(range(SLOW + 1, SLOW + WINDOW))  # the rest of the window while SLOW is the next batch
    monkeypatch.setattr(ray_executor, "make_batch",
                        slowed_make_batch(slow=SLOW, until_made=behind, seconds=SECONDS, stamps=tmp_path))
    waits: list[float] = []
    count_wait = RayExecutor._count_wait

    def recorded(self, seconds: float, *, first: bool) -> None:
        waits.append(seconds)
        count_wait(self, seconds, first=first)

    monkeypatch.setattr(RayExecutor, "_count_wait", recorded)
    with build_loader(TRAIN, "torchvision", overrides={
            **overrides(sample_root, "ray"), "loader.ray": {"cpus": 2, "batches_in_flight": WINDOW}}) as loader:
        got = [tuple(value.clone() for value in batch) for batch in loader]
        figures = loader.stats()["executor"]

    assert len(got) == len(expected) > SLOW + WINDOW
    for number, (ours, theirs) in enumerate(zip(got, expected)):
        for value, reference in zip(ours, theirs):
            assert torch.equal(value, reference), f"batch {number}"
    # the window behind the slow batch was made while it was slow, and nothing beyond the window
    assert all(stamped(tmp_path, number, "end") < stamped(tmp_path, SLOW, "end") for number in behind)
    assert stamped(tmp_path, SLOW + WINDOW, "start") > stamped(tmp_path, SLOW, "end")
    # the loop waited for the slow batch, then took the window behind it without waiting on the cluster
    assert waits[SLOW] >= SECONDS - 0.05
    assert all(wait < SECONDS / 4 for wait in waits[SLOW + 1:SLOW + WINDOW]), waits
    assert figures["batches"] == len(got) and figures["stalls"] >= 1
    assert figures["longest_stall_s"] >= waits[SLOW]
    assert figures["stall_s"] >= figures["longest_stall_s"]
