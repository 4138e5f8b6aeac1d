"""HTTP servers on 127.0.0.1 that answer the way hostile or strict servers do: one that asks for
basic authentication, one that redirects every request (to another server or to ``file://``),
one whose ranged answers hold other bytes than asked (or say nothing of which). Each serves the
files of a folder with ``Range`` support and records what it was asked."""
from __future__ import annotations

import base64
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

LOOPBACK = "127.0.0.1"


@dataclass
class Behaviour:
    """How the server answers: ``auth`` (user, password) demanded; every request redirected to
    ``redirect_to`` + its path; ranged answers starting ``shift`` bytes late (and saying so in their
    Content-Range), or without any ``Content-Range``."""
    auth: tuple[str, str] | None = None
    redirect_to: str | None = None
    shift: int = 0
    content_range: bool = True
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)   # (method, path, Authorization)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _empty(self, status: int, **headers: str) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _answer(self, body: bool) -> None:
        how: Behaviour = self.server.behaviour
        how.seen.append((self.command, self.path, self.headers.get("Authorization")))
        if how.auth is not None:
            expected = "Basic " + base64.b64encode(":".join(how.auth).encode()).decode()
            if self.headers.get("Authorization") != expected:
                return self._empty(401, WWW_Authenticate='Basic realm="shards"')
        if how.redirect_to is not None:
            return self._empty(302, Location=how.redirect_to + self.path)
        path = (self.server.root / self.path.split("?", 1)[0].lstrip("/")).resolve()
        if not (path.is_file() and self.server.root in path.parents):
            return self._empty(404)
        data = path.read_bytes()
        start, end = 0, len(data) - 1
        match = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        if match:
            start, end = int(match.group(1)), min(int(match.group(2)), len(data) - 1)
            if start > 0:   # an index or a member, not a tar's first block: shifted
                start, end = start + how.shift, min(end + how.shift, len(data) - 1)
        self.send_response(206 if match else 200)
        if match and how.content_range:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("ETag", f'"{len(data):x}"')
        self.end_headers()
        if body:
            self.wfile.write(data[start:end + 1])

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)


def serve(root: Path, behaviour: Behaviour) -> tuple[ThreadingHTTPServer, str]:
    """``root``'s files served on 127.0.0.1 (a free port) as ``behaviour`` says: (server, base URL)."""
    server = ThreadingHTTPServer((LOOPBACK, 0), _Handler)
    server.root, server.behaviour, server.daemon_threads = root.resolve(), behaviour, True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://{LOOPBACK}:{server.server_address[1]}"


@pytest.fixture
def answering_server() -> Iterator:
    """``start(root, behaviour)`` → base URL; every server started is stopped after the test."""
    started: list[ThreadingHTTPServer] = []

    def start(root: Path, behaviour: Behaviour) -> str:
        server, base = serve(root, behaviour)
        started.append(server)
        return base

    yield start
    for server in started:
        server.shutdown()
        server.server_close()
