"""An S3 endpoint on 127.0.0.1 for a bucket that lives in another region: it answers the request
kinds it is told to (LIST, HEAD, ranged GET, whole GET) the way S3 answers a request for a bucket
of another region, and passes every other request to an upstream S3 server (moto), so that a
loader can list its shards and fail only where a test wants it to.

The answers are shaped as AWS sends them (status, ``x-amz-bucket-region``, the XML error body):

- ``PermanentRedirect`` (301): the request reached another region's endpoint; the body names the
  bucket's ``<Endpoint>``, the header its region. A HEAD's answer has no body, only the header.
- ``AuthorizationHeaderMalformed`` (400): signed for the wrong region ("the region 'us-east-1' is
  wrong; expecting 'eu-west-1'", with ``<Region>``); a presigned URL's answer is
  ``AuthorizationQueryParametersError`` with the same sentence. A HEAD's answer: 400, the header.
- ``IllegalLocationConstraintException`` (400): a bucket of an opt-in region asked of another
  region's endpoint ("The eu-south-1 location constraint is incompatible for the region specific
  endpoint this request was sent to.").

and, to show what stays retried, S3's ``400 RequestTimeout`` (a socket not read from in time),
which is not about the region.

The server plays an endpoint that never serves the bucket, whatever region a request is signed
for: the S3 client's own region redirect (botocore re-signs once for the region the answer names
and asks the same endpoint again) gets the same answer. Each request is recorded with its kind
and the region it was signed for, to count what the client sent.
"""
from __future__ import annotations

import http.client
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator
from urllib.parse import unquote, urlsplit

import pytest

LOOPBACK = "127.0.0.1"
BUCKET_REGION = "eu-west-1"
OPT_IN_REGION = "eu-south-1"
KINDS = ("list", "head", "ranged", "whole")
ANSWERS = ("PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException")
TRANSIENT_400 = "RequestTimeout"
# The region a SigV4 request or presigned URL is signed for: .../<date>/<region>/s3/aws4_request
_SIGNED_REGION = re.compile(r"Credential=[^/]+/\d{8}/([a-z0-9-]+)/s3/aws4_request")


@dataclass(frozen=True)
class Seen:
    """One request the endpoint received: its kind, path (no query), Range header and the region it
    was signed for (None for a presigned URL of the older signature, which names no region)."""
    kind: str
    path: str
    range: str | None
    signed_for: str | None


@dataclass
class WrongRegionEndpoint:
    """The server (``endpoint`` its URL): ``answer`` (one of :data:`ANSWERS`) to the request kinds
    in ``kinds``, the rest passed to ``upstream`` (``host:port``)."""
    upstream: str
    answer: str = "PermanentRedirect"
    kinds: tuple[str, ...] = KINDS
    seen: list[Seen] = field(default_factory=list)
    endpoint: str = ""

    def answered(self, kind: str) -> list[Seen]:
        """The requests of ``kind`` that got the wrong-region answer."""
        return [one for one in self.seen if one.kind == kind] if kind in self.kinds else []


def request_kind(method: str, target: str, headers) -> str:
    path = target.partition("?")[0]
    if method == "HEAD":
        return "head"
    if method != "GET":
        return method.lower()
    if "/" not in path.strip("/"):   # /bucket?list-type=2&...: a LIST of the bucket
        return "list"
    return "ranged" if "Range" in headers else "whole"


def _error_xml(code: str, message: str, **more: str) -> bytes:
    extra = "".join(f"<{name}>{value}</{name}>" for name, value in more.items())
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
            f"{extra}<RequestId>5S3TQCRP1KX2R0GE</RequestId><HostId>bG9vcGJhY2sgdGVzdCBzZXJ2ZXI=</HostId></Error>"
            ).encode()


def wrong_region_answer(answer: str, method: str, bucket: str, signed_for: str | None,
                        presigned: bool) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of S3's ``answer`` to a request for ``bucket`` in another region."""
    region = OPT_IN_REGION if answer == "IllegalLocationConstraintException" else BUCKET_REGION
    headers = {"x-amz-bucket-region": region, "Content-Type": "application/xml"}
    if answer == "PermanentRedirect":
        status, body = 301, _error_xml(
            "PermanentRedirect", "The bucket you are attempting to access must be addressed using the specified "
            "endpoint. Please send all future requests to this endpoint.",
            Endpoint=f"{bucket}.s3.{region}.amazonaws.com", Bucket=bucket)
    elif answer == TRANSIENT_400:
        headers.pop("x-amz-bucket-region")
        status, body = 400, _error_xml("RequestTimeout", "Your socket connection to the server was not read from "
                                       "or written to within the timeout period. Idle connections will be closed.")
    elif answer == "AuthorizationHeaderMalformed":
        said = f"the region '{signed_for or 'us-east-1'}' is wrong; expecting '{region}'"
        status, body = 400, (
            _error_xml("AuthorizationQueryParametersError", f"Error parsing the X-Amz-Credential parameter; {said}",
                       Region=region) if presigned else
            _error_xml("AuthorizationHeaderMalformed", f"The authorization header is malformed; {said}",
                       Region=region))
    else:
        status, body = 400, _error_xml(
            "IllegalLocationConstraintException", f"The {region} location constraint is incompatible for the "
            "region specific endpoint this request was sent to.")
    return status, headers, b"" if method == "HEAD" else body


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _handle(self) -> None:
        how: WrongRegionEndpoint = self.server.how
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        kind = request_kind(self.command, self.path, self.headers)
        signed = _SIGNED_REGION.search(unquote(self.headers.get("Authorization", "") + " " + self.path))
        path = urlsplit(self.path).path
        signed_for = signed.group(1) if signed else None
        how.seen.append(Seen(kind, path, self.headers.get("Range"), signed_for))
        if kind in how.kinds:
            presigned = "X-Amz-Credential=" in self.path or "Signature=" in self.path
            status, headers, data = wrong_region_answer(how.answer, self.command, path.strip("/").split("/")[0],
                                                        signed_for, presigned)
            return self._send(status, headers, data, len(data))
        upstream = http.client.HTTPConnection(how.upstream, timeout=30)
        try:
            upstream.request(self.command, self.path, body=body,
                             headers={k: v for k, v in self.headers.items() if k.lower() != "connection"})
            response = upstream.getresponse()
            data = response.read()
            headers = {k: v for k, v in response.getheaders()
                       if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date")}
            length = int(response.getheader("Content-Length") or 0) if self.command == "HEAD" else len(data)
            self._send(response.status, headers, data, length)
        finally:
            upstream.close()

    def _send(self, status: int, headers: dict[str, str], data: bytes, length: int) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_HEAD = do_PUT = do_POST = _handle


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        pass   # a client closing its connection after an error answer is no news


@pytest.fixture
def wrong_region() -> Iterator:
    """A factory of :class:`WrongRegionEndpoint` servers in front of an upstream S3 URL, each
    closed after the test."""
    servers: list[ThreadingHTTPServer] = []

    def make(upstream_url: str, answer: str = "PermanentRedirect",
             kinds: tuple[str, ...] = KINDS) -> WrongRegionEndpoint:
        how = WrongRegionEndpoint(upstream_url.split("://", 1)[1].rstrip("/"), answer, tuple(kinds))
        server = _QuietServer((LOOPBACK, 0), _Handler)
        server.daemon_threads = True
        server.how = how
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        how.endpoint = f"http://{LOOPBACK}:{server.server_address[1]}"
        return how

    yield make
    for server in servers:
        server.shutdown()
        server.server_close()
