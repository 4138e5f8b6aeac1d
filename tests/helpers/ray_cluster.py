"""A Ray cluster of 2 CPUs on 127.0.0.1 for the ``loader.executor: ray`` tests: its head runs in
processes of its own (``ray.cluster_utils.Cluster``), so a test can kill it, and this process
connects to it as a trainer would. Ray's workers import this checkout's ``dali_bridge``."""
from __future__ import annotations

import os
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.helpers.paths import REPO

# Ray names this host's outward address for 127.0.0.1 unless told, at its import, that the cluster is
# this host alone; the cluster here listens on loopback only. Set before any test module imports Ray.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

CPUS = 2
NO_RAY = "Ray is not installed: pip install 'dali-bridge[ray]' (the extra the executor needs)"


@contextmanager
def ray_cluster() -> Iterator[Any]:
    """Start the cluster and connect to it; disconnect and stop it at the end, whatever happened."""
    ray = pytest.importorskip("ray", reason=NO_RAY)
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": CPUS, "include_dashboard": False, "node_ip_address": "127.0.0.1"})
    try:
        ray.init(address=cluster.address, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.head_node.kill_all_processes(check_alive=False, allow_graceful=True)


def running_batch_workers() -> list[int]:
    """Ray worker processes making a batch now (Ray titles a worker after the task it runs)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            title = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if title.startswith(b"ray::make_batch"):
            found.append(int(entry))
    return found


def kill(pid: int) -> bool:
    """SIGKILL ``pid``; False when it had already gone."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True
