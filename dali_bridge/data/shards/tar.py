"""WebDataset tar shards: the member scan and positioned reads of one sample (brace patterns are
expanded by :mod:`dali_bridge.util.braces`, importable from here too).

A shard is a plain tar whose members are grouped into samples by key: ``KEY.cls`` (the label,
an integer as text) and ``KEY.jpg`` (the encoded image) are one sample; the key is the member
name up to the first dot of its last path component, as in the ``webdataset`` package and DALI.

The bridge does not stream shards: it scans each shard's headers once (stdlib ``tarfile``) into
a table of (shard, byte offset, size) per sample, and a sample is then one positioned read
(``os.pread``) from an open shard. That keeps the sources interchangeable: order, rank sharding,
per-sample parameters and resumption are the folder source's, on every backend.
"""
from __future__ import annotations

import os
import re
import tarfile
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Callable, Sequence

import numpy as np

from ...util.braces import MAX_BRACE_GROUPS, MAX_BRACE_NAMES, brace_count, expand_braces  # noqa: F401
from ...errors import ImageError
from ...util.quoting import safe_name

# Samples whose shards stay open per process. pread does not move the file offset, so one
# descriptor can serve every thread and forked worker; the cap stays far below `ulimit -n`.
MAX_OPEN_SHARDS = 64

_DIGITS = re.compile(r"^[0-9]+$")  # ASCII digits only: str.isdigit also accepts '²' and '١'
MAX_LABEL_BYTES = 64


def split_member(name: str) -> tuple[str, str]:
    """``dir/n0144_12.jpg`` → (``dir/n0144_12``, ``jpg``): the key ends at the last component's first dot."""
    dot = name.find(".", name.rfind("/") + 1)
    return (name, "") if dot < 0 else (name[:dot], name[dot + 1:])


def index_path(shard: str) -> str:
    """Where the DALI index of a shard lives: ``train-000000.tar`` → ``train-000000.idx``."""
    return os.path.splitext(shard)[0] + ".idx"


def manifest_path(pattern: str) -> str:
    """The converter's manifest for a shard pattern, printf (``shards/train-%06d.tar``) or brace
    (``shards/train-{000000..000127}.tar``) style: ``shards/train.manifest.json``.

    The name is the file name before the shard number, trailing ``-_.`` dropped (``manifest.json``
    when nothing is left).
    """
    folder, name = os.path.split(pattern)
    prefix = re.split(r"%[0-9]*d|\{", name, maxsplit=1)[0].rstrip("-_.")
    return os.path.join(folder, f"{prefix}.manifest.json" if prefix else "manifest.json")


@dataclass
class ShardScan:
    """One shard's samples in tar order, what was ignored, and every problem found."""
    keys: list[str] = field(default_factory=list)
    image_names: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)    # bytes from the file start to the image payload
    sizes: list[int] = field(default_factory=list)      # image payload bytes as the tar header says
    labels: list[int] = field(default_factory=list)
    ignored: Counter = field(default_factory=Counter)   # member extension → members not used
    problems: list[str] = field(default_factory=list)
    from_index: bool = False                            # members came from the shard's DALI index


# (member name, payload offset, payload size) in tar order, regular files only.
Member = tuple[str, int, int]


def _members_from_index(path: str, size_on_disk: int, handle: BinaryIO, scan: ShardScan) -> list[Member] | None:
    """The members a DALI index (``wds2idx`` v1.2) lists, checked against the tar; None to scan the tar.

    An index older than its shard, or one that does not parse as v1.2, is not used (the tar's
    headers are read instead). One that parses is checked against the shard (see
    :func:`_index_disagreement`): if it disagrees, the shard is refused with a problem naming
    both files, as a stale or edited index would otherwise give wrong labels or lose samples.
    """
    index = index_path(path)
    try:
        if os.path.getmtime(index) < os.path.getmtime(path):
            return None
        with open(index, encoding="utf-8") as handle_index:
            text = handle_index.read()
    except (OSError, UnicodeDecodeError):
        return None
    members = parse_index(text, os.path.basename(index), os.path.basename(path), size_on_disk, scan)
    if not members:
        return members
    try:
        problem = _index_disagreement(handle, members, size_on_disk)
    except ValueError as exc:
        problem = str(exc)
    if problem:
        scan.problems.append(f"{os.path.basename(index)} disagrees with {os.path.basename(path)}: {problem} — "
                             f"delete the index or re-create it from the shard")
        return []
    return members


