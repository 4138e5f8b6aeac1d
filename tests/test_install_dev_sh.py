"""./dev.sh's install: `run` installs what running needs ([cuda12]), `test` and `lint` add the test
extras, both pinned by .ci/constraints.txt; the terminal gets a short summary, pip's whole log goes
to a file it names; a done install is not repeated; a failed one shows the log's end.

A stand-in venv (its python records what it is asked and answers like pip) keeps this to seconds."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

FAKE_PYTHON = """#!/usr/bin/env bash
echo "python $*" >> "$(dirname "$0")/../calls"
if [ "$2" = "pip" ]; then
  if [ -f "$(dirname "$0")/../fail" ]; then echo "ERROR: No matching distribution found for torch==9"; exit 1; fi
  for n in 1 2 3 4 5; do echo "Collecting package-$n"; done
  echo "Successfully installed dali-bridge-0.1.0 nvidia-dali-cuda120-2.4.0 pyyaml-6.0.4 torch-2.14.1 torchvision-0.29.1"
fi
"""
FAKE_TOOL = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$(dirname "$0")/../calls"
"""


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    root = tmp_path / "venv"
    (root / "bin").mkdir(parents=True)
    for name, text in (("python", FAKE_PYTHON), ("dali-bridge", FAKE_TOOL), ("ruff", FAKE_TOOL)):
        (root / "bin" / name).write_text(text)
        (root / "bin" / name).chmod(0o755)
    return root


def dev(venv: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(REPO / "dev.sh"), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "DALI_BRIDGE_VENV": str(venv)})


def calls(venv: Path) -> list[str]:
    return (venv / "calls").read_text().splitlines() if (venv / "calls").exists() else []


def test_run_installs_what_running_needs_with_a_short_summary(venv):
    done = dev(venv, "run")
    assert done.returncode == 0, done.stderr
    assert calls(venv)[0] == "python -m pip install --progress-bar off -c .ci/constraints.txt -e .[cuda12]"
    assert calls(venv)[1].startswith("dali-bridge sample-data data/sample")
    assert "Collecting" not in done.stderr  # pip's lines go to the log, not the terminal
    log = venv / "pip-install.log"
    assert f"pip's log: {log}" in done.stderr and "Collecting package-5" in log.read_text()
    summary = [line for line in done.stderr.splitlines() if "installed 5 package(s)" in line]
    assert len(summary) == 1 and summary[0].endswith(": nvidia-dali-cuda120-2.4.0 torch-2.14.1 torchvision-0.29.1")
    assert len(done.stderr.splitlines()) <= 6


def test_test_and_lint_add_the_test_extras_once(venv):
    assert dev(venv, "lint").returncode == 0
    assert calls(venv) == ["python -m pip install --progress-bar off -c .ci/constraints.txt -e .[test,cuda12]",
                           "ruff check ."]
    (venv / "calls").unlink()
    done = dev(venv, "test", "-q", "-k", "nothing")
    assert done.returncode == 0 and calls(venv) == ["python -m pytest -q -k nothing"]  # installed: not again
    (venv / "calls").unlink()
    assert dev(venv, "run").returncode == 0
    assert not any("-m pip" in call for call in calls(venv))  # the test install holds what running needs


def test_a_failed_install_shows_the_end_of_pips_log_and_where_it_is(venv):
    (venv / "fail").touch()
    done = dev(venv, "run")
    assert done.returncode == 1
    assert "ERROR: No matching distribution found for torch==9" in done.stderr
    assert f"the install failed (above: the end of pip's log; all of it: {venv / 'pip-install.log'})" in done.stderr
    assert not any(call.startswith("dali-bridge") for call in calls(venv))
    assert not list(venv.glob(".dali-bridge-installed*"))
