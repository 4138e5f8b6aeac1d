"""What a server's answer to a request must be before its bytes are used: a redirect followed only
within the host asked (or the hosts ``source.redirect_hosts`` names), and a ranged answer's
``Content-Range`` the range asked for.

A redirect is followed here, hop by hop, not by aiohttp: a redirect to a scheme other than
``http``/``https`` (``file://``, ``ftp://``) or to a host not allowed is refused at once, as a
permanent error naming where it pointed — never retried until the timeout, never followed
silently to a server the pipeline did not name. Credentials given with the URL (``user:password@``)
are sent only to the host they were given for.

A ``206`` answer whose ``Content-Range`` names other bytes than those asked for (a proxy or cache
that mixes up ranges), or that names none, is the server's error, said so — instead of other
bytes decoded as "not a JPEG".
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ...util.urls import hide_signature, redact

if TYPE_CHECKING:   # yarl comes with aiohttp, an extra's client: imported where a request is made
    import yarl

REDIRECTS = (301, 302, 303, 307, 308)
MOST_REDIRECTS = 10
_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$", re.IGNORECASE)


class AnswerRefused(Exception):
    """A server's answer that another attempt would not change: a refused redirect, a wrong range."""

    missing = False
    changed = False


def _origin(url: yarl.URL) -> tuple[str, str, int | None]:
    return (url.scheme, (url.host or "").lower(), url.port)


def _shown(url: yarl.URL) -> str:
    """A redirect's target as a message shows it: without userinfo and query (a signed URL's)."""
    if url.host:
        url = url.with_user(None)
    return redact(str(url.with_query(None).with_fragment(None)))


def host_allowed(target: yarl.URL, start: yarl.URL, allowed: Sequence[str]) -> bool:
    """Whether a redirect from ``start`` may go to ``target``: the same host and port, or a host
    ``allowed`` names (``host``: any port; ``host:port``: that one)."""
    host = (target.host or "").lower()
    if (host, target.port) == ((start.host or "").lower(), start.port):
        return True
    names = {name.lower() for name in allowed}
    return host in names or f"{host}:{target.port}" in names


async def open_following(session: Any, method: str, url: str | yarl.URL, *, shown: str,
                         headers: Mapping[str, str] | None = None, own_headers: Mapping[str, str] | None = None,
                         allowed_hosts: Sequence[str] = ()) -> Any:
    """The final answer (an aiohttp response, to be used in ``async with``) to ``method url``, the
    redirects followed within the hosts allowed; :class:`AnswerRefused` naming ``shown`` (the URL
    as messages name it) for a redirect refused. ``own_headers`` (the URL's credentials) go only
    to ``url``'s own origin."""
    import yarl

    start = url if isinstance(url, yarl.URL) else yarl.URL(url)
    current = start
    for _ in range(MOST_REDIRECTS + 1):
        sent = {**(headers or {}), **((own_headers or {}) if _origin(current) == _origin(start) else {})}
        response = await session.request(method, current, headers=sent, allow_redirects=False)
        location = response.headers.get("Location") if response.status in REDIRECTS else None
        if location is None:
            return response
        response.release()
        try:
            target = current.join(yarl.URL(location))
        except ValueError:
            raise AnswerRefused(f"{method} {shown}: the server redirected to an invalid URL "
                                f"{hide_signature(location)!r}") from None
        if target.scheme not in ("http", "https"):
            raise AnswerRefused(f"{method} {shown}: the server redirected to {_shown(target)}, which is not "
                                f"http(s): refused (a server may not point a read at local files or another "
                                f"protocol)")
        if not host_allowed(target, start, allowed_hosts):
            raise AnswerRefused(f"{method} {shown}: the server redirected to another host, {_shown(target)}: "
                                f"refused; if that host is trusted, name it in source.redirect_hosts "
                                f"(e.g. redirect_hosts: [{target.host}])")
        method = "GET" if response.status == 303 and method != "HEAD" else method   # "see other": a GET
        current = target
    raise AnswerRefused(f"{method} {shown}: more than {MOST_REDIRECTS} redirects: refused")


def check_content_range(response: Any, start: int, size: int, shown: str) -> None:
    """:class:`AnswerRefused` unless the ``206`` answer's ``Content-Range`` is exactly bytes
    ``start`` to ``start + size - 1`` (the range asked for)."""
    end = start + size - 1
    raw = response.headers.get("Content-Range")
    match = _CONTENT_RANGE.match(raw or "")
    if match is None:
        said = f"a Content-Range of {raw!r}" if raw is not None else "no Content-Range"
        raise AnswerRefused(f"GET {shown} bytes {start}-{end}: the server's answer (206) carries {said}, so "
                            f"which bytes it holds is unknown: the server's error (a proxy or cache "
                            f"between?); the answer was not used")
    first, last = int(match.group(1)), int(match.group(2))
    if (first, last) != (start, end):
        raise AnswerRefused(f"GET {shown} bytes {start}-{end}: the server answered bytes {first}-{last} "
                            f"(Content-Range: {raw.strip()}) instead: the server's error (a proxy or cache "
                            f"mixing up ranges?); the answer was not used")
