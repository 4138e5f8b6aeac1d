"""``loader.executor: ray`` through Ray Client: ``loader.ray.address: ray://host:port`` connects the
loader through a head's Ray Client server (the trainer needs no route to the nodes), and the batches
are the ``torchvision`` backend's on local workers bit for bit; a head gone mid-epoch ends the
iteration with the error naming the address, and the state saved there resumes on local workers."""
from __future__ import annotations

import pytest
import torch

from dali_bridge import build_loader
from dali_bridge.backends.ray_executor import RayClusterError
from tests.helpers.paths import TRAIN
from tests.helpers.ray_cluster import free_port, ray_cluster

pytestmark = pytest.mark.slow

BATCHES = 2


def overrides(sample_root, executor: str) -> dict:
    return {"source": {"type": "folder", "root": str(sample_root)}, "batch_size": 4,
            "outputs": ["image", "label", "index"], "ops.0.random_resized_crop.size": 48,
            "loader.executor": executor, "loader.workers": 0 if executor == "processes" else 2}


def first_batches(loader) -> list[tuple[torch.Tensor, ...]]:
    out = []
    for batch in loader:
        out.append(tuple(value.clone() for value in batch))
        if len(out) == BATCHES:
            break
    return out


def test_a_ray_client_address_gives_the_batches_of_local_workers(sample_root):
    import ray

    with build_loader(TRAIN, "torchvision", overrides=overrides(sample_root, "processes")) as local:
        expected = first_batches(local)
    port = free_port()
    address = f"ray://127.0.0.1:{port}"
    with ray_cluster(client_port=port):
        assert not ray.is_initialized()  # the loader makes the connection, from its address alone
        with build_loader(TRAIN, "torchvision", overrides={
                **overrides(sample_root, "ray"), "loader.ray": {"address": address}}) as loader:
            got = first_batches(loader)
            assert ray.util.client.ray.is_connected(), "the loader did not connect through Ray Client"
            figures = loader.stats()["executor"]
    assert figures["address"] == address and figures["batches"] == BATCHES
    assert figures["cpus"] == 2  # the cluster's CPUs, as the client server reports them
    assert len(got) == len(expected) == BATCHES
    for number, (ours, theirs) in enumerate(zip(got, expected)):
        for value, reference in zip(ours, theirs):
            assert value.dtype == reference.dtype and torch.equal(value, reference), f"batch {number}"


def test_a_head_gone_behind_a_ray_client_address_ends_the_epoch_naming_it_and_the_state_resumes_locally(
        sample_root, monkeypatch):
    import ray

    # How long Ray Client tries to reconnect before it gives up (30 s unless told), read when it connects.
    monkeypatch.setenv("RAY_CLIENT_RECONNECT_GRACE_PERIOD", "2")
    with build_loader(TRAIN, "torchvision", overrides=overrides(sample_root, "processes")) as local:
        expected = [tuple(value.clone() for value in batch) for batch in local]
    port = free_port()
    address = f"ray://127.0.0.1:{port}"
    with ray_cluster(client_port=port) as cluster:
        loader = build_loader(TRAIN, "torchvision", overrides={
            **overrides(sample_root, "ray"), "loader.ray": {"address": address, "batches_in_flight": 2}})
        iteration = iter(loader)
        got = first_batches(iteration)
        cluster.head_node.kill_all_processes(check_alive=False, allow_graceful=False)
        with pytest.raises(RayClusterError, match=f"the Ray cluster at {address} is gone") as caught:
            for batch in iteration:
                got.append(tuple(value.clone() for value in batch))
        assert "resume it on local workers" in str(caught.value)
        # the lost client is shut down: this process can connect to a restarted cluster
        assert ray.util.client.num_connected_contexts() == 0 and not ray.is_initialized()
        state = loader.state_dict()
        loader.close()
    assert state["batch"] == len(got) >= BATCHES
    with build_loader(TRAIN, "torchvision", overrides=overrides(sample_root, "processes")) as resumed:
        resumed.load_state_dict(state)
        got += [tuple(value.clone() for value in batch) for batch in resumed]
    assert len(got) == len(expected)
    for number, (ours, theirs) in enumerate(zip(got, expected)):
        assert all(torch.equal(value, reference) for value, reference in zip(ours, theirs)), f"batch {number}"
