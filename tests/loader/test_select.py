"""`backend: auto` and explicit backends: every choice and every refusal comes with its reason.

Each host situation is simulated: by constructing the probe's answer directly, by making the
real probe meet a missing or broken DALI / a missing CUDA, or by ``DALI_BRIDGE_DISABLE``.
"""
from __future__ import annotations

import builtins
import dataclasses
import json
import logging
import os
from pathlib import Path

import pytest

from tests.helpers.paths import TRAIN
from dali_bridge import build_loader
from dali_bridge.loader import select
from dali_bridge.loader.select import (BackendUnavailable, Probe, available_backends, choose_backend, probe,
    unavailable_reason)

FULL = Probe(dali_version="2.4.0", dali_reason=None, cuda_devices=2, cuda_reason=None, torchvision_reason=None)
NO_DALI = dataclasses.replace(FULL, dali_version=None,
                              dali_reason="DALI not installed: pip install 'dali-bridge[cuda13]' adds it")
BROKEN_DALI = dataclasses.replace(FULL, dali_version=None,
                                  dali_reason="DALI failed to import: OSError: libnvjpeg.so.12: cannot open shared "
                                              "object file")
NO_CUDA = dataclasses.replace(FULL, cuda_devices=0, cuda_reason="no CUDA device")
NO_LIBCUDA = dataclasses.replace(FULL, cuda_reason="DALI 2.4.0 cannot load libcuda")
NOTHING = dataclasses.replace(NO_DALI, torchvision_reason="torchvision failed to import: No module named 'torchvision'")


@pytest.fixture
def fresh_probe():
    """Clear the once-per-process probe before and after a test that changes what it sees."""
    probe.cache_clear()
    yield probe
    probe.cache_clear()


def small(root: Path, **extra):
    return {"source": {"type": "folder", "root": str(root)}, "batch_size": 4, "loader.workers": 0,
            "ops.0.random_resized_crop.size": 32, **extra}


# ---------------------------------------------------------------------------------------------
# auto, from the probe's answer


def test_auto_picks_dali_with_dali_and_a_cuda_device():
    choice = choose_backend("auto", FULL)
    assert choice.backend == "dali"
    assert choice.reason == "auto: DALI 2.4.0 and 2 CUDA device(s) found"


@pytest.mark.parametrize("host,why", [
    (NO_DALI, "DALI not installed: pip install 'dali-bridge[cuda13]' adds it"),
    (BROKEN_DALI, "DALI failed to import: OSError: libnvjpeg.so.12"),
    (NO_CUDA, "no CUDA device"),
    (NO_LIBCUDA, "DALI 2.4.0 cannot load libcuda"),
], ids=["no-dali", "broken-dali", "no-cuda", "dali-without-libcuda"])
def test_auto_falls_back_to_torchvision_and_says_why(host, why):
    choice = choose_backend("auto", host)
    assert choice.backend == "torchvision"
    assert choice.reason.startswith("auto: torchvision fallback (") and why in choice.reason


def test_auto_with_nothing_usable_names_every_reason():
    with pytest.raises(BackendUnavailable) as info:
        choose_backend("auto", NOTHING)
    message = str(info.value)
    assert "no backend can run here" in message and "DALI not installed" in message
    assert "No module named 'torchvision'" in message


@pytest.mark.parametrize("host,backend,why", [
    (NO_CUDA, "dali", "no CUDA device"),
    (NO_LIBCUDA, "dali", "DALI 2.4.0 cannot load libcuda"),
    (NO_DALI, "dali-cpu", "DALI not installed"),
    (BROKEN_DALI, "dali", "DALI failed to import"),
    (NOTHING, "torchvision", "No module named 'torchvision'"),
])
def test_an_explicit_backend_that_cannot_run_raises_instead_of_falling_back(host, backend, why):
    with pytest.raises(BackendUnavailable, match=f"backend '{backend}' cannot run here: .*{why}"):
        choose_backend(backend, host)


def test_an_explicit_backend_that_can_run_is_used_as_asked():
    assert choose_backend("torchvision", FULL).backend == "torchvision"
    choice = choose_backend("dali-cpu", NO_CUDA)
    assert choice == select.Choice("dali-cpu", "backend 'dali-cpu' requested explicitly")