def parse_index(text: str, index_name: str, shard_name: str, shard_size: int, scan: ShardScan) -> list[Member] | None:
    """The members a DALI index (``wds2idx`` v1.2) lists, if they fit a shard of ``shard_size``
    bytes; None when the index is not usable (another version, a name with a space, a shard cut
    after indexing: the tar scan decides), [] with a problem added when a field is malformed."""
    header, _, body = text.partition("\n")
    header_fields, lines = header.split(), body.splitlines()
    if (len(header_fields) != 2 or header_fields[0] != "v1.2" or not header_fields[1].isdigit()
            or int(header_fields[1]) != len(lines)):
        return None
    members: list[Member] = []
    for line in lines:
        fields = line.split(" ")
        if len(fields) % 4:
            return None  # a member name with a space: the format cannot say where it ends
        for i in range(0, len(fields), 4):
            offset, size = fields[i + 1], fields[i + 2]
            if not (offset.isdigit() and size.isdigit() and offset.isascii() and size.isascii()):
                scan.problems.append(f"{index_name}: member {safe_name(fields[i + 3])} has offset {offset!r} "
                                     f"and size {size!r}; expected non-negative integers — delete the index "
                                     f"or re-create it from {shard_name}")
                return []
            members.append((fields[i + 3], int(offset), int(size)))
    end = max((offset + size for _, offset, size in members), default=0)
    if end + 2 * tarfile.BLOCKSIZE > shard_size:
        return None  # the shard was cut after indexing: the tar scan says where
    return members


@dataclass(frozen=True)
class _Header:
    """The fields of one tar header block the index check needs."""
    name: str
    size: int
    regular: bool


def _header_at(handle: BinaryIO, position: int) -> _Header | None:
    """The tar header block at byte ``position`` (None for an end-of-archive block); ValueError if damaged.

    Only the checksum, name, size and type are decoded (``tarfile``'s own field helpers): a full
    ``TarInfo`` per member would cost more than scanning the tar.
    """
    return parse_header(os.pread(handle.fileno(), tarfile.BLOCKSIZE, position), position)


def parse_header(block: bytes, position: int) -> _Header | None:
    """:func:`_header_at` of a header block already read (``position``: where it was, for messages)."""
    if len(block) < tarfile.BLOCKSIZE:
        raise ValueError(f"no tar header at byte {position}: the file ends there")
    if block.count(0) == tarfile.BLOCKSIZE:
        return None
    try:
        checksum, size = tarfile.nti(block[148:156]), tarfile.nti(block[124:136])
    except tarfile.HeaderError as exc:
        raise ValueError(f"no valid tar header at byte {position} ({exc})") from None
    if checksum != sum(block) - sum(block[148:156]) + 256 and checksum not in tarfile.calc_chksums(block):
        raise ValueError(f"no valid tar header at byte {position} (bad checksum)")
    name = block[:100].split(b"\0", 1)[0]
    prefix = block[345:500].split(b"\0", 1)[0]
    if block[257:263] == tarfile.POSIX_MAGIC[:6] and prefix:
        name = prefix + b"/" + name
    return _Header(name.decode("utf-8", "surrogateescape"), size, block[156:157] in tarfile.REGULAR_TYPES)


