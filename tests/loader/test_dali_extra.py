"""Where DALI is not installed, ``auto``'s reason (the loader's log line) and ``doctor`` name the one
install line that adds it: the dali-bridge extra for this host's CUDA major."""
from __future__ import annotations

import builtins

import pytest
import torch

from dali_bridge.loader import select
from dali_bridge.loader.select import choose_backend, dali_extra, dali_missing_reason, probe
from dali_bridge.tools.doctor import cuda_builds_pairing


@pytest.mark.parametrize("major,extra", [(12, "cuda12"), (13, "cuda13"), (None, "cuda13"), (11, "cuda12"),
                                         (14, "cuda13")])
def test_each_cuda_major_maps_to_the_extra_that_runs_on_it(major, extra):
    assert dali_extra(major) == extra


@pytest.fixture
def gpu_host_without_dali(monkeypatch):
    """torch built for CUDA 12.8 sees one device; ``import nvidia.dali`` fails as where it is absent."""
    real_import = builtins.__import__

    def no_dali(name, *args, **kwargs):
        if name == "nvidia.dali" or name.startswith("nvidia.dali."):
            raise ModuleNotFoundError("No module named 'nvidia.dali'", name="nvidia.dali")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_dali)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(select, "torch_cuda_devices", lambda: (1, None))
    monkeypatch.setattr(select, "torchvision_reason", lambda: None)  # its check reads the faked torch.version
    monkeypatch.delenv("DALI_BRIDGE_DISABLE", raising=False)
    probe.cache_clear()
    yield
    probe.cache_clear()


def test_auto_on_a_gpu_host_without_dali_names_the_extra_for_its_cuda(gpu_host_without_dali):
    choice = choose_backend("auto", probe())
    assert choice.backend == "torchvision"
    assert choice.reason == ("auto: torchvision fallback (DALI not installed: pip install 'dali-bridge[cuda12]' adds "
                             "its CUDA 12 build, the CUDA this host's torch and driver run)")


def test_a_cpu_host_without_dali_is_told_the_extra_without_a_driver_claim(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    assert dali_missing_reason(0) == "DALI not installed: pip install 'dali-bridge[cuda13]' adds it"


@pytest.mark.parametrize("torch_cuda,release,extra", [
    ("13.0", "580.65.06", "cuda13"),   # torch's CUDA, which the driver runs
    ("13.0", "550.54.15", "cuda12"),   # a driver that runs CUDA 12 only: DALI's CUDA 12 build runs there
    ("12.6", "580.65.06", "cuda12"),   # paired with torch (one CUDA runtime per process)
    (None, None, "cuda13"),            # a CPU build, no driver: either build runs dali-cpu
])
def test_doctor_names_the_extra_for_this_hosts_driver(torch_cuda, release, extra):
    line = cuda_builds_pairing(torch_cuda=torch_cuda, dali_builds=[], driver_release=release)
    assert line == f"no DALI installed (the dali and dali-cpu backends need it): pip install 'dali-bridge[{extra}]'"
