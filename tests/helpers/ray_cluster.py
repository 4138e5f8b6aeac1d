"""A Ray cluster of 2 CPUs on 127.0.0.1 for the ``loader.executor: ray`` tests: its head runs in
processes of its own (``ray.cluster_utils.Cluster``), so a test can kill it, and this process
connects to it as a trainer would (or, with a Ray Client server, leaves the connecting to the loader).
Ray's workers import this checkout's ``dali_bridge``."""
from __future__ import annotations

import os
import signal
import socket
import time
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
def ray_cluster(*, client_port: int | None = None) -> Iterator[Any]:
    """Start the cluster and connect to it; disconnect and stop it at the end, whatever happened.
    With ``client_port`` the head also runs a Ray Client server there (``ray://127.0.0.1:PORT``) and
    this process does not connect: the loader does, through that server."""
    ray = pytest.importorskip("ray", reason=NO_RAY)
    from ray.cluster_utils import Cluster

    head = {"num_cpus": CPUS, "include_dashboard": False, "node_ip_address": "127.0.0.1"}
    if client_port is not None:
        head["ray_client_server_port"] = client_port
    # The cluster's processes (workers, the client server's drivers) inherit this: without a driver's
    # runtime_env to say it, they still import this checkout's dali_bridge.
    before = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), before) if p)
    try:
        cluster = Cluster(initialize_head=True, head_node_args=head)
    finally:
        if before is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = before
    try:
        if client_port is not None:
            wait_for_port(client_port)
        else:
            ray.init(address=cluster.address, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
        yield cluster
    finally:
        ray.shutdown()  # also a Ray Client that lost its head: it stays registered until shut down
        cluster.head_node.kill_all_processes(check_alive=False, allow_graceful=True)


def wait_for_port(port: int, *, seconds: float = 60.0) -> None:
    """Until 127.0.0.1:``port`` takes connections: the head starts its Ray Client server after it returns."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the head's Ray Client server did not listen on port {port} "
                                   f"within {seconds:.0f} s") from None
            time.sleep(0.1)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


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


def slowed_make_batch(*, slow: int, until_made: list[int], seconds: float, stamps: Path,
                      timeout: float = 20.0) -> Any:
    """The executor's ``make_batch``, with batch ``slow`` held back on its node: it waits until the
    batches ``until_made`` are made (on the cluster's other CPU), then ``seconds`` more. Every task
    leaves ``NUMBER.start`` / ``NUMBER.end`` in ``stamps`` holding ``time.time()`` (one host: one
    clock). A nested function, so Ray ships it to the workers by value, with its settings."""
    from dali_bridge.backends import ray_executor

    def make_batch(holder: list, task: Any) -> dict[str, Any]:
        (stamps / f"{task.number}.start").write_text(repr(time.time()))
        if task.number == slow:
            deadline = time.monotonic() + timeout
            while not all((stamps / f"{number}.end").exists() for number in until_made):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"batches {until_made} were not made while batch {slow} was slow: "
                                       f"the cluster did not run ahead of it")
                time.sleep(0.02)
            time.sleep(seconds)
        item = ray_executor.make_batch(holder, task)
        (stamps / f"{task.number}.end").write_text(repr(time.time()))
        return item

    return make_batch


def stamped(stamps: Path, number: int, event: str) -> float:
    """When batch ``number``'s task started or ended (``event``), as :func:`slowed_make_batch` wrote it."""
    return float((stamps / f"{number}.{event}").read_text())
