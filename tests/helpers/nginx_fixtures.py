"""nginx from the system's packages serving a folder on 127.0.0.1 (a free port) with Range, ETag and
If-Match — a light HTTP server whose own CPU per request is a small fraction of the client's, so a
benchmark against it measures the client. With ``delay_s`` every request waits that long in nginx's
event loop (the echo module's ``echo_sleep``: a timer, no CPU while it runs) before the file is
served. Tests that need it are skipped, with the reason, where nginx (or the echo module) is not
installed: ``apt-get install nginx libnginx-mod-http-echo``."""
from __future__ import annotations

import os
import pwd
import grp
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

import pytest

from tests.helpers.s3_fixtures import LOOPBACK, free_port

ECHO_MODULE = Path("/usr/lib/nginx/modules/ngx_http_echo_module.so")   # Debian's libnginx-mod-http-echo


def nginx_binary() -> str | None:
    """The nginx executable (on PATH or in /usr/sbin, where root's PATH has it), or None."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


def missing_reason(*, delay: bool = False) -> str | None:
    """Why nginx (with the echo module when ``delay``) cannot be started here, or None."""
    if nginx_binary() is None:
        return "nginx is not installed (apt-get install nginx)"
    if delay and not ECHO_MODULE.is_file():
        return f"nginx's echo module ({ECHO_MODULE}) is not installed (apt-get install libnginx-mod-http-echo)"
    return None


def _config(root: Path, port: int, prefix: Path, delay_s: float, access_log: bool) -> str:
    # Running as root, nginx's worker switches to the user named here: the one that owns the files
    # (pytest's tmp folders are private to their owner).
    user = (f"user {pwd.getpwuid(os.geteuid()).pw_name} {grp.getgrgid(os.getegid()).gr_name};"
            if os.geteuid() == 0 else "")
    module = f"load_module {ECHO_MODULE};" if delay_s > 0 else ""
    # An echo_sleep location answers nothing itself: after the timer it hands the request (its
    # Range and If-Match headers included) to the static location, as an internal redirect.
    serve = (f"location / {{ echo_sleep {delay_s:.3f}; echo_exec @files; }}\n    location @files {{ }}"
             if delay_s > 0 else "location / { }")
    return f"""{module}
{user}
worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  log_format ranged '$request_method $status "$http_range" $uri';
  access_log {f"{prefix}/access.log ranged" if access_log else "off"};
  client_body_temp_path {prefix}/body;
  proxy_temp_path {prefix}/proxy;
  fastcgi_temp_path {prefix}/fastcgi;
  uwsgi_temp_path {prefix}/uwsgi;
  scgi_temp_path {prefix}/scgi;
  default_type application/octet-stream;
  sendfile on;
  keepalive_requests 1000000;
  keepalive_timeout 300s;
  server {{
    listen {LOOPBACK}:{port} backlog=1024;
    root {root.resolve()};
    {serve}
  }}
}}
"""


class Nginx:
    """An nginx process serving ``root`` on 127.0.0.1: ``base`` is its URL, ``pid`` its master's
    process id; ``stop()`` ends it. ``access_log`` records each request (``requests()``), which
    costs nginx CPU: off for benchmarks. Raises RuntimeError (with nginx's error log) if it cannot start."""

    def __init__(self, root: Path, *, delay_s: float = 0.0, access_log: bool = False, start_timeout_s: float = 30.0):
        reason = missing_reason(delay=delay_s > 0)
        if reason:
            raise RuntimeError(reason)
        self._prefix = Path(tempfile.mkdtemp(prefix="dali-bridge-nginx-"))
        for attempt in range(5):   # a free port can be taken between the probe and nginx's bind
            port = free_port()
            config = self._prefix / "nginx.conf"
            config.write_text(_config(root, port, self._prefix, delay_s, access_log))
            self.process = subprocess.Popen([nginx_binary(), "-p", str(self._prefix), "-c", str(config),
                                             "-e", str(self._prefix / "error.log")],
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if self._wait_for(port, start_timeout_s):
                self.base, self.pid = f"http://{LOOPBACK}:{port}", self.process.pid
                return
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        log = (self._prefix / "error.log").read_text() if (self._prefix / "error.log").is_file() else ""
        self.stop()
        raise RuntimeError(f"nginx did not start on {LOOPBACK} (tried 5 free ports); its error log:\n{log}")

    def _wait_for(self, port: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.process.poll() is None:
            with socket.socket() as probe:
                if probe.connect_ex((LOOPBACK, port)) == 0:
                    return True
            time.sleep(0.02)
        return False

    def requests(self) -> list[str]:
        """The requests served so far, one line each: method, status, the Range header, the path
        (only with ``access_log``; nginx writes each line when the answer is sent)."""
        log = self._prefix / "access.log"
        return log.read_text().splitlines() if log.is_file() else []

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()   # SIGTERM: nginx's fast shutdown, the worker with it
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self._prefix, ignore_errors=True)


@pytest.fixture
def nginx_folder(tmp_path: Path) -> Iterator[tuple[Path, Nginx]]:
    """(a folder, the nginx serving it on 127.0.0.1 with Range support and an access log); skipped,
    with the reason, where nginx is not installed."""
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    root = tmp_path / "nginx-served"
    root.mkdir()
    server = Nginx(root, access_log=True)
    yield root, server
    server.stop()
