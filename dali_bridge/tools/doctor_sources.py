"""What ``dali-bridge doctor`` says about object storage on this host: which schemes' clients are
installed, and — for pipeline files it is given — whether this host reaches each one's source,
checked as ``validate`` checks it (a local path's existence; at a URL, the loader's listing or
HEAD through the store, within ``source.timeout``). A URL is never read as a local path."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from ..data.sources.source_check import source_problems
from ..spec.pipeline import load_spec, source_at_url
from ..spec.problems import SpecError
from ..util.urls import SCHEMES, StorageError, require_client


def storage_clients() -> dict[str, str]:
    """Each URL scheme → its client and version, or the extra that installs it."""
    out: dict[str, str] = {}
    for schemes in (("s3",), ("gs", "gcs"), ("http", "https")):
        module = SCHEMES[schemes[0]][0]
        try:
            require_client(schemes[0])
        except StorageError as exc:
            answer = f"unavailable: {exc}"
        else:
            try:
                answer = f"{module} {version(module)}"
            except PackageNotFoundError:
                answer = module
        out[", ".join(f"{scheme}://" for scheme in schemes)] = answer
    return out


def source_reach(path: str) -> dict[str, Any]:
    """Whether this host reads the source of the pipeline at ``path``: ``{"source": where,
    "reached": "yes ..." | "no: ..."}``."""
    try:
        spec = load_spec(path, check_sources=True)
    except SpecError as exc:
        return {"source": "-", "reached": f"no: {len(exc.problems)} problem(s) in the file: "
                                          + "; ".join(f"{p.path}: {p.message}" for p in exc.problems[:5])}
    except OSError as exc:
        return {"source": "-", "reached": f"no: cannot read the file: {exc.strerror or exc}"}
    source = spec.source
    where = next(filter(None, (source.shards, source.file_list, ", ".join(source.files or ()), source.root)), "-")
    if not source_at_url(source):
        return {"source": f"{source.type} {where}", "reached": "yes (local)"}
    problems = source_problems(source)
    if problems:
        return {"source": f"{source.type} {where}",
                "reached": "no: " + "; ".join(f"source.{key}: {message}" for key, message in problems)}
    return {"source": f"{source.type} {where}",
            "reached": f"yes (listed as the loader lists it, within source.timeout {source.timeout:g} s)"}
