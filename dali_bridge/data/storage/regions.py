"""S3's answers that say a bucket lives in another region than the one asked: permanent, and named.

A request for a bucket of another region gets, depending on the endpoint and the signature:

- ``301 PermanentRedirect``: another region's endpoint; ``x-amz-bucket-region`` names the
  bucket's region, the XML body its ``<Endpoint>`` (a HEAD's answer has the header only);
- ``400 AuthorizationHeaderMalformed`` (``AuthorizationQueryParametersError`` for a presigned
  URL): signed for the wrong region, "the region 'us-east-1' is wrong; expecting 'eu-west-1'",
  with ``<Region>``; a HEAD's answer is a bare 400 with the header;
- ``400 IllegalLocationConstraintException``: a bucket of an opt-in region asked of another
  region's endpoint ("The eu-south-1 location constraint is incompatible ...").

Another attempt signed the same way gets the same answer, so these are never retried until
``source.timeout`` runs out: the first one is the error (:class:`WrongRegion`), naming the URL,
the bucket's region when the answer says it, and the setting to change. botocore's own region
redirect (one more request signed for the region the answer names, for the requests it signs)
runs before this; what reaches here is what it could not fix. Any other 301 from S3 (no
``Location`` to follow) is permanent too; other 400s (S3's ``RequestTimeout`` is one) are not.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from typing import Any, Mapping

from .answers import AnswerRefused
from ...util.quoting import safe_name

REGION_CODES = frozenset({"PermanentRedirect", "AuthorizationHeaderMalformed", "AuthorizationQueryParametersError",
                          "IllegalLocationConstraintException"})
_SIGNING_CODES = ("AuthorizationHeaderMalformed", "AuthorizationQueryParametersError")
ERROR_BODY_BYTES = 64 << 10   # an S3 error document is well under 1 KiB; no more is read of one
_REGION = r"[a-z]{2}(?:-[a-z]+)+-\d+"
_EXPECTING = re.compile(rf"expecting '({_REGION})'")
_CONSTRAINT = re.compile(rf"\bThe ({_REGION}) location constraint is incompatible")
_ENDPOINT_REGION = re.compile(rf"(?:^|\.)s3[.-](?:dualstack\.)?({_REGION})\.amazonaws\.com")
# What a region or a host name may be before a message quotes it (the server's text otherwise).
_REGION_NAME = re.compile(r"[a-z0-9-]{1,64}")
_HOST_NAME = re.compile(r"[A-Za-z0-9.-]{1,255}")


class WrongRegion(AnswerRefused):
    """S3 answered that the bucket is not served here, in this region: no attempt will do better."""


@dataclass(frozen=True)
class S3Answer:
    """What an S3 error answer says: status, error code and message, and where the bucket is."""
    status: int
    code: str = ""
    message: str = ""
    region: str | None = None      # x-amz-bucket-region, <Region>, or the region a message names
    endpoint: str | None = None    # <Endpoint>: the host that serves the bucket


def answer_from_xml(status: int, headers: Mapping[str, str], body: bytes) -> S3Answer:
    """An S3 answer from its status, headers and (possibly empty or truncated) XML error body."""
    fields: dict[str, str] = {}
    try:
        root = ElementTree.fromstring(body[:ERROR_BODY_BYTES]) if body.strip() else None
    except ElementTree.ParseError:
        root = None   # not S3's error document: the status and headers are all there is
    if root is not None and root.tag == "Error":
        fields = {child.tag: (child.text or "").strip() for child in root}
    return _answer(status, headers, fields)


def answer_from_client_error(response: Mapping[str, Any]) -> S3Answer:
    """An S3 answer from a botocore ``ClientError``'s parsed response."""
    meta = response.get("ResponseMetadata", {})
    return _answer(int(meta.get("HTTPStatusCode") or 0), meta.get("HTTPHeaders", {}), response.get("Error", {}))


def _answer(status: int, headers: Mapping[str, str], fields: Mapping[str, str]) -> S3Answer:
    code, message = str(fields.get("Code", "")), str(fields.get("Message", ""))
    endpoint = _checked(_HOST_NAME, fields.get("Endpoint"))
    said = _EXPECTING.search(message) or _CONSTRAINT.search(message) or (
        _ENDPOINT_REGION.search(endpoint) if endpoint else None)
    header = next((value for name, value in headers.items() if name.lower() == "x-amz-bucket-region"), None)
    region = _checked(_REGION_NAME, header or fields.get("Region") or (said.group(1) if said else None))
    code = code if code not in ("", str(status)) else ""   # botocore names a bodiless answer by its status
    return S3Answer(status, safe_name(code) if code else "", message, region, endpoint)


