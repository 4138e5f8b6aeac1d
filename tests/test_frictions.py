"""A new user's first hour: each rough edge they hit answers with what is wrong and what to do."""
from __future__ import annotations

import json

import pytest

from conftest import TRAIN, VAL, backend_params
from dali_bridge.backends import base
from dali_bridge.cli import main


# ---- workers: auto is this rank's share of the node's cores

@pytest.fixture
def cores_96(monkeypatch):
    monkeypatch.setattr(base.os, "sched_getaffinity", lambda pid: set(range(96)), raising=False)


def test_auto_workers_split_the_cores_among_the_ranks_of_a_node(monkeypatch, cores_96):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    share = base.worker_share()
    assert (share.workers, share.cores, share.local_world_size) == (12, 96, 8)
    assert base.default_workers() == 12
    assert share.explain() == "12 = 96 cores ÷ 8 processes on this node (LOCAL_WORLD_SIZE)"


def test_auto_workers_take_every_core_outside_torchrun(monkeypatch, cores_96):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert base.default_workers() == 96
    assert "(LOCAL_WORLD_SIZE unset)" in base.worker_share().reason()


def test_auto_workers_are_at_least_one_and_a_bad_local_world_size_is_named(monkeypatch):
    monkeypatch.setattr(base.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert base.worker_share().workers == 1
    assert base.worker_share().reason().endswith(", at least 1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "eight")
    share = base.worker_share()
    assert share.workers == 2 and "LOCAL_WORLD_SIZE='eight' is not a positive integer, read as 1" in share.reason()


@pytest.mark.parametrize("backend", backend_params(["torchvision", "dali-cpu"]))
def test_loaders_built_under_torchrun_start_the_rank_share_of_workers(monkeypatch, cores_96, sample_root, backend):
    from dali_bridge.loader import build_loader

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    overrides = {"source.root": str(sample_root), "batch_size": 4}
    with build_loader(VAL, backend, overrides=overrides, rank=0, world_size=1) as loader:
        executor = loader._executor
        assert (executor.workers if backend == "torchvision" else executor.threads) == 12


def test_show_and_doctor_state_the_auto_figure_and_why(monkeypatch, capsys, cores_96):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert main(["show", str(TRAIN)]) == 0
    out = capsys.readouterr().out
    assert "workers: null" not in out and "workers: auto," in out
    assert "# loader.workers: auto (24): 96 cores ÷ 4 processes on this node (LOCAL_WORLD_SIZE)" in out
    assert main(["doctor", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["cpu_cores_available"] == 96
    assert info["workers_auto"] == "24 = 96 cores ÷ 4 processes on this node (LOCAL_WORLD_SIZE)"
