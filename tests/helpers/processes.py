"""Processes and threads in tests: torchrun, what a loader leaves behind, waiting for it to settle."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

from tests.helpers.paths import REPO


def torchrun(script: Path, *args: str, nproc: int = 2, timeout: float = 300, killed: bool = False) -> None:
    """Run ``script`` under ``torchrun --standalone`` with ``nproc`` ranks (the repository and tests/
    importable); fails the test with both streams' tails when it exits non-zero — or, with ``killed``,
    unless its ranks ended by SIGKILL."""
    import subprocess
    import sys

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
               f"--nproc_per_node={nproc}", str(script), *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    tails = f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    if killed:
        assert done.returncode != 0 and "SIGKILL" in done.stderr, f"torchrun's ranks were not killed:\n{tails}"
    else:
        assert done.returncode == 0, f"torchrun failed ({done.returncode}):\n{tails}"


def os_threads() -> int:
    """OS threads of this process (DALI's C++ threads included, unlike threading.enumerate)."""
    return len(os.listdir("/proc/self/task"))


def child_processes() -> list[int]:
    """Live (non-zombie) child processes of this process, from /proc (any launcher, not only multiprocessing)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                found.append(int(entry))
    return found


def settle(condition: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Wait (up to ``timeout`` seconds) for workers and threads to finish shutting down."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
