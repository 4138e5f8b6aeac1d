"""The ``source`` mapping: its type and the keys that type allows, paths resolved against the file's
folder (or the current one, for a path given in an override), the webdataset, Parquet and
object-storage keys, and (for ``dali-bridge validate``) source paths that do not exist.
"""
from __future__ import annotations

import difflib
import re
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from ..util.checks import is_number, type_name
from ..util.quoting import quoted
from ..util.urls import is_url, scheme_of, secret_option
from ..util.text import text_problem
from .keys import KEYS, SOURCE_KEYS
from .model import PLANNED_SOURCE_TYPES, SourceSpec
from .problems import MISSING_SOURCE, ProblemCollector, check_int


def check_source(chk: ProblemCollector, data: dict, base_for: Callable[[tuple], Path], *,
                  check_paths: bool = False) -> SourceSpec:
    """The ``source`` mapping; paths resolved (``base_for`` says against which folder); with
    ``check_paths``, each path that does not exist is a problem at its key."""
    source = SourceSpec(type="folder")
    if "source" not in data:
        chk.add((), "missing required key 'source' (expected e.g. {type: folder, root: path/to/images})")
        return source
    src = chk.mapping(data.get("source"), ("source",), "the source")
    if src is None:
        return source
    stype, allowed = _check_source_type(chk, src)
    resolved: dict[str, Any] = {"type": stype}
    for key in ("root", "file_list", "shards", "manifest"):
        if key in src and key in allowed:
            value = src[key]
            if not isinstance(value, str) or not value:
                chk.add(("source", key), f"expected a path (string), found {type_name(value)} {quoted(value)}")
            elif text_problem(value):
                chk.add(("source", key), f"expected a path, the value {text_problem(value)}")
            elif is_url(value):
                resolved[key] = value  # an object in storage: not a path against the file's folder
            else:
                resolved[key] = resolve_path(value, base_for(("source", key)))
    if stype == "folder" and "root" not in src:
        chk.add(("source",), "missing required key 'source.root' (the folder whose sub-folders are the classes)")
    _check_url_kinds(chk, stype, resolved)
    if stype == "file_list" and "file_list" not in src:
        chk.add(("source",), "missing required key 'source.file_list' (a text file of 'path label' lines)")
    typed = _check_webdataset(chk, src, resolved, base_for(("source", "cache"))) if stype == "webdataset" else {}
    if stype == "parquet":
        typed = _check_parquet(chk, src, base_for(("source", "files")))
    if stype == "file_list":
        at_url = any(isinstance(resolved.get(key), str) and is_url(resolved[key]) for key in ("file_list", "root"))
        typed = _check_storage(chk, src, base_for(("source", "cache")), at_url=at_url)
    if check_paths:
        check_source_paths(chk, resolved)
    extensions = src.get("extensions", list(KEYS["source.extensions"].default))
    if not (isinstance(extensions, list) and extensions and all(isinstance(e, str) and e for e in extensions)):
        chk.add(("source", "extensions"), f"expected a non-empty list of file extensions like ['.jpg'], "
                                          f"found {quoted(extensions)}")
        extensions = list(KEYS["source.extensions"].default)
    extensions = tuple(("." + e.lstrip(".")).lower() for e in extensions)
    max_pixels = check_int(chk, src, KEYS["source.max_pixels"])
    max_bytes = check_int(chk, src, KEYS["source.max_bytes"])
    if stype in KEYS["source.type"].choices:
        source = SourceSpec(type=stype, root=resolved.get("root"), file_list=resolved.get("file_list"),
                            extensions=extensions, max_pixels=max_pixels, max_bytes=max_bytes, **typed)
    return source


def _check_source_type(chk: ProblemCollector, src: dict) -> tuple[Any, tuple[str, ...]]:
    """``source.type`` and the keys that type allows (the schema's :data:`~dali_bridge.spec.keys.SOURCE_KEYS`)."""
    stype, types = src.get("type"), KEYS["source.type"].choices
    if stype is None:
        chk.add(("source",), f"missing required key 'source.type' (expected one of {', '.join(types)})")
    elif stype in PLANNED_SOURCE_TYPES:
        chk.add(("source", "type"), f"source type '{stype}' is not supported in this version "
                                    f"(supported: {', '.join(types)})")
    elif stype not in types:
        hint = difflib.get_close_matches(str(stype), types, n=1)
        chk.add(("source", "type"), f"expected one of {', '.join(types)}, found {quoted(stype)}"
                                    + (f"; did you mean '{hint[0]}'?" if hint else ""))
    allowed = SOURCE_KEYS.get(stype, ("type",))
    if stype in types:
        chk.unknown_keys(src, allowed, ("source",), f"a '{stype}' source")
    return stype, allowed