def test_available_backends_follow_the_host():
    assert available_backends(FULL) == ["dali", "dali-cpu", "torchvision"]
    assert available_backends(NO_CUDA) == ["dali-cpu", "torchvision"]
    assert available_backends(NO_DALI) == ["torchvision"]
    assert unavailable_reason("dali-cpu", NO_LIBCUDA) is None   # DALI's CPU mode needs no libcuda


def test_an_unknown_backend_name_is_refused():
    with pytest.raises(BackendUnavailable, match="unknown backend 'cuda' .*dali, dali-cpu, torchvision"):
        choose_backend("cuda", FULL)


# ---------------------------------------------------------------------------------------------
# The real probe, meeting each missing piece


def _block_import(monkeypatch, module: str, error: Exception) -> None:
    real_import = builtins.__import__

    def fake_import(name, *args, **kwargs):
        if name == module or name.startswith(module + "."):
            raise error
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", fake_import)


def test_probe_reports_dali_not_installed(monkeypatch, fresh_probe):
    _block_import(monkeypatch, "nvidia.dali", ModuleNotFoundError("No module named 'nvidia.dali'", name="nvidia.dali"))
    host = fresh_probe()
    assert host.dali_version is None
    assert host.dali_reason.startswith("DALI not installed: pip install 'dali-bridge[cuda")
    assert choose_backend("auto", host).backend == "torchvision"


def test_probe_reports_a_broken_dali_install(monkeypatch, fresh_probe):
    _block_import(monkeypatch, "nvidia.dali", OSError("libcudart.so.12: cannot open shared object file"))
    host = fresh_probe()
    assert host.dali_reason == "DALI failed to import: OSError: libcudart.so.12: cannot open shared object file"
    with pytest.raises(BackendUnavailable, match="backend 'dali-cpu' cannot run here: DALI failed to import"):
        choose_backend("dali-cpu", host)


@pytest.mark.parametrize("error", [
    ImportError("libnvimgcodec.so.0: cannot open shared object file", name="nvidia.dali.backend_impl"),
    ModuleNotFoundError("No module named 'astunparse'", name="astunparse"),
], ids=["library-it-loads", "module-it-needs"])
def test_probe_says_dali_failed_to_import_when_what_is_missing_is_not_dali_itself(monkeypatch, fresh_probe, error):
    _block_import(monkeypatch, "nvidia.dali", error)
    host = fresh_probe()
    assert host.dali_reason == f"DALI failed to import: {type(error).__name__}: {error}"
    assert "not installed" not in host.dali_reason


def test_probe_reports_no_cuda_device(monkeypatch, fresh_probe):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    host = fresh_probe()
    assert host.cuda_devices == 0 and host.cuda_reason == "no CUDA device"


def test_probe_reports_dali_that_cannot_load_libcuda(monkeypatch, fresh_probe):
    pytest.importorskip("nvidia.dali.backend", reason="needs DALI installed to simulate its CUDA loading")
    import torch
    from nvidia.dali import backend as dali_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(dali_backend, "GetCudaVersion", lambda: 0)   # what DALI answers without libcuda
    host = fresh_probe()
    assert host.cuda_reason == f"DALI {host.dali_version} cannot load libcuda"
    choice = choose_backend("auto", host)
    assert choice.backend == "torchvision" and "cannot load libcuda" in choice.reason


DRIVER_TOO_OLD = ("DALI 2.4.0 (nvidia-dali-cuda130 2.4.0) cannot run a GPU pipeline with this driver (CUDA 12.2): "
                  "RuntimeError: CUDA driver version is insufficient for CUDA runtime version")
NO_GPU_PIPELINE = dataclasses.replace(FULL, dali_gpu_reason=DRIVER_TOO_OLD)


def test_auto_falls_back_to_torchvision_when_the_gpu_pipeline_cannot_be_built():
    choice = choose_backend("auto", NO_GPU_PIPELINE)
    assert choice.backend == "torchvision" and choice.reason == f"auto: torchvision fallback ({DRIVER_TOO_OLD})"


def test_forced_dali_that_cannot_build_its_gpu_pipeline_names_the_driver_and_dali_build():
    with pytest.raises(BackendUnavailable) as info:
        choose_backend("dali", NO_GPU_PIPELINE)
    assert str(info.value) == f"backend 'dali' cannot run here: {DRIVER_TOO_OLD}"
    assert choose_backend("dali-cpu", NO_GPU_PIPELINE).backend == "dali-cpu"   # the CPU pipeline is unaffected


