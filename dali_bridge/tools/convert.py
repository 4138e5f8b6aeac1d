"""``dali-bridge convert``: pack an image folder (or file list, or Parquet files) into WebDataset tar shards.

Samples are written in the source listing's order, so a shard listing indexes sample ``i`` as
the folder listing does, and the same seed gives the same batches from either. Image bytes are
copied as they are (no re-encoding), after the loader's own checks: a file the loader would
refuse (not a regular file, too large, not a complete JPEG, PNG or WebP) is left out and named
in the result and the manifest — the shards' indices then skip it.
Each sample is two members, ``KEY.cls`` (the label as decimal text) then ``KEY.<ext>`` (the
image, its original extension lower-cased), where KEY is the file's path relative to the source
root without its extension (for a Parquet row, ``<file name>/<row number>``, the extension from
the image's format). The label comes first so that a shard cut short inside an image
still lists that sample, whose read then fails under ``on_error``.

Next to the shards: a DALI index per shard (``wds2idx`` format v1.2, so ``fn.readers.webdataset``
can use them too) and a manifest JSON (counts, classes, label mapping, sha256 per shard).
Every file is first written to a temporary file in the output folder, created exclusively
under an unpredictable name (never through a link planted there), and the temporary files are
renamed to their final names only once all are written, the manifest last: an interrupted or
failed run (disk full, kill) leaves the previous set as it was. A final name that is a link is
refused, never replaced. One lock per pattern (``.<manifest>.lock``, ``flock``) refuses a second
convert into the same pattern while one runs (all of this in :mod:`dali_bridge.tools.convert_staging`).
Output is byte-for-byte reproducible (fixed mtime/owner in headers).
"""
from __future__ import annotations

import hashlib
import io
import itertools
import json
import math
import os
import posixpath
import re
import tarfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from ..data.shards.tar import index_path, manifest_path
from .convert_staging import (DIRECTIVE, ConvertError, existing_outputs, leftover_temporaries, pattern_lock,
    refuse_links, Staging, check_pattern, index_problem)
from ..data.sources.formats import inspect_image
from ..util.urls import is_url
from ..errors import ImageError
from ..data.sources.parquet import ParquetSamples, list_parquet
from ..util.checks import is_int
from ..util.quoting import safe_name
from ..errors import SourceError
from ..data.sources.listing import Listing
from ..data.sources.webdataset import manifest_problem, read_manifest_json
from ..data.sources.local import list_file, list_folder
from ..data.storage.store import store_for
from ..spec.model import DEFAULT_EXTENSIONS
from ..util.text import NotUtf8Error
from ..util.messages import package_log

MANIFEST_FORMAT = "dali-bridge/webdataset"
MANIFEST_VERSION = 1
DALI_INDEX_VERSION = "v1.2"
log = package_log()


@dataclass(frozen=True)
class ConvertResult:
    """What a conversion wrote: the shard files (in order), their manifest and the YAML pattern."""
    shards: tuple[str, ...]
    manifest: str
    samples: int
    bytes_written: int
    seconds: float
    pattern: str   # brace pattern of the shards written, for ``source: {type: webdataset, shards: ...}``
    skipped: tuple[tuple[str, str], ...] = ()   # (file, reason) of each file left out

    def describe_skipped(self, most: int = 20) -> str:
        """The files left out, one per line with the reason (the manifest lists them all)."""
        lines = [f"left out {len(self.skipped)} file(s) the loader would refuse (listed in {self.manifest}):"]
        lines += [f"  {safe_name(path)}: {reason}" for path, reason in self.skipped[:most]]
        if len(self.skipped) > most:
            lines.append(f"  ... and {len(self.skipped) - most} more")
        return "\n".join(lines)


def brace_pattern(out_pattern: str, count: int) -> str:
    """``train-%06d.tar`` for 3 shards → ``train-{000000..000002}.tar`` (what a pipeline's ``shards`` takes)."""
    def repl(match: re.Match) -> str:
        width = int(match.group(2) or 0) if match.group(1) else 0
        return "{" + f"{0:0{width}d}..{count - 1:0{width}d}" + "}"
    return DIRECTIVE.sub(repl, out_pattern.replace("%%", "\0")).replace("\0", "%")


class _HashingWriter:
    """A write-only file that hashes what passes through (the shard's sha256 without a re-read)."""

    def __init__(self, handle: BinaryIO):
        self.handle = handle
        self.sha256 = hashlib.sha256()
        self.written = 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.written += len(data)
        return self.handle.write(data)

    def tell(self) -> int:
        return self.written