def _blocks(size: int) -> int:
    return -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def _index_disagreement(handle: BinaryIO, members: list[Member], size_on_disk: int) -> str | None:
    """Why ``members`` (from an index) are not the shard's regular files in tar order, or None.

    Each member's header (the block before its payload) must be a regular file of the indexed
    size, named as indexed (when the name fits the header's 100-byte field; longer names live in
    a pax record before it). Between members, and after the last one up to the end-of-archive
    marker, only headers that are not regular files may sit (directories, pax records): a
    regular file there is a sample the index leaves out. One header read per member, plus one
    per gap entry; the payloads are never read. ValueError for a damaged header.
    """
    position = 0
    for name, offset, size in members + [("", -1, 0)]:
        end_marker = offset < 0
        while end_marker or position < offset - tarfile.BLOCKSIZE:
            info = _header_at(handle, position)
            if info is None:
                if end_marker:
                    return None
                return f"the index places {safe_name(name)} at byte {offset}, beyond the tar's end at byte {position}"
            if info.regular and not info.name.rsplit("/", 1)[-1].startswith("."):
                return f"member {safe_name(info.name)} at byte {position} is missing from the index"
            position += tarfile.BLOCKSIZE + _blocks(info.size)
        if position != offset - tarfile.BLOCKSIZE:
            return f"the index places {safe_name(name)} at byte {offset}, which is not where a member's data starts"
        info = _header_at(handle, position)
        encoded = name.encode("utf-8", "surrogateescape")
        named = info is not None and (info.name == name or len(encoded) > 100 or not encoded.isascii())
        if info is None or not info.regular or info.size != size or not named:
            found = "an end-of-archive block" if info is None else f"{safe_name(info.name)} ({info.size} bytes)"
            return f"the index places {safe_name(name)} ({size} bytes) at byte {offset}, where the tar holds {found}"
        position += tarfile.BLOCKSIZE + _blocks(size)
    return None


def _members_from_tar(handle: BinaryIO, name: str, scan: ShardScan) -> list[Member]:
    """Every regular member by reading the tar headers; a cut or damaged tar adds a problem."""
    members: list[Member] = []
    infos: list[tarfile.TarInfo] = []
    try:
        archive = tarfile.open(fileobj=handle, mode="r:")
    except tarfile.ReadError as exc:
        scan.problems.append(f"{name}: not a readable tar file ({exc})")
        return members
    try:
        for info in archive:
            infos.append(info)
    except tarfile.ReadError as exc:
        cut = infos[-1] if infos else None
        if cut is None or "unexpected end of data" not in str(exc):
            scan.problems.append(f"{name}: damaged tar after member {cut.name if cut else '(none)'}: {exc}")
        else:
            # The file ends inside this member's payload. Whatever followed it is gone, so the
            # shard is refused as a whole rather than read as a shorter, complete-looking one.
            scan.problems.append(f"{name}: truncated tar: the file ends at byte {handle.seek(0, os.SEEK_END)} "
                                 f"inside member {safe_name(cut.name)} ({cut.size} bytes declared from byte "
                                 f"{cut.offset_data}); samples after it, if any, are lost — re-copy or "
                                 f"re-convert this shard")
            key = split_member(cut.name)[0]
            while infos and split_member(infos[-1].name)[0] == key:  # its sample is incomplete: already reported
                infos.pop()
    else:
        end = archive.offset  # where tarfile stopped: the end-of-archive marker or an unreadable header
        handle.seek(end)
        rest = handle.read(tarfile.BLOCKSIZE)
        after = f"after member {safe_name(infos[-1].name)}" if infos else "at the start"
        if not rest:
            scan.problems.append(f"{name}: truncated tar: the file ends at byte {end} {after} without the "
                                 f"end-of-archive marker (samples after it, if any, are lost)")
        elif rest.strip(b"\0"):
            scan.problems.append(f"{name}: truncated or damaged tar header at byte {end} {after}")
    for info in infos:
        if info.isreg():
            members.append((info.name, info.offset_data, info.size))
        else:
            scan.ignored["(not a file)"] += 1
    return members


def _samples(members: list[Member], scan: ShardScan) -> list[tuple[str, list[Member]]]:
    """Members grouped by sample key in tar order; hidden members counted as ignored."""
    groups: list[tuple[str, list[Member]]] = []
    for member in members:
        key, ext = split_member(member[0])
        if not key or key.endswith("/") or key.rsplit("/", 1)[-1].startswith("."):
            scan.ignored[f".{ext}" if ext else "(hidden)"] += 1  # hidden files, as wds2idx skips them
            continue
        if groups and groups[-1][0] == key:
            groups[-1][1].append(member)
        else:
            groups.append((key, [member]))
    return groups


