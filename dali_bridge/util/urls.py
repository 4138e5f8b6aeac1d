"""Where a location points and what a message may show of it: URL schemes and the client library
(and extra) each needs, joining and splitting object URLs, a URL's credentials taken out of it,
and the one scrubber (:func:`redact`) every message passes through — secrets the environment
holds, ``user:password@``, a signed URL's credentials — with :class:`Scrubbed`, the base of the
error classes that apply it (:mod:`dali_bridge.util.messages` carries it to logs and output).

It sits below the object store (:mod:`dali_bridge.data.storage.store`, which re-exports every name here) so
that the listing, the converter and the tools can ask "is this a URL?" without the store.
"""
from __future__ import annotations

import functools
import importlib
import json
import os
import re
from urllib.parse import quote, unquote

# Object-store schemes → (the module that implements them, the extra that installs it).
SCHEMES = {"s3": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
           "http": ("aiohttp", "http"), "https": ("aiohttp", "http")}
SECRET_WORDS = ("secret", "token", "password", "passwd", "credential", "key_id", "access_key", "private",
                "session", "auth", "anon_key")
# Environment variables whose values are secrets: every message is scrubbed of them (values of 8
# characters or more: a shorter value, such as FSSPEC_GS_TOKEN=anon, would blank ordinary words).
_SECRET_ENV = re.compile(r"(SECRET|TOKEN|PASSWORD|PASSWD|SESSION|CREDENTIAL|ACCESS_KEY|API_KEY|PRIVATE_KEY|"
                         r"SIGNATURE|_AUTH|^AUTH|_KEY$)", re.IGNORECASE)