def _sample_keys(listing: Listing) -> list[str]:
    """Member keys: the path relative to the listing root without extension, dots and spaces → ``_``.

    webdataset and DALI split a member name at the first dot of its last component, and DALI's
    index separates fields by spaces, so neither may appear in a key. Files outside the root
    (absolute paths in a file list) get ``sample_<index>``.
    """
    keys: list[str] = []
    seen: dict[str, str] = {}
    parquet = isinstance(listing.shards, ParquetSamples)
    for number, path in enumerate(listing.paths):
        if parquet:   # file.parquet#row → file/00000017
            file, row = path.rsplit("#", 1)
            stem = f"{os.path.basename(file).removesuffix('.parquet')}/{int(row):08d}"
        elif is_url(path):   # a file list's image at a URL: its key relative to the list's folder
            prefix = listing.root.rstrip("/") + "/"
            relative = path[len(prefix):] if path.startswith(prefix) else ".."
            stem = f"sample_{number:08d}" if relative == ".." else posixpath.splitext(relative)[0]
        else:
            relative = os.path.relpath(path, listing.root)
            if relative.startswith(".." + os.sep) or relative == "..":
                stem = f"sample_{number:08d}"
            else:
                stem = os.path.splitext(relative)[0].replace(os.sep, "/")
        key = re.sub(r"[.\s]", "_", stem)
        if key in seen:
            raise ConvertError(f"{path} and {seen[key]} map to the same shard key {key!r} (keys drop the extension "
                               f"and turn dots and spaces into '_'): rename one of them")
        seen[key] = path
        keys.append(key)
    return keys


