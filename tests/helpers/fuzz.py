"""Running the decode-fuzzing worker in a subprocess and reading how it ended."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from tests.helpers.paths import REPO


HERE = REPO / "tests" / "helpers"  # the worker


WORKER = HERE / "fuzz_decode_worker.py"


def run_worker(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """The worker in a fresh interpreter; a crash (negative return code) fails the caller's assert."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, str(WORKER), *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=REPO)


def crashed(result: subprocess.CompletedProcess, current: Path | None = None) -> str:
    where = f" at mutated file {current.read_text()}" if current is not None and current.exists() else ""
    return f"worker exited with {result.returncode}{where}:\n{result.stderr[-3000:]}"
