"""``benchmarks/device_check.sh``: its control flow, exercised on a CPU host by ``--dry-run``, so the
GPU check cannot rot while no GPU is around."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

SCRIPT = REPO / "benchmarks" / "device_check.sh"
NAMES = ["env", "data", "device", "errors", "equivalence", "pytest", "memory_bench"]


def dry_run(out: Path, budget: int) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "PYTHON": sys.executable, "CHECK_BUDGET_S": str(budget)}
    env.pop("OUT", None)
    run = subprocess.run(["bash", str(SCRIPT), "--dry-run", str(out)], capture_output=True, text=True, env=env,
                         timeout=budget + 60)
    return run, json.loads((out / "device_check.json").read_text())


def test_dry_run_runs_every_check_reports_the_gpu_ones_skipped_and_exits_0(tmp_path):
    run, report = dry_run(tmp_path / "out", budget=200)
    assert run.returncode == 0, run.stdout + run.stderr
    by_name = {check["name"]: check for check in report["checks"]}
    assert list(by_name) == NAMES and report["dry_run"] is True
    assert by_name["device"]["status"] == by_name["memory_bench"]["status"] == "skipped"
    assert by_name["device"]["reason"] == "dry run: no GPU used"
    ran = [name for name in NAMES if by_name[name]["status"] != "skipped"]
    assert all(by_name[name]["status"] == "passed" for name in ran), {n: by_name[n].get("reason") for n in ran}
    assert report["summary"] == {"passed": len(ran), "failed": 0, "skipped": len(NAMES) - len(ran)}
    if by_name["errors"]["status"] == "passed":   # raise yields the 2 batches before sample 9, skip keeps 23
        results = by_name["errors"]["results"]
        assert results["stand_in"] is True
        assert results["torchvision on cpu"] == {"raise_yielded": 2, "skip_kept": 23, "skipped": [9]}
    assert "device check: " in run.stdout and str(tmp_path / "out" / "device_check.json") in run.stdout


def load_module():
    spec = importlib.util.spec_from_file_location("device_check", REPO / "benchmarks" / "device_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_checks_past_the_budget_are_skipped_and_said_so_and_limits_shrink_to_what_is_left(tmp_path, monkeypatch):
    module = load_module()
    clock = [0.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: clock[0])
    limits = {}

    def fake_run(name, *args, timeout, **kwargs):
        limits[name] = timeout
        clock[0] += 50.0                                     # every check takes 50 s
        return {"seconds": 50.0, "status": "passed", "results": {}}

    monkeypatch.setattr(module, "run_in_process", fake_run)
    assert module.orchestrate(tmp_path, budget=120, dry_run=False, images=4, data=None) == 0
    report = json.loads((tmp_path / "device_check.json").read_text())
    assert [c["status"] for c in report["checks"]] == ["passed", "passed", "passed"] + ["skipped"] * 4
    assert report["checks"][3]["reason"] == "not run: 0 s of the 120 s budget left"
    assert limits == {"env": 60, "data": 70, "device": 20}   # each limit: its own, or what the budget has left


def test_exit_status_is_1_when_a_check_that_ran_failed(tmp_path, monkeypatch):
    module = load_module()
    outcomes = {"errors": {"status": "failed", "reason": "AssertionError: dali: yielded [] before the error"},
                "device": {"status": "skipped", "reason": "needs a CUDA device"}}
    monkeypatch.setattr(module, "run_in_process", lambda name, *a, **k: {"seconds": 0.0, **outcomes.get(
        name, {"status": "passed", "results": {}})})
    assert module.orchestrate(tmp_path, budget=100, dry_run=False, images=4, data=None) == 1
    report = json.loads((tmp_path / "device_check.json").read_text())
    assert report["summary"] == {"passed": 5, "failed": 1, "skipped": 1} and report["exit_status"] == 1
    monkeypatch.setattr(module, "run_in_process", lambda name, *a, **k: {"seconds": 0.0, "status": "skipped",
                                                                         "reason": "needs a CUDA device"})
    assert module.orchestrate(tmp_path, budget=100, dry_run=False, images=4, data=None) == 0


def test_the_bench_flags_the_check_uses_exist():
    text = subprocess.run([sys.executable, "-m", "dali_bridge.cli", "bench", "--help"], capture_output=True,
                          text=True, cwd=REPO).stdout
    for flag in ("--data", "--backends", "--baselines", "--batches", "--warmup", "--repeat", "--json", "-q"):
        assert f"{flag} " in text or f"{flag}," in text, f"dali-bridge bench has no {flag}: device_check.py uses it"