def _checked(pattern: re.Pattern, value: str | None) -> str | None:
    """``value`` when it has the form of what it names; None for anything else a server may send."""
    value = (value or "").strip()
    return value if pattern.fullmatch(value) else None


def is_wrong_region(answer: S3Answer, client_region: str | None) -> bool:
    """Whether ``answer`` says the bucket is in another region than ``client_region`` (or is
    not served at this endpoint): every 301, a region error code, or a bare 400 whose
    ``x-amz-bucket-region`` differs from the region the client asks in."""
    if answer.status == 301 or answer.code in REGION_CODES:
        return True
    return (answer.status == 400 and not answer.code and answer.region is not None
            and client_region is not None and answer.region != client_region)


def wrong_region_message(answer: S3Answer, bucket_url: str, client_region: str | None) -> str:
    """Why a request for a bucket of ``bucket_url`` failed and what to set, from S3's ``answer``."""
    said = f"S3 answered {answer.status}{f' {answer.code}' if answer.code else ''}"
    endpoint = _endpoint_url(answer, bucket_url)
    region = answer.region
    if region is None:   # S3's own words are all there is: quoted
        message = f": {safe_name(answer.message.rstrip('.'))}" if answer.message else ""
        asked = f" (this client asks in {client_region})" if client_region else ""
        if answer.code in _SIGNING_CODES:   # a malformed signature names no region: the credentials may be it
            return (f"{said}{message} — the request's signature does not fit the bucket{asked}: check the region "
                    f"(AWS_DEFAULT_REGION or source.storage_options: {{client_kwargs: {{region_name: ...}}}}) and "
                    f"the credentials (AWS_* variables, AWS_PROFILE)")
        return (f"{said}{message} — the bucket {bucket_url} is not served by this endpoint in this region{asked}: "
                f"set the bucket's region (AWS_DEFAULT_REGION or source.storage_options: {{client_kwargs: "
                f"{{region_name: ...}}}}) or an endpoint that serves it (AWS_ENDPOINT_URL or "
                f"storage_options.endpoint_url{f': {endpoint}' if endpoint else ''})")
    endpoint = endpoint or f"https://s3.{region}.amazonaws.com"
    if region == client_region:   # the right region, asked at another region's endpoint
        return (f"the bucket {bucket_url} is in region {region}, but the endpoint asked does not serve it "
                f"({said}): set an endpoint of {region} (AWS_ENDPOINT_URL or storage_options.endpoint_url: "
                f"{endpoint})")
    asked = f", not {client_region} where this client asks" if client_region else ""
    return (f"the bucket {bucket_url} is in region {region}{asked} ({said}): set AWS_DEFAULT_REGION={region} or "
            f"source.storage_options: {{client_kwargs: {{region_name: {region}}}}}, and an endpoint of {region} "
            f"if one is set (AWS_ENDPOINT_URL or storage_options.endpoint_url: {endpoint})")


def _endpoint_url(answer: S3Answer, bucket_url: str) -> str | None:
    """The endpoint S3 named, as ``endpoint_url`` takes it: the bucket's own host name
    (``bucket.s3.eu-west-1.amazonaws.com``) without the bucket."""
    if not answer.endpoint:
        return None
    bucket = bucket_url.removeprefix("s3://").split("/", 1)[0]
    return f"https://{answer.endpoint.removeprefix(f'{bucket}.')}"


def bucket_url_of(url: str) -> str:
    """``s3://BUCKET`` of an ``s3://`` URL or glob pattern: what the region messages name."""
    return f"s3://{url.removeprefix('s3://').split('/', 1)[0]}"


def wrong_region(answer: S3Answer, bucket_url: str, client_region: str | None) -> WrongRegion | None:
    """:class:`WrongRegion` for an ``answer`` that says the bucket is elsewhere; None for any other."""
    if not is_wrong_region(answer, client_region):
        return None
    return WrongRegion(wrong_region_message(answer, bucket_url, client_region))


def wrong_region_in(exc: BaseException, bucket_url: str) -> WrongRegion | None:
    """The :class:`WrongRegion` a client library's exception stands for (s3fs raises botocore's
    ``ClientError`` as an ``OSError`` caused by it); None for any other failure."""
    seen: BaseException | None = exc
    for _ in range(4):   # the exception, its cause, theirs: as deep as the clients wrap
        if seen is None:
            break
        response = getattr(seen, "response", None)
        if isinstance(response, Mapping) and "Error" in response:
            return wrong_region(answer_from_client_error(response), bucket_url, None)
        seen = seen.__cause__ or seen.__context__
    return None