def _check_url_kinds(chk: ProblemCollector, stype: Any, resolved: Mapping[str, Any]) -> None:
    """What a URL may name: not a folder source's root (object stores have no folders to walk), and
    the shards and their manifest both local or both at URLs of one scheme."""
    root = resolved.get("root")
    if stype == "folder" and isinstance(root, str) and is_url(root):
        chk.add(("source", "root"), f"a folder source reads a local folder, not {root}: for images in object "
                                    f"storage use a file_list (a list of 'path label' lines, at a URL or local, "
                                    f"with root: {root}), webdataset shards at a URL (dali-bridge convert writes "
                                    f"them there) or Parquet files at a URL")
    shards, manifest = resolved.get("shards"), resolved.get("manifest")
    if isinstance(shards, str) and isinstance(manifest, str) and scheme_of(shards) != scheme_of(manifest):
        where = {None: "a local path"}
        chk.add(("source", "manifest"), f"expected the manifest where the shards are: the shards are "
                                        f"{where.get(scheme_of(shards), 'at ' + str(scheme_of(shards)) + '://')}, the "
                                        f"manifest {where.get(scheme_of(manifest), 'at ' + str(scheme_of(manifest)) + '://')}")


def check_source_paths(chk: ProblemCollector, paths: Mapping[str, Any]) -> None:
    """A problem at ``source.KEY`` for each resolved local source path that does not exist, with a
    did-you-mean. A location at a URL is never read as a path: the spec does not reach the network
    (``dali-bridge validate`` checks it through the store, :mod:`dali_bridge.data.sources.source_check`)."""
    from ..util.braces import expand_braces

    for key, noun in (("root", "folder"), ("file_list", "file"), ("manifest", "file")):
        value = paths.get(key)
        if value is not None and not is_url(value) and not Path(value).exists():
            chk.add(("source", key), _missing_path_hint(Path(value), noun), MISSING_SOURCE)
    if paths.get("shards") is None or is_url(paths["shards"]):
        return
    try:
        shards = expand_braces(paths["shards"])
    except ValueError:
        return  # the pattern itself is reported by _check_webdataset
    missing = [shard for shard in shards if not os.path.isfile(shard)]
    if missing:
        chk.add(("source", "shards"), f"{len(missing)} of {len(shards)} shard(s) do not exist; the first: "
                                      f"{_missing_path_hint(Path(missing[0]), 'file')}", MISSING_SOURCE)


def _missing_path_hint(missing: Path, noun: str) -> str:
    """``folder /d/imagnet does not exist; did you mean /d/imagenet?``, naming the first missing part."""
    first = missing
    while not first.parent.exists() and first.parent != first:
        first = first.parent
    what = "folder" if first != missing else noun
    text = f"{what} {first} does not exist" + (f" (so neither does {missing})" if first != missing else "")
    siblings = [p.name for p in first.parent.iterdir()] if first.parent.is_dir() else []
    hint = difflib.get_close_matches(first.name, siblings, n=1, cutoff=0.6)
    return text + (f"; did you mean {first.parent / hint[0]}?" if hint else "")


def _member_keys(value: Any) -> tuple[str, ...] | None:
    """``"jpg;png"``, ``".JPG"`` or ``["jpg", "png"]`` → ``("jpg", "png")``; None when malformed."""
    items = value.split(";") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        return None
    keys = tuple(i.strip().lstrip(".").lower() for i in items)
    return keys if keys and all(keys) else None