def _listing_for(source: str | Path | Listing, extensions: tuple[str, ...]) -> tuple[Listing, dict[str, str]]:
    if isinstance(source, Listing):
        return source, {"type": "listing", "path": source.root}
    if is_url(str(source)):   # objects read through the store, never a local path made of the URL
        store = store_for(str(source))
        if str(source).endswith(".parquet"):
            return list_parquet((str(source),), store=store), {"type": "parquet", "path": str(source)}
        return list_file(str(source), None, extensions, store), {"type": "file_list", "path": str(source)}
    path = Path(source)
    if str(source).endswith(".parquet"):   # a file, a glob or a brace pattern of them
        return list_parquet((str(source),)), {"type": "parquet", "path": str(source)}
    if path.is_dir():
        return list_folder(path, extensions), {"type": "folder", "path": str(path.resolve())}
    if path.is_file():
        return list_file(path, None, extensions), {"type": "file_list", "path": str(path.resolve())}
    raise ConvertError(f"source {source}: no such folder or file list")


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, 0, 0o644   # fixed fields: reproducible bytes
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def _write_tar(handle: BinaryIO, entries: Iterator[tuple[str, str, bytes, int]],
               index_lines: list[str]) -> tuple[int, str]:
    """Write the tar to ``handle`` (closed after), one DALI index line per sample; (bytes, sha256)."""
    with handle as raw:
        writer = _HashingWriter(raw)
        with tarfile.open(fileobj=writer, mode="w", format=tarfile.PAX_FORMAT) as archive:
            for key, ext, data, label in entries:  # streamed: one image in memory at a time
                fields = []
                for member_ext, payload in (("cls", str(label).encode("ascii")), (ext, data)):
                    name = f"{key}.{member_ext}"
                    archive.addfile(_member(name, len(payload)), io.BytesIO(payload))
                    data_offset = archive.offset - math.ceil(len(payload) / tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
                    fields.append(f"{member_ext} {data_offset} {len(payload)} {name}")
                index_lines.append(" ".join(fields))
        raw.flush()
        os.fsync(raw.fileno())
    return writer.written, writer.sha256.hexdigest()


def _write_shard(path: str, entries: Iterator[tuple[str, str, bytes, int]], staging: Staging) -> dict[str, Any]:
    """Write one shard and its DALI index as temporary files of ``staging``; its manifest entry."""
    index_lines: list[str] = []
    labels: list[int] = []

    def recorded() -> Iterator[tuple[str, str, bytes, int]]:
        for entry in entries:
            labels.append(entry[3])
            yield entry

    written, sha256 = _write_tar(staging.create(path), recorded(), index_lines)
    index = index_path(path)
    index_bytes = (f"{DALI_INDEX_VERSION} {len(index_lines)}\n".encode() + "\n".join(index_lines).encode("utf-8")
                   + b"\n")
    with staging.create(index) as handle:
        handle.write(index_bytes)
    # The labels (in tar order) and the index's digest let a reader at a URL list the shard from
    # the manifest and the index alone, instead of one ranged GET per sample for its label. One
    # string of class numbers, not a JSON list: the indented manifest would give each its own line.
    return {"file": os.path.basename(path), "index_file": os.path.basename(index), "samples": len(index_lines),
            "bytes": written, "sha256": sha256, "index_sha256": hashlib.sha256(index_bytes).hexdigest(),
            "labels": " ".join(map(str, labels))}


# A bigger file is not packed: no image a loader decodes comes near it, and each one is held
# in memory whole while it is written.
MAX_IMAGE_BYTES = 256 << 20


def _sample_bytes(listing: Listing, index: int, max_bytes: int) -> bytes:
    """Sample ``index``'s bytes through the loader's own read (regular file, recognised image),
    after a size check from ``stat``; :class:`ImageError` with the reason otherwise."""
    if isinstance(listing.shards, ParquetSamples):   # in memory with its row group already: measured once read
        data = listing.read(index)
        size = len(data)
    elif listing.shards is None:
        try:
            size = os.stat(listing.paths[index]).st_size
        except OSError as exc:
            raise ImageError(f"cannot read file: {exc.strerror or exc}") from None
    else:
        size = int(listing.shards.size[index])
    if size > max_bytes:
        raise ImageError(f"{size} bytes, over the {max_bytes}-byte limit for one image")
    return data if isinstance(listing.shards, ParquetSamples) else listing.read(index)


_FORMAT_EXTENSIONS = {"jpeg": "jpg", "png": "png", "webp": "webp"}


def _extension(listing: Listing, path: str, data: bytes) -> str:
    """A member's extension: the file's own, lower-cased; a Parquet row's from its image format."""
    if isinstance(listing.shards, ParquetSamples):
        return _FORMAT_EXTENSIONS[inspect_image(data, max_pixels=listing.max_pixels).format]
    return os.path.splitext(path)[1].lstrip(".").lower() or "bin"


@dataclass
class _Packing:
    """What the sample stream packed and left out, filled in as the shards are written."""
    skipped: list[tuple[str, str]] = field(default_factory=list)
    extensions: Counter = field(default_factory=Counter)
    labels: Counter = field(default_factory=Counter)
    packed: int = 0


def _packable(listing: Listing, keys: list[str], packing: _Packing, max_bytes: int,
              bar: Any) -> Iterator[tuple[str, str, bytes, int]]:
    """(key, extension, bytes, label) of every sample the loader would read; the others are
    recorded in ``packing.skipped`` with the reason, never packed."""
    for index, path in enumerate(listing.paths):
        bar.update(1)
        try:
            data = _sample_bytes(listing, index, max_bytes)
        except ImageError as exc:
            packing.skipped.append((path, str(exc)))
            continue
        ext = _extension(listing, path, data)
        label = int(listing.labels[index])
        packing.extensions[ext] += 1
        packing.labels[label] += 1
        packing.packed += 1
        yield keys[index], ext, data, label


def _write_shards(out_pattern: str, samples: Iterator[tuple[str, str, bytes, int]],
                  shard_size: int, staging: Staging) -> list[dict[str, Any]]:
    """Shards of ``shard_size`` samples from the stream until it ends; their manifest entries."""
    entries: list[dict[str, Any]] = []
    first_sample = 0
    while (first := next(samples, None)) is not None:
        entry = _write_shard(out_pattern % len(entries),
                             itertools.chain([first], itertools.islice(samples, shard_size - 1)), staging)
        entry["first_sample"] = first_sample
        first_sample += entry["samples"]
        entries.append(entry)
    return entries


def _owned_outputs(out_pattern: str) -> list[str] | None:
    """The shards and indexes the pattern's existing manifest lists under the pattern's own names
    (shard i as ``out_pattern % i``), as paths; None when there is no readable manifest."""
    target = manifest_path(out_pattern)
    if not os.path.exists(target):
        return None
    try:
        entries = read_manifest(target)["shards"]
    except (OSError, SourceError) as exc:
        log.warning("convert --overwrite: %s; shards it may list are left in place", exc)
        return None
    owned = []
    for number, entry in enumerate(entries):
        shard = out_pattern % number
        if entry["file"] == os.path.basename(shard):
            owned.append(shard)
            if entry.get("index_file") == os.path.basename(index_path(shard)):
                owned.append(index_path(shard))
    return owned


def _manifest(listing: Listing, source_info: dict[str, str], shard_size: int, pattern: str,
              packing: _Packing, entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "source": source_info,
        "samples": packing.packed,
        "shard_size": shard_size,
        "shards_pattern": os.path.basename(pattern),
        "label_key": "cls",
        "image_extensions": dict(sorted(packing.extensions.items())),
        "classes": list(listing.classes),
        "label_mapping": {name: label for label, name in enumerate(listing.classes)},
        "class_counts": {listing.classes[label]: packing.labels.get(label, 0) for label in range(len(listing.classes))},
        "skipped": [{"file": path, "reason": reason} for path, reason in packing.skipped],
        "shards": entries,
    }


def convert(source: str | Path | Listing, out_pattern: str, *, shard_size: int = 1000, overwrite: bool = False,
            progress: bool = False, extensions: tuple[str, ...] = DEFAULT_EXTENSIONS,
            max_image_bytes: int = MAX_IMAGE_BYTES) -> ConvertResult:
    """Pack ``source`` (an ImageFolder, a ``path label`` file list, Parquet files — a ``.parquet`` path,
    glob or brace pattern, read as ``source: {type: parquet}`` reads them — or a listing) into shards.

    ``out_pattern``: printf-style shard path (``shards/train-%06d.tar``); ``shard_size``: samples
    per shard (default 1000; ~100-200 MiB shards of ImageNet-sized JPEGs). Each file goes through
    the loader's own read (a regular file, a recognised JPEG, PNG or WebP) after a size check
    (``max_image_bytes``); one that fails is left out, and named with the reason in the result and
    the manifest (``skipped``) — the shards' sample indices then skip it too. Existing shards,
    indexes or manifest of the pattern raise :class:`ConvertError` unless ``overwrite``, which also
    deletes the higher-numbered shards the old manifest lists under the pattern's names (and
    nothing else). ``progress``: a bar on a terminal, periodic lines elsewhere (stderr).

    Nothing is replaced until every shard, index and the manifest are written (as temporary files
    beside them: an overwrite needs room for both sets): a failure before that (disk full) is a
    :class:`ConvertError` that leaves the old set as it was and no temporary file behind. A final
    name taken by a link, and a second convert into the pattern while this one runs, are refused.
    An ``out_pattern`` at a URL is written in a local folder first, then uploaded, manifest last.
    """
    if is_url(out_pattern):  # written locally, then uploaded (remote_tools)
        from .remote import convert_to_url

        return convert_to_url(source, out_pattern, convert_locally=convert, shard_size=shard_size, overwrite=overwrite,
                              progress=progress, extensions=extensions, max_image_bytes=max_image_bytes)
    check_pattern(out_pattern)
    if shard_size < 1:
        raise ConvertError(f"--shard-size: expected an integer >= 1, found {shard_size}")
    listing, source_info = _listing_for(source, extensions)
    keys = _sample_keys(listing)
    os.makedirs(os.path.dirname(os.path.abspath(out_pattern)), exist_ok=True)
    with pattern_lock(out_pattern):
        existing = existing_outputs(out_pattern, math.ceil(len(listing) / shard_size))
        refuse_links(existing)
        if existing and not overwrite:
            shown = ", ".join(existing[:5]) + (f" and {len(existing) - 5} more" if len(existing) > 5 else "")
            raise ConvertError(f"output exists: {shown} (pass --overwrite to replace it)")
        for leftover in leftover_temporaries(out_pattern):  # of a convert killed before: ours to remove now
            os.remove(leftover)
        owned = _owned_outputs(out_pattern) if overwrite else None
        staging = Staging(out_pattern)
        try:
            return _convert_staged(listing, keys, source_info, out_pattern, staging, owned=owned,
                                   shard_size=shard_size, progress=progress, max_image_bytes=max_image_bytes)
        except OSError as exc:
            where = safe_name(exc.filename) if exc.filename else staging.folder
            raise ConvertError(f"cannot write {where}: {exc.strerror or exc}; {staging.state()}") from None
        finally:
            staging.discard()


def _convert_staged(listing: Listing, keys: list[str], source_info: dict[str, str], out_pattern: str,
                    staging: Staging, *, owned: list[str] | None, shard_size: int, progress: bool,
                    max_image_bytes: int) -> ConvertResult:
    """The conversion proper, under the pattern's lock: every file written to ``staging``, then
    renamed into place (the manifest last), then the old set's shards past the new count removed."""
    from ..util.progress import progress as progress_bar

    start = time.perf_counter()
    packing = _Packing()
    with progress_bar(total=len(listing), unit="image", description="convert", enabled=progress) as bar:
        entries = _write_shards(out_pattern, _packable(listing, keys, packing, max_image_bytes, bar), shard_size,
                                staging)
    count = len(entries)
    if not count:
        raise ConvertError(f"no sample to pack: all {len(listing)} file(s) were left out, e.g. "
                           f"{safe_name(packing.skipped[0][0])}: {packing.skipped[0][1]}")
    pattern = brace_pattern(out_pattern, count)
    target = manifest_path(out_pattern)
    with staging.create(target) as handle:
        text = json.dumps(_manifest(listing, source_info, shard_size, pattern, packing, entries), indent=2)
        handle.write(text.encode("utf-8") + b"\n")
        handle.flush()
        os.fsync(handle.fileno())
    staging.commit()
    written = {out_pattern % n for n in range(count)} | {index_path(out_pattern % n) for n in range(count)}
    for path in owned or []:
        if path not in written and os.path.lexists(path):
            os.remove(path)
    return ConvertResult(tuple(out_pattern % n for n in range(count)), target, packing.packed,
                         sum(e["bytes"] for e in entries), time.perf_counter() - start, pattern,
                         tuple(packing.skipped))


def read_manifest(manifest: str | Path) -> dict[str, Any]:
    """A converter's manifest, parsed and checked (:func:`~dali_bridge.data.sources.webdataset.manifest_problem`);
    :class:`~dali_bridge.errors.SourceError` naming the file if it is not one."""
    manifest = Path(manifest)
    try:
        data = read_manifest_json(manifest)
    except NotUtf8Error as exc:
        raise SourceError(f"{exc.where}: not a dali-bridge shard manifest: {exc.detail}") from None
    except (ValueError, RecursionError) as exc:
        raise SourceError(f"{manifest}: not a dali-bridge shard manifest: not valid JSON: {exc}") from None
    problem = manifest_problem(data)
    if problem:
        raise SourceError(f"{manifest}: not a dali-bridge shard manifest: it {problem}")
    if not all(is_int(entry.get("bytes")) and isinstance(entry.get("sha256"), str) for entry in data["shards"]):
        raise SourceError(f"{manifest}: not a dali-bridge shard manifest: a shards entry lacks its 'bytes' "
                          f"count or 'sha256'")
    return data


def verify_shards(manifest: str | Path, *, progress: bool = False) -> list[str]:
    """Check every shard a manifest lists: present, the recorded size and sha256, and the index beside
    it the one whose sha256 the manifest records (when it records one). Returns the problems.

    Shard names must be file names in the manifest's own folder (no ``../``, no absolute path),
    and a file is hashed only when its size is the recorded one, reading at most that many bytes.
    ``progress``: shards checked so far, on stderr.
    """
    from ..util.progress import progress as progress_bar

    if is_url(str(manifest)):  # HEADs and streamed hashes (remote_tools)
        from .remote import verify_url

        return verify_url(str(manifest), progress=progress)
    manifest = Path(manifest)
    data = read_manifest(manifest)
    with progress_bar(total=len(data["shards"]), unit="shard", description=f"verify {safe_name(manifest)}",
                      enabled=progress) as bar:
        return _verify_local(manifest, data, bar)


def _verify_local(manifest: Path, data: dict[str, Any], bar: Any) -> list[str]:
    problems = []
    for entry in data["shards"]:
        bar.update(1)
        path = manifest.parent / entry["file"]
        problems.extend(filter(None, [_local_shard_problem(path, entry),
                                      _local_index_problem(Path(index_path(str(path))), entry, manifest)]))
    return problems


def _local_shard_problem(path: Path, entry: dict[str, Any]) -> str | None:
    if not path.is_file():
        return f"{safe_name(path)}: {'missing' if not os.path.lexists(path) else 'not a regular file'}"
    if path.stat().st_size != entry["bytes"]:
        return f"{safe_name(path)}: {path.stat().st_size} bytes, the manifest records {entry['bytes']}"
    digest = _file_sha256(path, entry["bytes"])
    if digest != entry["sha256"]:
        return f"{safe_name(path)}: sha256 {digest} differs from the manifest's {safe_name(entry['sha256'])}"
    return None


def _local_index_problem(index: Path, entry: dict[str, Any], manifest: Path) -> str | None:
    """Whether the index beside a shard is the one the manifest records (``index_sha256``, which
    lets a URL listing take the labels from the manifest); manifests of older converters record none."""
    expected = entry.get("index_sha256")
    if not isinstance(expected, str):
        return None
    if not index.is_file():
        return index_problem(safe_name(index), None, expected, safe_name(manifest))
    return index_problem(safe_name(index), _file_sha256(index, None), expected, safe_name(manifest))


def _file_sha256(path: Path, size: int | None) -> str:
    """The sha256 of ``path``'s first ``size`` bytes (None: all of them)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        left = math.inf if size is None else size
        while left > 0 and (block := handle.read(int(min(left, 1 << 20)))):
            digest.update(block)
            left -= len(block)
    return digest.hexdigest()
