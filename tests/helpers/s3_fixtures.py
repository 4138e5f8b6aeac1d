"""Object storage on loopback for the tests: moto's S3 server, an HTTP server with Range support,
and a fault-injecting proxy in front of either. Everything listens on 127.0.0.1, on a free port.

The credentials the S3 fixture plants are markers the tests look for in every output: they must
never appear in an error, a log line, ``show``, a state dict or a cache file name.
"""
from __future__ import annotations

import collections
import email.utils
import http.client
import os
import re
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

LOOPBACK = "127.0.0.1"
PLANTED_KEY_ID = "AKIAPLANTEDKEYID0001"
PLANTED_SECRET = "planted-secret-f00dbabe-do-not-show"


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's S3 server on 127.0.0.1 (a free port), with planted credentials in the environment."""
    pytest.importorskip("s3fs", reason="the S3 tests need s3fs: pip install 'dali-bridge[s3]'")
    moto_server = pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (the test extra)")
    server = moto_server.ThreadedMotoServer(ip_address=LOOPBACK, port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL",
                                            "AWS_DEFAULT_REGION", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE")}
    os.environ.update(AWS_ACCESS_KEY_ID=PLANTED_KEY_ID, AWS_SECRET_ACCESS_KEY=PLANTED_SECRET,
                      AWS_ENDPOINT_URL=endpoint, AWS_DEFAULT_REGION="us-east-1",
                      AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_CONFIG_FILE=os.devnull)
    yield endpoint
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def s3_client(endpoint: str):
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def upload_folder(endpoint: str, folder: Path, bucket: str, prefix: str = "shards",
                  skip: tuple[str, ...] = ()) -> str:
    """Create ``bucket`` and put every file of ``folder`` under ``prefix``; the prefix's URL."""
    client = s3_client(endpoint)
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    if bucket not in existing:
        client.create_bucket(Bucket=bucket)
    for path in sorted(folder.iterdir()):
        if path.is_file() and not path.name.endswith(skip):
            client.put_object(Bucket=bucket, Key=f"{prefix}/{path.name}", Body=path.read_bytes())
    return f"s3://{bucket}/{prefix}"


# ---- an HTTP server with Range support


class _RangeHandler(BaseHTTPRequestHandler):
    """GET/HEAD of the files under ``server.root``: ``Range: bytes=a-b`` → 206, ``If-Match`` → 412."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _target(self) -> Path | None:
        path = (self.server.root / self.path.split("?", 1)[0].lstrip("/")).resolve()
        return path if path.is_file() and self.server.root in path.parents else None

    def _answer(self, body: bool) -> None:
        path = self._target()
        if path is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        status = path.stat()
        etag = f'"{status.st_size:x}-{status.st_mtime_ns:x}"'
        if self.headers.get("If-Match") not in (None, etag):
            self.send_response(412)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start, end = 0, status.st_size - 1
        match = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        if match:
            start, end = int(match.group(1)), min(int(match.group(2)), status.st_size - 1)
        self.send_response(206 if match else 200)
        if match:
            self.send_header("Content-Range", f"bytes {start}-{end}/{status.st_size}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", email.utils.formatdate(status.st_mtime, usegmt=True))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if body:
            with open(path, "rb") as handle:
                handle.seek(start)
                self.wfile.write(handle.read(end - start + 1))

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)


class _LoopbackServer(ThreadingHTTPServer):
    """A threading HTTP server whose listen backlog takes a client's burst of new connections: with
    socketserver's 5, the 64 connections a batch opens at once overflow it and some wait for a
    SYN retransmission (a second), which would be the server's ceiling, not the client's."""
    request_queue_size = 256


def _serve(server: ThreadingHTTPServer) -> ThreadingHTTPServer:
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def serve_folder(root: Path) -> tuple[ThreadingHTTPServer, str]:
    """The files under ``root`` served on 127.0.0.1 with Range support, from a thread: (the server, its base URL)."""
    server = _LoopbackServer((LOOPBACK, 0), _RangeHandler)
    server.root = root.resolve()
    _serve(server)
    return server, f"http://{LOOPBACK}:{server.server_address[1]}"


@pytest.fixture
def http_folder(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """(a folder, its base URL) served on 127.0.0.1 with Range support."""
    root = tmp_path / "served"
    root.mkdir()
    server, base = serve_folder(root)
    yield root, base
    server.shutdown()
    server.server_close()


# ---- a fault-injecting proxy


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of ``upstream`` (host:port) that forwards each request,
    or answers it with the next planned fault.

    ``plan(kind, ...)`` queues faults for the next matching requests (``methods``: which request
    methods they hit; ranged GETs by default): ``"503"`` (S3's SlowDown), ``"500"``, ``"403"``
    (AccessDenied, as S3 answers an expired signed URL), ``"reset"``
    (the connection is reset before any answer), ``"short"`` (the answer's headers promise the
    whole range, half the body comes, the connection closes), ``"stall"`` (no answer for
    ``stall_s``). ``latency`` seconds are added before every request. ``every`` makes a fault
    recur on every n-th matching request instead; ``by_range`` gives one range's requests a fault
    every time. ``requests`` counts requests by method, ``ranged`` the ranged GETs among them;
    ``arrived`` lists each ranged GET as (path without query, Range header), in order of arrival.
    """

    def __init__(self, upstream: str, latency: float = 0.0):
        self.upstream = upstream
        self.latency = latency
        self.faults: collections.deque[str] = collections.deque()
        self.every: tuple[int, list[str]] | None = None
        self.by_range: dict[str, str] = {}   # Range header → the fault every such request gets
        self.stall_s = 30.0
        self.ranged_only = True
        self.requests: collections.Counter = collections.Counter()
        self.ranged = 0
        self.arrived: list[tuple[str, str]] = []
        self.injected: collections.Counter = collections.Counter()
        self.lock = threading.Lock()
        self._matching = 0
        self.in_flight = 0
        self.peak = 0   # the most ranged GETs in flight at once
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _relay(self) -> None:
                ranged = self.command == "GET" and "Range" in self.headers
                with proxy.lock:
                    proxy.in_flight += ranged
                    proxy.peak = max(proxy.peak, proxy.in_flight)
                try:
                    proxy._handle(self)
                finally:
                    with proxy.lock:
                        proxy.in_flight -= ranged

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _relay

        self.server = _serve(_LoopbackServer((LOOPBACK, 0), Handler))
        self.endpoint = f"http://{LOOPBACK}:{self.server.server_address[1]}"

    def plan(self, *kinds: str) -> None:
        with self.lock:
            self.faults.extend(kinds)

    def _next_fault(self, handler: BaseHTTPRequestHandler) -> str | None:
        with self.lock:
            self.requests[handler.command] += 1
            ranged = handler.command == "GET" and "Range" in handler.headers
            self.ranged += ranged
            if ranged:
                self.arrived.append((handler.path.split("?", 1)[0], handler.headers["Range"]))
            if self.ranged_only and not ranged:
                return None
            self._matching += 1
            if handler.headers.get("Range") in self.by_range:
                return self.by_range[handler.headers["Range"]]
            if self.faults:
                return self.faults.popleft()
            if self.every is not None and self._matching % self.every[0] == 0:
                kinds = self.every[1]
                return kinds[(self._matching // self.every[0]) % len(kinds)]
        return None

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else None
        fault = self._next_fault(handler)
        if self.latency:
            time.sleep(self.latency)
        if fault is not None:
            with self.lock:
                self.injected[fault] += 1
        if fault == "reset":
            handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            handler.connection.close()
            handler.close_connection = True
            return
        if fault == "stall":
            time.sleep(self.stall_s)
            handler.close_connection = True
            return
        if fault in ("503", "500", "403"):
            code = {"503": "SlowDown", "500": "InternalError", "403": "AccessDenied"}[fault]
            text = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
                    f"<Message>injected {fault}</Message></Error>").encode()
            handler.send_response(int(fault))
            handler.send_header("Content-Type", "application/xml")
            handler.send_header("Content-Length", str(len(text)))
            handler.end_headers()
            handler.wfile.write(text)
            return
        upstream = http.client.HTTPConnection(self.upstream, timeout=30)
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in ("connection", "proxy-connection")}
        upstream.request(handler.command, handler.path, body=body, headers=headers)
        response = upstream.getresponse()
        data = response.read()
        handler.send_response(response.status)
        for key, value in response.getheaders():
            if key.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                handler.send_header(key, value)
        length = response.getheader("Content-Length") if handler.command == "HEAD" else None
        handler.send_header("Content-Length", length or str(len(data)))
        handler.end_headers()
        if handler.command != "HEAD":
            if fault == "short":
                handler.wfile.write(data[:len(data) // 2])
                handler.wfile.flush()
                handler.close_connection = True
                handler.connection.shutdown(socket.SHUT_RDWR)
                return
            handler.wfile.write(data)
        upstream.close()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fault_proxy():
    """A factory of :class:`FaultProxy` instances, each closed after the test."""
    made: list[FaultProxy] = []

    def make(upstream_url: str, latency: float = 0.0) -> FaultProxy:
        proxy = FaultProxy(upstream_url.split("://", 1)[1].rstrip("/"), latency)
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.close()


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (for a server that is gone)."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]
