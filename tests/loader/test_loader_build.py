"""What build_loader does once per loader, and where its pieces live."""
from __future__ import annotations

import pytest

import dali_bridge.loader as loader_module
from conftest import TRAIN
from dali_bridge import build_loader


def test_the_plan_is_built_once_per_loader(sample_root, monkeypatch):
    built = []
    real = loader_module.build_plan

    def counting(spec):
        built.append(spec.name)
        return real(spec)

    monkeypatch.setattr(loader_module, "build_plan", counting)
    with build_loader(TRAIN, "torchvision", overrides={"source": {"type": "folder", "root": str(sample_root)},
                                                       "batch_size": 4, "loader.workers": 0}) as loader:
        assert loader.plan is not None
    assert len(built) == 1


def test_a_dataloader_keyword_names_the_pipeline_key_that_does_its_job():
    with pytest.raises(TypeError, match=r"'num_workers': a pipeline setting; pass overrides=\{\"loader.workers\": 4\}"):
        build_loader(TRAIN, "torchvision", num_workers=4)


def test_a_cuda_device_this_host_lacks_is_refused_before_any_executor(no_cuda):
    from dali_bridge.backends.select import BackendUnavailable

    with pytest.raises(BackendUnavailable, match="device 'cuda:0' cannot be used here"):
        build_loader(TRAIN, "torchvision", device="cuda:0")