def _label(text: bytes | None, name: str, member: Member, scan: ShardScan) -> int | None:
    """The class number a label member holds (``text``: its payload, None when it was too large
    to read); None with a problem added if it holds none."""
    size = member[2]
    if size > MAX_LABEL_BYTES:
        scan.problems.append(f"{name}: label member {safe_name(member[0])} is {size} bytes; a label is a "
                             f"class number of at most {MAX_LABEL_BYTES} bytes")
        return None
    if text is None:
        scan.problems.append(f"{name}: label member {member[0]} could not be read")
        return None
    if len(text) != size:
        scan.problems.append(f"{name}: label member {safe_name(member[0])} is cut short (truncated shard)")
        return None
    text = text.decode("utf-8", "replace").strip()
    if not _DIGITS.match(text):
        scan.problems.append(f"{name}: {safe_name(member[0])} holds {text[:40]!r}; expected a non-negative "
                             f"integer as text")
        return None
    return int(text)


def _sample_members(name: str, key: str, group: list[Member], image_keys: tuple[str, ...], label_key: str,
                    scan: ShardScan) -> tuple[Member, Member] | None:
    """A sample's (image, label) members; None with a problem added when either is missing or a
    member is repeated. Other members are counted as ignored."""
    by_ext = {split_member(m[0])[1].lower(): m for m in group}
    if len(by_ext) < len(group):
        repeated = Counter(split_member(m[0])[1].lower() for m in group)
        scan.problems.append(f"{name}: sample {safe_name(key)} has {len(group)} members for {len(by_ext)} extensions "
                             f"(repeated: {', '.join('.' + e for e, n in repeated.items() if n > 1)}; "
                             f"found {', '.join(safe_name(m[0]) for m in group[:5])}): a key names one sample, with "
                             f"one member per extension")
        return None
    image = next((by_ext[k] for k in image_keys if k in by_ext), None)
    label_member = by_ext.get(label_key)
    for m in group:
        if m is not image and m is not label_member:
            scan.ignored["." + split_member(m[0])[1].lower()] += 1
    found = ", ".join(safe_name(m[0]) for m in group[:5]) + (f" and {len(group) - 5} more" if len(group) > 5 else "")
    if image is None:
        scan.problems.append(f"{name}: sample {safe_name(key)} has no image member (expected {safe_name(key)}."
                             f"{' or .'.join(image_keys)}; found {found})")
        return None
    if label_member is None:
        scan.problems.append(f"{name}: sample {safe_name(key)} has no label member {safe_name(key)}.{label_key} "
                             f"(found {found})")
        return None
    return image, label_member


def scan_shard(path: str, image_keys: tuple[str, ...], label_key: str, use_index: bool = True) -> ShardScan:
    """One shard's samples in tar order, with every problem listed.

    Members come from the shard's DALI index when one is there and agrees with the shard (see
    :func:`_members_from_index`; faster than reading every header), else from the tar headers
    (stdlib ``tarfile``). Label payloads are read either way. Problems (each naming the shard and
    member key): a sample without an image or a label member, a member repeated within a sample, a
    label that is not a non-negative integer, a damaged or truncated header, an index that
    disagrees with the shard, a shard cut short (inside a member or without tar's end-of-archive
    blocks: later samples would be lost without a trace). An image member whose bytes are a broken
    image is not a listing problem: its read fails under ``on_error``.
    """
    scan = ShardScan()
    name = os.path.basename(path)
    try:
        size_on_disk = os.path.getsize(path)
        handle = open(path, "rb")
    except OSError as exc:
        scan.problems.append(f"{path}: cannot read shard: {exc.strerror or exc}")
        return scan
    with handle:
        members = _members_from_index(path, size_on_disk, handle, scan) if use_index else None
        if members is None:
            members = _members_from_tar(handle, name, scan)
        else:
            scan.from_index = True

        def read_labels(labels: list[Member]) -> list[bytes]:
            return [os.pread(handle.fileno(), size, offset) if size else b"" for _, offset, size in labels]

        scan_members(name, members, image_keys, label_key, scan, read_labels)
    return scan


