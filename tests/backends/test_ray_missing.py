"""Without Ray installed, ``loader.executor: ray`` stops before anything starts, naming the extra
that installs it; a DALI backend asked to run with it is refused with what to set instead."""
from __future__ import annotations

import sys

import pytest

from dali_bridge import build_loader
from dali_bridge.loader.placement import placement
from dali_bridge.loader.select import BackendUnavailable, choose_backend
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.spec.pipeline import load_spec
from tests.helpers.paths import TRAIN


def test_a_missing_ray_names_the_extra(monkeypatch, sample_root):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as where it is not installed
    with pytest.raises(BackendUnavailable, match=r"pip install 'dali-bridge\[ray\]'"):
        build_loader(TRAIN, overrides={"source": {"type": "folder", "root": str(sample_root)},
                                       "loader.executor": "ray"})


@pytest.mark.parametrize("backend", ["dali", "dali-cpu"])
def test_a_dali_backend_with_the_ray_executor_is_refused_saying_what_to_set(backend):
    with pytest.raises(BackendUnavailable, match="set backend: torchvision"):
        choose_backend(backend, executor="ray")


def test_show_places_the_per_sample_stages_in_ray_tasks_and_the_finish_here():
    stages = placement(build_plan(load_spec(TRAIN)), "torchvision", executor="ray")
    assert stages[0].implementation == "Ray task: file read"
    assert any(stage.stage == "batch" and "object store" in stage.implementation for stage in stages)
    assert stages[-1].device == "cpu"