_SHORTEST_SECRET = 8
# In a Google service-account or authorized-user key file (GOOGLE_APPLICATION_CREDENTIALS names it).
_GOOGLE_SECRET_FIELDS = ("private_key", "private_key_id", "client_secret", "refresh_token")
# ``user:password@`` after any scheme (``s3://``, ``https://``, and ``s3:/`` once a path was
# normalised): greedy within the word, so a password holding an unencoded ``/`` or ``@`` is hidden
# whole (a path's ``@`` after a port may be hidden with it: a message loses a little, never a secret).
_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*:/{1,2})(?:[^\s/@'\"<>]*:[^\s'\"<>]*|[^\s/@'\":<>]+)@")
# ``KEY:SECRET@bucket`` quoted without its scheme (a client's error naming the bucket it was given).
_BARE_USERINFO = re.compile(r"(?<=['\"(\s])[\w.%+~-]+:(?!/)[^\s@'\"<>()]+@(?=[\w.-])")

# What a signed URL's query carries of the credentials (SigV4 and the older SigV2 names, GCS's
# signed URLs), in any case and percent-encoded or not: hidden wherever a message quotes the URL.
_SIGNED_QUERY = re.compile(r"((?:X-(?:Amz|Goog)-(?:Signature|Credential|Security-Token)|Signature|AWSAccessKeyId|"
                           r"GoogleAccessId|x-amz-security-token)(?:=|%3D))[^&\s'\"]+", re.IGNORECASE)
# Any other query parameter whose name says it holds a credential (Azure's ``sig=``, ``token=``,
# ``access_token=``, ``api_key=``, ``password=`` ...).
_SECRET_QUERY = re.compile(r"([?&;](?:[\w.-]*?(?:sig|signature|token|secret|password|passwd|pwd|credential|key|auth)"
                           r"[\w.-]*)(?:=|%3D))[^&\s'\"#]+", re.IGNORECASE)


# The same names as ``name=value`` anywhere in a text (a header dump, a client's error message).
_SECRET_ASSIGNMENT = re.compile(r"(\b(?:sig|signature|token|access_token|refresh_token|secret|client_secret|password|"
                                r"passwd|api_key|apikey)=)[^&\s'\",;]+", re.IGNORECASE)


def hide_signature(text: str) -> str:
    """``text`` with the credential parts of any signed URL's query (and any ``token=``-like
    assignment) replaced by ``***``."""
    if "=" not in text and "%3d" not in text.lower():
        return text   # no parameter: nothing to hide (most messages)
    text = _SECRET_QUERY.sub(r"\1***", _SIGNED_QUERY.sub(r"\1***", text))
    return _SECRET_ASSIGNMENT.sub(r"\1***", text)


class Scrubbed(Exception):
    """An exception whose text arguments pass through :func:`redact` when it is made: its ``str``,
    ``repr`` and ``args`` hold no credential, wherever it is caught and printed. The base of every
    error class of the package that may quote a location."""

    def __init__(self, *args: object):
        super().__init__(*(redact(arg) if isinstance(arg, str) else arg for arg in args))


class StorageError(Scrubbed, OSError):
    """Object storage cannot be used: a missing client library, a bad URL or option."""


def scheme_of(location: str) -> str | None:
    """``s3://b/k`` → ``s3``; None for a local path (a Windows drive letter is not a scheme)."""
    match = re.match(r"^([a-zA-Z][a-zA-Z0-9+.-]+)://", location)
    return match.group(1).lower() if match else None


def is_url(location: str) -> bool:
    """Whether ``location`` names an object in storage (any ``scheme://``) rather than a local path."""
    return scheme_of(location) is not None


def join_url(folder: str, name: str) -> str:
    """``s3://b/shards`` + ``train.idx`` → ``s3://b/shards/train.idx`` (no ``os.path`` on URLs)."""
    return folder.rstrip("/") + "/" + name


def split_url(url: str) -> tuple[str, str]:
    """(folder, name) of an object URL: the inverse of :func:`join_url`."""
    folder, _, name = url.rpartition("/")
    return folder, name


def secret_option(name: str) -> bool:
    """Whether a ``storage_options`` key would hold a credential (those come from the environment)."""
    lowered = name.lower()
    return any(word in lowered for word in SECRET_WORDS) or lowered in ("key", "user", "username")


def split_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """``scheme://user:password@rest`` → (``scheme://rest``, user, password), percent-decoded; a URL
    without userinfo (or a local path) → (it, None, None). The user's part ends at the first ``@``
    before the host; a password may hold an unencoded ``/`` (an AWS secret key often does), but a
    ``host:port/path@x`` is a path, not a password."""
    match = re.match(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)([^@]*)@(.*)$", url, re.DOTALL)
    if match is None:
        return url, None, None
    scheme, before, rest = match.groups()
    if "/" in before and (":" not in before or re.match(r"^[^:/]*:[0-9]*(/|$)", before)):
        return url, None, None   # the '@' is in the path
    user, colon, password = before.partition(":")
    return scheme + rest, unquote(user), unquote(password) if colon else None


def without_userinfo(url: str) -> str:
    """``url`` without its ``user:password@`` (what every stored path and message keeps)."""
    return split_userinfo(url)[0]


def _variants(value: str) -> set[str]:
    """``value`` as a message may quote it: raw, percent-encoded, escaped as in a JSON or ``repr``."""
    return {value, quote(value, safe=""), quote(value, safe="/"), json.dumps(value)[1:-1], repr(value)[1:-1]}


@functools.lru_cache(maxsize=8)
def _key_file_secrets(path: str, stamp: tuple[int, int]) -> tuple[str, ...]:
    try:
        with open(path, "rb") as handle:
            data = json.loads(handle.read(1 << 20))
    except (OSError, ValueError):
        return ()
    if not isinstance(data, dict):
        return ()
    return tuple(v for k, v in data.items() if k in _GOOGLE_SECRET_FIELDS and isinstance(v, str))


_last_secrets: tuple[object, list[str]] = (None, [])


def environment_secrets() -> list[str]:
    """The secret values the environment holds, longest first: the values of variables named for a
    secret (``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``*_PASSWORD``, ``*_API_KEY`` ...), the
    access key id, and the private parts of the key file ``GOOGLE_APPLICATION_CREDENTIALS`` names.
    Worked out again only when the environment changed (every message asks)."""
    global _last_secrets
    raw = getattr(os.environ, "_data", None)   # CPython's encoded mapping: hashed in a microsecond
    key = (tuple(raw.items()), _key_file_stamp()) if isinstance(raw, dict) else None
    if key is not None and _last_secrets[0] == key:
        return _last_secrets[1]
    found = _environment_secrets()
    _last_secrets = (key, found)
    return found


def _key_file_stamp() -> tuple[int, int] | None:
    try:
        status = os.stat(os.environ.get("GOOGLE_APPLICATION_CREDENTIALS") or "")
    except (OSError, ValueError):
        return None
    return status.st_mtime_ns, status.st_size


def _environment_secrets() -> list[str]:
    values = [value for name, value in os.environ.items()
              if _SECRET_ENV.search(name) or name in ("AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY")]
    key_file = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if key_file:
        try:
            status = os.stat(key_file)
            values += _key_file_secrets(key_file, (status.st_mtime_ns, status.st_size))
        except (OSError, ValueError):
            pass
    shown = {v for value in values if len(value) >= _SHORTEST_SECRET for v in _variants(value)}
    return sorted((v for v in shown if len(v) >= _SHORTEST_SECRET), key=len, reverse=True)


def redact(text: str) -> str:
    """``text`` without any secret the environment holds (see :func:`environment_secrets`), without
    ``user:password@`` in URLs and without a signed URL's credentials: the one scrubber every
    message, log line, warning, exception text and command output passes through."""
    if not isinstance(text, str):
        text = str(text)
    for value in environment_secrets():
        text = text.replace(value, "***")
    if "@" in text:
        text = _BARE_USERINFO.sub("***@", _USERINFO.sub(r"\1***@", text))
    return hide_signature(text)


def require_client(scheme: str) -> None:
    """Import the client library for ``scheme``; :class:`StorageError` naming the extra if it is absent."""
    if scheme not in SCHEMES:
        raise StorageError(f"unsupported URL scheme '{scheme}://' (supported: "
                           f"{', '.join(s + '://' for s in SCHEMES)}, or a local path)")
    module, extra = SCHEMES[scheme]
    for name in ("fsspec", module):
        try:
            importlib.import_module(name)
        except ImportError:
            raise StorageError(f"reading {scheme}:// needs the '{name}' package: pip install "
                               f"'dali-bridge[{extra}]'") from None