def scan_members(name: str, members: list[Member], image_keys: tuple[str, ...], label_key: str, scan: ShardScan,
                 read_labels: Callable[[list[Member]], Sequence[bytes | None]] | None = None,
                 known_labels: Sequence[int] | None = None) -> None:
    """Group a shard's members into samples and add them to ``scan`` (see :func:`scan_shard`).

    ``read_labels`` gets every label member small enough to be a label at once and returns their
    payloads in order (a positioned read each from a local shard; concurrent ranged GETs from
    object storage), None for one that could not be read. ``known_labels`` instead gives the
    samples' labels in tar order (from the converter's manifest): nothing is read.
    """
    seen: set[str] = set()
    pairs: list[tuple[str, Member, Member]] = []
    for key, group in _samples(members, scan):
        if key in seen:
            scan.problems.append(f"{name}: sample key {safe_name(key)} appears again after other samples "
                                 f"(members of one sample must be adjacent)")
            continue
        seen.add(key)
        pair = _sample_members(name, key, group, image_keys, label_key, scan)
        if pair is not None:
            pairs.append((key, *pair))
    if known_labels is not None:
        if len(known_labels) != len(pairs):
            if not scan.problems:
                scan.problems.append(f"{name}: the manifest records {len(known_labels)} labels, the index "
                                     f"{len(pairs)} samples (a stale manifest or index): convert again")
            return
        labels: Sequence[int | None] = known_labels
    else:
        assert read_labels is not None, "scan_members needs read_labels or known_labels"
        readable = [label for _, _, label in pairs if label[2] <= MAX_LABEL_BYTES]
        payloads = dict(zip((m[1] for m in readable), read_labels(readable)))
        labels = [_label(payloads.get(m[1]), name, m, scan) for _, _, m in pairs]
    for (key, image, _), label in zip(pairs, labels):
        if label is None:
            continue
        scan.keys.append(key)
        scan.image_names.append(image[0])
        scan.offsets.append(image[1])
        scan.sizes.append(image[2])
        scan.labels.append(label)


class ShardSamples:
    """Where each sample's image bytes are: ``shards[shard[i]]`` at ``offset[i]``, ``size[i]`` bytes.

    :meth:`read` is a positioned read through a small per-process cache of open shards
    (:data:`MAX_OPEN_SHARDS`); pickling (to spawned workers) drops the cache.
    """

    def __init__(self, shards: tuple[str, ...], shard: np.ndarray, offset: np.ndarray, size: np.ndarray):
        self.shards = shards
        self.shard = np.asarray(shard, dtype=np.int32)
        self.offset = np.asarray(offset, dtype=np.int64)
        self.size = np.asarray(size, dtype=np.int64)
        self._open: OrderedDict[int, int] = OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def __len__(self) -> int:
        return len(self.offset)

    def __getstate__(self) -> dict[str, Any]:
        return {"shards": self.shards, "shard": self.shard, "offset": self.offset, "size": self.size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["shards"], state["shard"], state["offset"], state["size"])

    def _after_fork(self) -> None:
        # A forked child: close its copies of the parent's descriptors and take a fresh lock (the
        # inherited one may have been held by a parent thread that does not exist here).
        for inherited in self._open.values():
            os.close(inherited)
        self._open, self._lock, self._pid = OrderedDict(), threading.Lock(), os.getpid()

    def _descriptor(self, shard: int) -> int:
        fd = self._open.get(shard)
        if fd is not None:
            self._open.move_to_end(shard)
            return fd
        fd = os.open(self.shards[shard], os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._open[shard] = fd
        if len(self._open) > MAX_OPEN_SHARDS:
            os.close(self._open.popitem(last=False)[1])
        return fd

    def read(self, index: int) -> bytes:
        """The encoded image of sample ``index``; :class:`ImageError` when the shard is unreadable or cut short."""
        shard, offset, size = int(self.shard[index]), int(self.offset[index]), int(self.size[index])
        if size == 0:
            raise ImageError("empty image member (0 bytes)")
        if self._pid != os.getpid():
            self._after_fork()
        try:
            with self._lock:  # an evicted descriptor must not be closed under another thread's read
                data = os.pread(self._descriptor(shard), size, offset)
        except OSError as exc:
            raise ImageError(f"cannot read shard {self.shards[shard]}: {exc.strerror or exc}") from None
        if len(data) != size:
            raise ImageError(f"truncated image member: {size} bytes expected at byte {offset}, "
                             f"{len(data)} found (the shard file is cut short)")
        return data

    def close(self) -> None:
        """Close the shards this process holds open (reads reopen them)."""
        if self._pid != os.getpid():
            self._after_fork()
            return
        with self._lock:
            for fd in self._open.values():
                os.close(fd)
            self._open.clear()

    def __del__(self) -> None:
        try:
            if self._pid == os.getpid():
                self.close()
        except Exception:
            pass
