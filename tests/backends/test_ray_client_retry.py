"""A Ray Client head whose server process for this client dies as it starts answers "Initialization
failure from server"; the loader connects again (a new connection gets a new process), warning each
time and counting it, and after the last attempt stops with the error naming the address. Ray here
is a stand-in module: the failure is the head's, and a real head fails only now and then."""
from __future__ import annotations

import socket
import sys
import types

import pytest

from dali_bridge import build_loader
from dali_bridge.backends.ray_executor import CLIENT_ATTEMPTS, RayClusterError
from tests.helpers.paths import TRAIN

FAILURE = "Initialization failure from server:\nTraceback (most recent call last):\n  psutil.ZombieProcess"


class Connected(Exception):
    """Raised by the stand-in once connected: the test stops there, past the connection."""


def fake_ray(*, failures: int) -> types.SimpleNamespace:
    calls = {"init": 0, "shutdown": 0}

    def init(*, address: str, **_: object) -> None:
        calls["init"] += 1
        if calls["init"] <= failures:
            raise ConnectionAbortedError(FAILURE)

    def get_runtime_context() -> None:
        raise Connected

    def shutdown() -> None:
        calls["shutdown"] += 1

    return types.SimpleNamespace(calls=calls, init=init, shutdown=shutdown, is_initialized=lambda: False,
                                 get_runtime_context=get_runtime_context)


@pytest.fixture
def listening_port():
    """A port on 127.0.0.1 that takes connections (the loader probes the address before connecting)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


def ray_loader(sample_root, port: int):
    return build_loader(TRAIN, "torchvision", overrides={
        "source": {"type": "folder", "root": str(sample_root)}, "batch_size": 4,
        "loader.executor": "ray", "loader.ray": {"address": f"ray://127.0.0.1:{port}"}})


def test_a_client_session_that_failed_to_start_is_tried_again_with_a_warning(monkeypatch, sample_root,
                                                                             listening_port):
    ray = fake_ray(failures=CLIENT_ATTEMPTS - 1)
    monkeypatch.setitem(sys.modules, "ray", ray)
    loader = ray_loader(sample_root, listening_port)
    with pytest.warns(RuntimeWarning, match="failed to start this client's session") as warned:
        with pytest.raises(Connected):
            next(iter(loader))
    assert ray.calls == {"init": CLIENT_ATTEMPTS, "shutdown": CLIENT_ATTEMPTS - 1}
    assert len([w for w in warned if "client's session" in str(w.message)]) == CLIENT_ATTEMPTS - 1
    assert loader.stats()["executor"]["connect_retries"] == CLIENT_ATTEMPTS - 1


def test_a_client_session_failing_every_attempt_stops_naming_the_address(monkeypatch, sample_root,
                                                                        listening_port):
    ray = fake_ray(failures=CLIENT_ATTEMPTS)
    monkeypatch.setitem(sys.modules, "ray", ray)
    loader = ray_loader(sample_root, listening_port)
    with pytest.warns(RuntimeWarning, match="failed to start this client's session"):
        with pytest.raises(RayClusterError, match=rf"ray://127.0.0.1:{listening_port}: ConnectionAbortedError: "
                                                  r"Initialization failure from server"):
            next(iter(loader))
    assert ray.calls == {"init": CLIENT_ATTEMPTS, "shutdown": CLIENT_ATTEMPTS}
