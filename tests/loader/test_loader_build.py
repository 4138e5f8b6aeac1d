"""What build_loader does once per loader, and where its pieces live."""
from __future__ import annotations

import pytest

import dali_bridge.loader.loader as loader_module
from tests.helpers.paths import TRAIN
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
    from dali_bridge.loader.select import BackendUnavailable

    with pytest.raises(BackendUnavailable, match="device 'cuda:0' cannot be used here"):
        build_loader(TRAIN, "torchvision", device="cuda:0")


def test_a_torchvision_loader_neither_imports_nor_probes_dali(sample_root):
    # DALI's import costs a quarter of a second of the torchvision backend's first batch; a fresh
    # interpreter shows whether anything on that path (the backend choice, the executor's device) does it.
    import subprocess
    import sys

    script = ("import sys; from dali_bridge import build_loader\n"
              f"loader = build_loader({str(TRAIN)!r}, 'torchvision', overrides={{'source': {{'type': 'folder', "
              f"'root': {str(sample_root)!r}}}, 'batch_size': 4, 'loader.workers': 0}})\n"
              "next(iter(loader)); loader.close()\n"
              "print(sorted(name for name in sys.modules if name.startswith('nvidia.dali')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=str(TRAIN.parent.parent))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_auto_on_a_host_without_cuda_picks_torchvision_without_importing_dali(sample_root):
    # dali cannot be picked without a CUDA device, so DALI is looked up (installed or not), not imported.
    import os
    import subprocess
    import sys

    script = ("import sys; from dali_bridge import build_loader\n"
              f"loader = build_loader({str(TRAIN)!r}, 'auto', overrides={{'source': {{'type': 'folder', "
              f"'root': {str(sample_root)!r}}}, 'batch_size': 4, 'loader.workers': 0}})\n"
              "next(iter(loader)); loader.close()\n"
              "print(loader.backend, '|', loader.backend_reason)\n"
              "print(sorted(name for name in sys.modules if name.startswith('nvidia.dali')))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          cwd=str(TRAIN.parent.parent), env={**os.environ, "DALI_BRIDGE_DISABLE": "cuda"})
    assert done.returncode == 0, done.stderr
    chosen, modules = done.stdout.strip().splitlines()[-2:]
    assert chosen in ("torchvision | auto: torchvision fallback (CUDA disabled by DALI_BRIDGE_DISABLE)",
                      "torchvision | auto: torchvision fallback (DALI not installed: pip install "
                      "'dali-bridge[cuda13]' adds it)")
    assert modules == "[]"
