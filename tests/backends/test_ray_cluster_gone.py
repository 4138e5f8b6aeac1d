"""``loader.executor: ray`` when the cluster goes away mid-epoch: the iteration ends with an error
naming the cluster's address (not a wait without end, nor Ray ending the process), after the batches
already made, and the state saved there resumes the epoch on local workers."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dali_bridge import build_loader
from dali_bridge.backends.ray_executor import RayClusterError
from tests.helpers.paths import TRAIN
from tests.helpers.ray_cluster import ray_cluster

pytestmark = pytest.mark.slow

OVERRIDES = {"batch_size": 4, "outputs": ["image", "label", "index"], "ops.0.random_resized_crop.size": 48}


def overrides(root: Path, executor: str) -> dict:
    return {**OVERRIDES, "source": {"type": "folder", "root": str(root)}, "loader.executor": executor,
            "loader.workers": 0 if executor == "processes" else 2}


def test_a_cluster_gone_mid_epoch_ends_it_naming_the_address_and_the_state_resumes_locally(sample_root):
    with build_loader(TRAIN, "torchvision", overrides=overrides(sample_root, "processes")) as local:
        expected = [tuple(value.clone() for value in batch) for batch in local]
    with ray_cluster() as cluster:
        address = cluster.address
        loader = build_loader(TRAIN, "torchvision", overrides={
            **overrides(sample_root, "ray"), "loader.ray": {"address": address, "batches_in_flight": 2}})
        iteration = iter(loader)
        got = [tuple(value.clone() for value in next(iteration)) for _ in range(2)]
        cluster.head_node.kill_all_processes(check_alive=False, allow_graceful=False)
        with pytest.raises(RayClusterError, match=f"the Ray cluster at {address} is gone") as caught:
            for batch in iteration:
                got.append(tuple(value.clone() for value in batch))
        assert "resume it on local workers" in str(caught.value)
        state = loader.state_dict()
        loader.close()
    assert state["batch"] == len(got) >= 2
    for ours, theirs in zip(got, expected):
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    with build_loader(TRAIN, "torchvision", overrides=overrides(sample_root, "processes")) as resumed:
        resumed.load_state_dict(state)
        rest = [tuple(value.clone() for value in batch) for batch in resumed]
    assert len(got) + len(rest) == len(expected)
    for ours, theirs in zip(rest, expected[len(got):]):
        assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_an_address_where_no_cluster_runs_is_refused_naming_it(sample_root):
    pytest.importorskip("ray", reason="Ray is not installed: pip install 'dali-bridge[ray]'")
    loader = build_loader(TRAIN, "torchvision", overrides={
        **overrides(sample_root, "ray"), "loader.ray": {"address": "127.0.0.1:9"}})
    with pytest.raises(RayClusterError, match="cannot reach the Ray cluster at 127.0.0.1:9"):
        next(iter(loader))
    loader.close()