def test_probe_builds_a_tiny_gpu_pipeline_once_per_process_and_reports_its_failure(monkeypatch, fresh_probe):
    pytest.importorskip("nvidia.dali.backend", reason="needs DALI installed to simulate a driver it cannot use")
    import torch
    from nvidia.dali import backend as dali_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(dali_backend, "GetCudaVersion", lambda: 12020)   # libcuda loads: the old probe passed
    builds = []

    def too_new_for_the_driver() -> None:
        builds.append(1)
        raise RuntimeError("CUDA error\nCUDA driver version is insufficient for CUDA runtime version")

    monkeypatch.setattr(select, "_build_tiny_gpu_pipeline", lambda device_id: too_new_for_the_driver())
    select.gpu_pipeline_reason.cache_clear()
    try:
        host = fresh_probe()
        assert choose_backend("torchvision", host).backend == "torchvision" and builds == []  # GPU untouched
        reason = unavailable_reason("dali", host)
        assert host.cuda_reason is None and reason is not None
        assert reason.startswith(f"DALI {host.dali_version} (nvidia-dali")
        assert ("with this driver (CUDA 12.2) on cuda:0: RuntimeError: CUDA error CUDA driver version is "
                "insufficient") in reason
        assert choose_backend("auto", host).backend == "torchvision"
        with pytest.raises(BackendUnavailable, match="cannot run a GPU pipeline with this driver"):
            choose_backend("dali", host)
        probe.cache_clear()
        assert unavailable_reason("dali", fresh_probe()) == reason
        assert builds == [1]                             # built once per process, however often asked
    finally:
        select.gpu_pipeline_reason.cache_clear()


def fake_gpu_node(monkeypatch, devices: int) -> list[int]:
    """A DALI host with ``devices`` GPUs and no remembered probe answer; returns a list for the
    devices the tiny pipeline is built on."""
    pytest.importorskip("nvidia.dali.backend", reason="needs DALI installed to simulate a GPU node")
    import torch
    from nvidia.dali import backend as dali_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: devices)
    monkeypatch.setattr(dali_backend, "GetCudaVersion", lambda: 12080)
    select.gpu_pipeline_reason.cache_clear()
    return []


def test_the_gpu_pipeline_probe_runs_on_the_ranks_own_device(monkeypatch, fresh_probe):
    built_on = fake_gpu_node(monkeypatch, devices=8)
    monkeypatch.setattr(select, "_build_tiny_gpu_pipeline", built_on.append)
    try:
        for local_rank in ("3", "11"):   # 11 on 8 visible devices: the loader's own wrap, cuda:3
            monkeypatch.setenv("LOCAL_RANK", local_rank)
            assert unavailable_reason("dali", fresh_probe()) is None
        monkeypatch.setenv("LOCAL_RANK", "5")
        assert unavailable_reason("dali", fresh_probe()) is None
    finally:
        select.gpu_pipeline_reason.cache_clear()
    assert built_on == [3, 5]   # never GPU 0; once per device


def test_the_gpu_pipeline_probe_with_a_malformed_rank_probes_gpu_0_and_leaves_the_error_to_the_loader(
        monkeypatch, fresh_probe):
    built_on = fake_gpu_node(monkeypatch, devices=2)
    monkeypatch.setattr(select, "_build_tiny_gpu_pipeline", built_on.append)
    monkeypatch.setenv("RANK", "abc")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    try:
        assert unavailable_reason("dali", fresh_probe()) is None
    finally:
        select.gpu_pipeline_reason.cache_clear()
    assert built_on == [0]


