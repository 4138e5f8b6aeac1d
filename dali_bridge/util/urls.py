"""Where a location points and what a message may show of it: URL schemes and the client library
(and extra) each needs, joining and splitting object URLs, and the redaction every storage message
passes through — secrets the environment holds, ``user:password@``, a signed URL's credentials.

It sits below the object store (:mod:`dali_bridge.data.storage.store`, which re-exports every name here) so
that the listing, the converter and the tools can ask "is this a URL?" without the store.
"""
from __future__ import annotations

import importlib
import os
import re

# Object-store schemes → (the module that implements them, the extra that installs it).
SCHEMES = {"s3": ("s3fs", "s3"), "gs": ("gcsfs", "gcs"), "gcs": ("gcsfs", "gcs"),
           "http": ("aiohttp", "http"), "https": ("aiohttp", "http")}
SECRET_WORDS = ("secret", "token", "password", "passwd", "credential", "key_id", "access_key", "private",
                "session", "auth", "anon_key")
_SECRET_ENV = re.compile(r"(SECRET|TOKEN|PASSWORD|SESSION|CREDENTIAL|ACCESS_KEY)", re.IGNORECASE)
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")

# What a signed URL's query carries of the credentials (SigV4 and the older SigV2 names), in any case
# and percent-encoded or not: the values are hidden wherever a message might quote the URL.
_SIGNED_QUERY = re.compile(r"((?:X-Amz-(?:Signature|Credential|Security-Token)|Signature|AWSAccessKeyId|"
                           r"x-amz-security-token)(?:=|%3D))[^&\s'\"]+", re.IGNORECASE)


def hide_signature(text: str) -> str:
    """``text`` with the credential parts of any signed URL's query replaced by ``***``."""
    return _SIGNED_QUERY.sub(r"\1***", text)


class StorageError(OSError):
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


def redact(text: str) -> str:
    """``text`` without any secret the environment holds (``AWS_SECRET_ACCESS_KEY``, tokens, the
    access key id) and without ``user:password@`` in URLs: for every message shown or logged."""
    for name, value in os.environ.items():
        if value and len(value) >= 8 and (_SECRET_ENV.search(name) or name == "AWS_ACCESS_KEY_ID"):
            text = text.replace(value, "***")
    return hide_signature(_USERINFO.sub("***@", text))


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