def _check_webdataset(chk: ProblemCollector, src: dict, resolved: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """The webdataset keys: ``shards`` required (brace pattern), ``image_key``/``label_key``/``manifest``."""
    from ..util.braces import expand_braces

    out: dict[str, Any] = {"shards": resolved.get("shards"), "manifest": resolved.get("manifest")}
    if "shards" not in src:
        chk.add(("source",), "missing required key 'source.shards' (a tar shard pattern such as "
                             "data/train-{000000..000127}.tar)")
    elif out["shards"] is not None:
        try:
            expand_braces(src["shards"])  # the pattern as written, for the message
        except ValueError as exc:
            chk.add(("source", "shards"), str(exc))
    for key, default, what in (("image_key", KEYS["source.image_key"].default,
                                "an extension or a ';'-separated list like jpg;png"),
                               ("label_key", (KEYS["source.label_key"].default,), "one member extension like cls")):
        keys = _member_keys(src.get(key, list(default)))
        if keys is None or (key == "label_key" and len(keys) != 1):
            chk.add(("source", key), f"expected {what}, found {type_name(src[key])} {quoted(src[key])}")
            keys = default
        out["image_keys" if key == "image_key" else key] = keys if key == "image_key" else keys[0]
    if out["label_key"] in out["image_keys"]:
        chk.add(("source", "label_key"), f"label_key '{out['label_key']}' is also an image key")
    shards = src.get("shards")
    out.update(_check_storage(chk, src, base_dir, at_url=isinstance(shards, str) and is_url(shards)))
    return out


def _check_parquet(chk: ProblemCollector, src: dict, base_dir: Path) -> dict[str, Any]:
    """The parquet keys: ``files`` required (a path, glob or brace pattern, or a list of them, each
    resolved against ``base_dir``), ``image_column`` and ``label_column`` (column names)."""
    from ..util.braces import expand_braces

    out: dict[str, Any] = {}
    files = src.get("files")
    entries = [files] if isinstance(files, str) else files
    if "files" not in src:
        chk.add(("source",), "missing required key 'source.files' (a Parquet file, a glob such as "
                             "data/train-*.parquet, a brace pattern, or a list of them)")
    elif not (isinstance(entries, list) and entries and all(isinstance(e, str) and e for e in entries)):
        chk.add(("source", "files"), f"expected a path, glob or brace pattern, or a non-empty list of them, found "
                                     f"{type_name(files)} {quoted(files)}")
    elif any(text_problem(e) for e in entries):
        chk.add(("source", "files"), f"expected paths, the value {next(filter(None, map(text_problem, entries)))}")
    else:
        for entry in entries:
            try:
                expand_braces(entry)
            except ValueError as exc:
                chk.add(("source", "files"), str(exc))
        if len({scheme_of(e) for e in entries}) > 1:
            chk.add(("source", "files"), "expected files all local or all at URLs of one scheme (s3://, gs://, "
                                         "http(s)://), found a mix: list each set as a source of its own")
        # an object in storage is not a path against the file's folder
        out["files"] = tuple(entry if is_url(entry) else resolve_path(entry, base_dir) for entry in entries)
    for key in ("image_column", "label_column"):
        value = src.get(key, KEYS[f"source.{key}"].default)
        if not isinstance(value, str) or not value:
            chk.add(("source", key), f"expected a column name, found {type_name(value)} {quoted(value)}")
        else:
            out[key] = value
    if out.get("image_column") is not None and out.get("image_column") == out.get("label_column"):
        chk.add(("source", "label_column"), f"label_column '{out['label_column']}' is also the image column")
    out.update(_check_storage(chk, src, base_dir, at_url=any(is_url(e) for e in out.get("files", ()))))
    return out


def _check_storage(chk: ProblemCollector, src: dict, base_dir: Path, at_url: bool) -> dict[str, Any]:
    """``storage_options`` (non-secret client settings), ``max_requests``, ``timeout`` and ``cache`` of a
    source ``at_url`` (shards, Parquet files, a file list's images)."""
    out: dict[str, Any] = {"max_requests": check_int(chk, src, KEYS["source.max_requests"])}
    timeout_key = KEYS["source.timeout"]
    timeout = src.get("timeout", timeout_key.default)
    if not is_number(timeout) or timeout not in timeout_key.interval:
        chk.add(("source", "timeout"), f"expected seconds in {timeout_key.interval}, found {quoted(timeout)}")
        timeout = timeout_key.default
    out["timeout"] = float(timeout)
    options = src.get("storage_options", dict(KEYS["source.storage_options"].default))
    if not isinstance(options, dict):
        chk.add(("source", "storage_options"), f"expected a mapping of client settings (fsspec's storage_options), "
                                               f"found {type_name(options)}")
        options = {}
    for name, value in _flattened(options):
        if secret_option(name):
            # Never echo the value: it may be the credential itself.
            chk.add(("source", "storage_options"), f"'{name}' looks like a credential; credentials come from the "
                                                   f"environment and config files (AWS_* variables, AWS_PROFILE, "
                                                   f"GOOGLE_APPLICATION_CREDENTIALS), never the pipeline file")
        elif not (value is None or isinstance(value, (str, bool, int, float))):
            chk.add(("source", "storage_options"), f"'{name}': expected text, a number, true/false or null")
    out["storage_options"] = options
    out["redirect_hosts"] = _check_redirect_hosts(chk, src)
    out.update(_check_cache(chk, src, base_dir))
    if not at_url:
        what = {"shards": "source.shards is a local path", "files": "source.files are local paths"}.get(
            next((key for key in ("shards", "files") if key in src), ""), "source.file_list and source.root are local")
        for key in ("storage_options", "max_requests", "timeout", "redirect_hosts", "cache"):
            if key in src:
                chk.add(("source", key), f"'{key}' applies to a source at a URL (s3://, gs://, http(s)://); {what}")
    return out


def _check_redirect_hosts(chk: ProblemCollector, src: dict) -> tuple[str, ...]:
    """``source.redirect_hosts``: host names (``host`` or ``host:port``) a read may be redirected to."""
    hosts = src.get("redirect_hosts", list(KEYS["source.redirect_hosts"].default))
    if isinstance(hosts, str):
        hosts = [hosts]
    good = isinstance(hosts, list) and all(
        isinstance(h, str) and re.fullmatch(r"[A-Za-z0-9._-]+(:[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](:[0-9]{1,5})?", h)
        for h in hosts)
    if not good:
        chk.add(("source", "redirect_hosts"), f"expected a list of host names such as [cdn.example.com, "
                                              f"mirror.example.org:8443] (no scheme, no path), found {quoted(hosts)}")
        return ()
    return tuple(h.lower() for h in hosts)


def _check_cache(chk: ProblemCollector, src: dict, base_dir: Path) -> dict[str, Any]:
    """``source.cache: {dir: PATH, max_bytes: SIZE}``: whole objects (shards, Parquet files, images)
    cached on the node."""
    from ..util.sizes import parse_size

    if "cache" not in src:
        return {}
    cache = chk.mapping(src["cache"], ("source", "cache"), "the shard cache")
    if cache is None:
        return {}
    chk.unknown_keys(cache, ("dir", "max_bytes"), ("source", "cache"), "source.cache")
    folder, size = cache.get("dir"), parse_size(cache.get("max_bytes"))
    if not isinstance(folder, str) or not folder or text_problem(folder):
        chk.add(("source", "cache", "dir"), f"expected the cache folder's path, found {quoted(folder)}")
        folder = None
    elif is_url(folder):
        chk.add(("source", "cache", "dir"), f"expected a folder on this node's disk (the cache holds local copies "
                                            f"of the objects), found the URL {folder}")
        folder = None
    if size is None or size < 1:
        chk.add(("source", "cache", "max_bytes"), f"expected a size in bytes such as 200000000000 or '200GB', "
                                                  f"found {quoted(cache.get('max_bytes'))}")
    return {"cache_dir": resolve_path(folder, base_dir) if folder else None, "cache_max_bytes": size}


def _flattened(options: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted name, value) of every leaf of a nested mapping (``client_kwargs.region_name``)."""
    leaves: list[tuple[str, Any]] = []
    for name, value in options.items():
        dotted = f"{prefix}{name}"
        if isinstance(value, dict):
            leaves.extend(_flattened(value, dotted + "."))
        else:
            leaves.append((dotted, value))
    return leaves


def resolve_path(value: str, base_dir: Path) -> str:
    """``value`` (``~`` expanded) as an absolute path, a relative one taken against ``base_dir``."""
    path = Path(os.path.expanduser(value))
    return str(path if path.is_absolute() else (base_dir / path).resolve())