def test_a_transient_gpu_pipeline_failure_is_reported_and_not_remembered(monkeypatch, fresh_probe, caplog):
    built_on = fake_gpu_node(monkeypatch, devices=1)

    def out_of_memory_once(device_id: int) -> None:
        built_on.append(device_id)
        if len(built_on) == 1:
            raise RuntimeError("CUDA error: out of memory (cudaErrorMemoryAllocation)")

    monkeypatch.setattr(select, "_build_tiny_gpu_pipeline", out_of_memory_once)
    try:
        with caplog.at_level(logging.WARNING, logger="dali_bridge"):
            reason = unavailable_reason("dali", fresh_probe())
        assert reason is not None and "out of memory" in reason and "this may pass: not remembered" in reason
        assert any("out of memory" in r.getMessage() for r in caplog.records)
        assert unavailable_reason("dali", fresh_probe()) is None   # asked again: the memory is back
        assert unavailable_reason("dali", fresh_probe()) is None   # a lasting answer: not built a third time
    finally:
        select.gpu_pipeline_reason.cache_clear()
    assert built_on == [0, 0]


@pytest.mark.parametrize("disabled,expected", [
    ("dali", ["torchvision"]),
    ("cuda", ["dali-cpu", "torchvision"]),
    ("cuda, torchvision", ["dali-cpu"]),
])
def test_dali_bridge_disable_simulates_absences(monkeypatch, fresh_probe, disabled, expected):
    monkeypatch.setenv("DALI_BRIDGE_DISABLE", disabled)
    host = fresh_probe()
    if host.dali_reason and "DALI_BRIDGE_DISABLE" not in host.dali_reason:
        expected = [b for b in expected if not b.startswith("dali")]   # DALI missing on this host anyway
    assert available_backends() == expected
    if "dali" in disabled.split(","):
        assert host.dali_reason == "DALI disabled by DALI_BRIDGE_DISABLE"


def test_disabled_dali_makes_an_explicit_dali_cpu_loader_fail_with_the_reason(monkeypatch, fresh_probe, sample_root):
    monkeypatch.setenv("DALI_BRIDGE_DISABLE", "dali")
    with pytest.raises(BackendUnavailable, match="backend 'dali-cpu' cannot run here: DALI disabled by "
                                                 "DALI_BRIDGE_DISABLE"):
        build_loader(TRAIN, "dali-cpu", overrides=small(sample_root))
    loader = build_loader(TRAIN, "auto", overrides=small(sample_root))
    assert loader.backend == "torchvision" and "DALI disabled" in loader.backend_reason


def test_disabled_cuda_keeps_the_torchvision_loader_on_the_cpu(monkeypatch, fresh_probe, sample_root):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)   # a GPU host...
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("DALI_BRIDGE_DISABLE", "cuda")               # ...told to act as a CPU-only one
    loader = build_loader(TRAIN, "torchvision", overrides=small(sample_root))
    assert loader.device == torch.device("cpu")
    assert next(iter(loader))[0].device == torch.device("cpu")


# ---------------------------------------------------------------------------------------------
# Forcing a backend: YAML, API, CLI; the one log line


def _need(backend: str) -> None:
    reason = unavailable_reason(backend)
    if reason:
        pytest.skip(f"{backend}: {reason}")


def test_backend_forced_from_the_yaml_key(sample_root, write_pipeline):
    _need("dali-cpu")
    path = write_pipeline(TRAIN, backend="dali-cpu")
    loader = build_loader(path, overrides=small(sample_root))
    assert loader.backend == "dali-cpu" and loader.backend_reason == "backend 'dali-cpu' requested explicitly"


def test_api_argument_beats_the_yaml_key(sample_root, write_pipeline):
    _need("torchvision")
    path = write_pipeline(TRAIN, backend="dali-cpu")
    assert build_loader(path, "torchvision", overrides=small(sample_root)).backend == "torchvision"


def test_yaml_backend_that_cannot_run_fails_with_the_reason(monkeypatch, fresh_probe, sample_root, write_pipeline):
    monkeypatch.setenv("DALI_BRIDGE_DISABLE", "cuda")
    path = write_pipeline(TRAIN, backend="dali")
    with pytest.raises(BackendUnavailable, match="backend 'dali' cannot run here: "):
        build_loader(path, overrides=small(sample_root))


