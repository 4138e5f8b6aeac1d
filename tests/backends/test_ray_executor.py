"""``loader.executor: ray``: the torchvision backend's per-sample core in Ray tasks on a cluster of 2
CPUs on 127.0.0.1 gives the batches of local workers bit for bit, over folders, shards (local and at
a URL) and Parquet; two ranks share the cluster and take every sample once; a state saved mid-epoch
resumes exactly, on the cluster or on local workers; a worker killed mid-batch costs a retry."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from dali_bridge import build_loader
from dali_bridge.backends.ray_executor import RayExecutor
from dali_bridge.loader.loader import Loader
from dali_bridge.tools.compare import compare
from tests.helpers.paths import TRAIN, VAL
from tests.helpers.ray_cluster import kill, ray_cluster, running_batch_workers
from tests.helpers.remote_sources import http_tree, local_tree, remote_source  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow

SMALL = {"ops.0.random_resized_crop.size": 48}
OUTPUTS = ["image", "label", "index", "valid"]


@pytest.fixture(scope="module", autouse=True)
def cluster():
    with ray_cluster() as running:
        yield running


def loader_for(source: dict, executor: str, *, pipeline: Path = TRAIN, **extra: Any) -> Loader:
    overrides = {"source": source, "batch_size": 6, "loader.workers": 0 if executor == "processes" else 2,
                 "loader.executor": executor, "outputs": OUTPUTS, **extra}
    return build_loader(pipeline, "torchvision", overrides=overrides)


def batches(loader: Loader, limit: int | None = None) -> list[tuple[torch.Tensor, ...]]:
    out = []
    for batch in loader:
        out.append(tuple(value.clone() for value in batch))
        if limit is not None and len(out) == limit:
            break
    return out


def assert_same(got: list, expected: list) -> None:
    assert len(got) == len(expected)
    for number, (ours, theirs) in enumerate(zip(got, expected)):
        for value, reference in zip(ours, theirs):
            assert value.dtype == reference.dtype and torch.equal(value, reference), f"batch {number}"


def folder(root: Path) -> dict:
    return {"type": "folder", "root": str(root)}


@pytest.mark.parametrize("pipeline", [TRAIN, VAL], ids=["train", "val"])
def test_ray_gives_the_batches_of_local_workers_over_a_folder(sample_root, pipeline):
    with loader_for(folder(sample_root), "processes", pipeline=pipeline) as local, \
            loader_for(folder(sample_root), "ray", pipeline=pipeline) as ray:
        for _ in range(2):  # two epochs: other orders and draws
            assert_same(batches(ray), batches(local))
        figures = ray.stats()["executor"]
        assert figures["executor"] == "ray" and figures["batches"] == 2 * len(ray)
        assert figures["batches_in_flight"] == 2 * figures["cpus"]
        assert figures["object_store_bytes_bound"] == figures["batches_in_flight"] * 6 * 3 * ray.plan.output_size[0] \
            * ray.plan.output_size[1]


@pytest.mark.parametrize("kind", ["shards", "parquet"])
def test_ray_gives_the_batches_of_local_workers_over_shards_and_parquet(local_tree, kind):  # noqa: F811
    source = remote_source(kind, str(local_tree))
    with loader_for(source, "processes", **SMALL) as local, loader_for(source, "ray", **SMALL) as ray:
        assert_same(batches(ray), batches(local))


def test_ray_gives_the_batches_of_local_workers_over_shards_at_a_url(http_tree):  # noqa: F811
    source = remote_source("shards", http_tree)
    with loader_for(source, "processes", **SMALL) as local, loader_for(source, "ray", **SMALL) as ray:
        assert_same(batches(ray), batches(local))


def test_two_ranks_on_one_cluster_take_every_sample_once_as_local_workers_would(sample_root):
    ranks = [build_loader(TRAIN, "torchvision", rank=rank, world_size=2, overrides={
        "source": folder(sample_root), "batch_size": 4, "loader.executor": "ray", "outputs": OUTPUTS,
        "loader.ray": {"cpus": 1}, **SMALL}) for rank in (0, 1)]
    local = [build_loader(TRAIN, "torchvision", rank=rank, world_size=2, overrides={
        "source": folder(sample_root), "batch_size": 4, "loader.workers": 0, "outputs": OUTPUTS, **SMALL})
        for rank in (0, 1)]
    try:
        iterators = [iter(loader) for loader in ranks]
        got: list[list] = [[], []]
        for step in range(len(ranks[0])):  # the ranks step together, as torchrun's do
            for rank in (0, 1):
                got[rank].append(tuple(value.clone() for value in next(iterators[rank])))
        seen = torch.cat([batch[2] for rank in (0, 1) for batch in got[rank]])
        valid = torch.cat([batch[3] for rank in (0, 1) for batch in got[rank]])
        assert sorted(seen[valid].tolist()) == list(range(len(ranks[0].listing)))
        for rank in (0, 1):
            assert_same(got[rank], batches(local[rank]))
    finally:
        for loader in ranks + local:
            loader.close()


def test_a_state_saved_mid_epoch_resumes_exactly_on_the_cluster_and_on_local_workers(sample_root):
    with loader_for(folder(sample_root), "processes", **SMALL) as whole:
        expected = batches(whole)
    with loader_for(folder(sample_root), "ray", **SMALL) as first:
        iteration = iter(first)
        head = [tuple(value.clone() for value in next(iteration)) for _ in range(3)]
        state = first.state_dict()
    assert_same(head, expected[:3])
    for executor in ("ray", "processes", "threads"):
        with loader_for(folder(sample_root), executor, **SMALL) as resumed:
            resumed.load_state_dict(state)
            assert_same(batches(resumed), expected[3:])
    # at another world size: the two ranks share the rest of the epoch
    rest = []
    for rank in (0, 1):
        with build_loader(TRAIN, "torchvision", rank=rank, world_size=2, overrides={
                "source": folder(sample_root), "batch_size": 6, "loader.executor": "ray", "outputs": OUTPUTS,
                **SMALL}) as resumed:
            resumed.load_state_dict(state)
            rest += [index for batch in batches(resumed) for index in batch[2].tolist()]
    assert sorted(rest) == sorted(torch.cat([batch[2] for batch in expected[3:]]).tolist())


def test_a_worker_killed_mid_batch_costs_a_retry_not_a_sample(sample_root):
    extra = {"ops.0.random_resized_crop.size": 160, "batch_size": 12}
    with loader_for(folder(sample_root), "processes", **extra) as local:
        expected = batches(local) + batches(local)
    killed: list[int] = []
    done = threading.Event()

    def killer() -> None:  # the first worker seen making a batch, killed while it does
        while not done.is_set() and not killed:
            for pid in running_batch_workers():
                if kill(pid):
                    killed.append(pid)
                    break

    with loader_for(folder(sample_root), "ray", **extra) as ray:
        batches(ray)  # the workers started: the kill lands in a batch, not in start-up
        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        try:
            got = batches(ray)
        finally:
            done.set()
            thread.join()
    assert killed, "no worker was found making a batch"
    assert_same(got, expected[len(got):])


def test_compare_accepts_the_executor(sample_root):
    result = compare(TRAIN, ("torchvision", "torchvision:ray"), batches=2, overrides={
        "source": folder(sample_root), "batch_size": 4, "loader.workers": 0, **SMALL})
    assert result.passed and result.backends == ("torchvision", "torchvision:ray")
    assert all(output.max_abs == 0 for output in result.outputs)


def test_no_more_batches_than_the_window_are_in_flight(sample_root, monkeypatch):
    in_flight: list[int] = []
    submit = RayExecutor._submit

    def recorded(self, ray, queue, pending) -> None:
        submit(self, ray, queue, pending)
        in_flight.append(len(pending))

    monkeypatch.setattr(RayExecutor, "_submit", recorded)
    # 4 CPUs asked of a cluster of 2: only the window holds the submissions back
    with loader_for(folder(sample_root), "ray", **SMALL, **{"loader.ray": {"cpus": 4, "batches_in_flight": 3}}) as ray:
        assert len(batches(ray)) == len(ray)
        assert ray.stats()["executor"]["batches_in_flight"] == 3
    assert max(in_flight) == 3