def test_backend_forced_from_the_cli(sample_root, capsys, tmp_path):
    _need("torchvision")
    from dali_bridge.cli.main import main

    out = tmp_path / "rows.json"
    code = main(["run", str(TRAIN), "--data", str(sample_root), "--backends", "auto", "--set", "backend=torchvision",
                 "--set", "batch_size=4", "--set", "loader.workers=0", "--batches", "2", "-q", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = json.loads(out.read_text())
    assert [(r["backend"], r["batches"], r["images"]) for r in rows] == [("torchvision", 2, 8)]


def test_the_choice_is_logged_in_one_line(monkeypatch, fresh_probe, sample_root, caplog):
    monkeypatch.setenv("DALI_BRIDGE_DISABLE", "cuda")
    with caplog.at_level(logging.INFO, logger="dali_bridge"):
        build_loader(TRAIN, overrides=small(sample_root))
    lines = [r.getMessage() for r in caplog.records if r.name == "dali_bridge" and "backend" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0] == ("dali-bridge imagenet-train: backend torchvision "
                        "(auto: torchvision fallback (CUDA disabled by DALI_BRIDGE_DISABLE))")
    assert "\n" not in lines[0]


# ---------------------------------------------------------------------------------------------
# Ops a backend cannot run fail at build time


def test_build_loader_rejects_an_op_the_backend_does_not_support(monkeypatch, sample_root):
    from dali_bridge.ops.registry import OPS

    monkeypatch.setitem(OPS, "horizontal_flip", dataclasses.replace(OPS["horizontal_flip"],
                                                                    backends=("dali", "dali-cpu")))
    with pytest.raises(BackendUnavailable) as info:
        build_loader(TRAIN, "torchvision", overrides=small(sample_root))
    message = str(info.value)
    assert str(TRAIN) in message
    assert "backend 'torchvision' cannot run this pipeline: ops[1] 'horizontal_flip' runs only on dali, dali-cpu" \
        in message


# ---------------------------------------------------------------------------------------------
# doctor


DOCTOR_KEYS = {"python", "platform", "cpu_cores_available", "cpu_cores_total", "torch", "torch_cuda_build",
               "torchvision", "dali", "cuda_devices", "nvjpeg_hardware_decoder", "backends", "auto_picks",
               "recommended"}


def test_doctor_report_says_what_auto_picks_and_why(monkeypatch, fresh_probe):
    from dali_bridge.tools.doctor import report

    monkeypatch.setenv("DALI_BRIDGE_DISABLE", "cuda")
    info = report()
    assert DOCTOR_KEYS <= set(info)
    assert info["auto_picks"] == "torchvision — auto: torchvision fallback (CUDA disabled by DALI_BRIDGE_DISABLE)"
    assert info["backends"]["dali"] == "CUDA disabled by DALI_BRIDGE_DISABLE"
    assert info["backends"]["torchvision"] == "available"
    assert info["cuda_devices"] == ["CUDA disabled by DALI_BRIDGE_DISABLE"]
    assert info["cpu_cores_available"] >= 1
    assert all(isinstance(v, int) and v >= 1 for v in info["recommended"].values())
    if info["dali"] and not str(info["dali"]).startswith("DALI"):
        assert "nvidia-dali" in info["dali_build"]


def test_doctor_command_prints_the_report_and_json(monkeypatch, fresh_probe, capsys):
    from dali_bridge.cli.main import main

    monkeypatch.setenv("DALI_BRIDGE_DISABLE", "cuda")
    assert main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert "auto picks" in text and "torchvision — auto: torchvision fallback" in text
    assert "loader.workers (DALI threads)" in text
    assert main(["doctor", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert DOCTOR_KEYS <= set(info)


def test_a_failed_cuda_probe_is_not_the_answer_of_a_later_process_or_other_settings(monkeypatch, fresh_probe):
    from dali_bridge.loader import select

    monkeypatch.setenv("DALI_BRIDGE_DISABLE", "dali")      # torch's CUDA alone, DALI's own check left out
    monkeypatch.setattr(select, "torch_cuda_devices", lambda: (0, "CUDA unusable: RuntimeError: driver busy"))
    assert fresh_probe().cuda_reason == "CUDA unusable: RuntimeError: driver busy"
    monkeypatch.setattr(select, "torch_cuda_devices", lambda: (1, None))   # the GPU works now
    assert fresh_probe().cuda_devices == 0                 # the same process and settings: asked once
    real_pid = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: real_pid + 1)  # a process forked after the failed probe
    assert (fresh_probe().cuda_devices, fresh_probe().cuda_reason) == (1, None)
    monkeypatch.setattr(os, "getpid", lambda: real_pid)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")         # other devices made visible: probed again
    assert fresh_probe().cuda_devices == 1
