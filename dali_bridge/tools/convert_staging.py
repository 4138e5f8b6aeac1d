"""The safe writing of a conversion's output set: the output pattern's rules, the outputs already
there, final names taken by a link refused, the staging of temporary files (created exclusively,
renamed into place only once all are written), the temporaries a killed run left, and the pattern's
lock against a second convert."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import tempfile
from typing import BinaryIO, Iterator

from ..util.quoting import safe_name
from ..util.urls import Scrubbed
from ..data.shards.tar import index_path, manifest_path

DIRECTIVE = re.compile(r"%(0?)(\d*)d")


class ConvertError(Scrubbed, ValueError):
    """The conversion cannot start or finish: bad pattern, existing output, unreadable file."""


def check_pattern(out_pattern: str) -> None:
    """An output pattern holds exactly one integer directive (``%d``, ``%06d``) and ends in ``.tar``."""
    directives = DIRECTIVE.findall(out_pattern.replace("%%", ""))
    if len(directives) != 1 or "%" in DIRECTIVE.sub("", out_pattern.replace("%%", "")):
        raise ConvertError(f"output pattern {out_pattern!r}: expected exactly one shard-number directive "
                           f"such as %06d (e.g. shards/train-%06d.tar)")
    if any(width and not zero for zero, width in directives):
        raise ConvertError(f"output pattern {out_pattern!r}: pad the shard number with zeros (%06d), "
                           f"not spaces (%6d)")
    if not out_pattern.endswith(".tar"):
        raise ConvertError(f"output pattern {out_pattern!r}: expected a name ending in .tar")


def existing_outputs(out_pattern: str, count: int) -> list[str]:
    found = []
    number = 0
    while number < count or os.path.lexists(out_pattern % number):  # earlier, larger conversions too
        for path in (out_pattern % number, index_path(out_pattern % number)):
            if os.path.lexists(path):
                found.append(path)
        number += 1
    manifest = manifest_path(out_pattern)
    if os.path.lexists(manifest):
        found.append(manifest)
    return found


def refuse_links(paths: list[str]) -> None:
    """A final name that is a symbolic link (or anything but a regular file) is never written
    through nor replaced: :class:`ConvertError` naming them."""
    odd = [path for path in paths if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode)]
    if odd:
        shown = ", ".join(safe_name(path) for path in odd[:5]) + (f" and {len(odd) - 5} more" if len(odd) > 5 else "")
        raise ConvertError(f"output name(s) taken by a link or other non-file: {shown}; convert writes only "
                           f"regular files and never through or over a link: remove them and convert again")


def _umask() -> int:
    """The process's umask: from ``/proc`` where it says (setting and restoring it, the only other
    way, briefly changes it for every thread)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class Staging:
    """The temporary files of one conversion, in the output folder: each created exclusively
    (``mkstemp``: ``O_CREAT|O_EXCL|O_NOFOLLOW``, an unpredictable name), renamed to its final name
    by :meth:`commit` only, in the order created; :meth:`discard` removes what was not renamed."""

    def __init__(self, out_pattern: str):
        self.folder = os.path.dirname(os.path.abspath(out_pattern))
        self.pending: list[tuple[str, str]] = []   # (temporary, final)
        self.renamed = 0
        self.mode = 0o666 & ~_umask()   # what a plain open() would give; mkstemp makes 0600

    def create(self, final: str) -> BinaryIO:
        """A new temporary file that :meth:`commit` renames to ``final``, open for writing."""
        descriptor, temporary = tempfile.mkstemp(dir=self.folder, prefix=f".{os.path.basename(final)}.",
                                                 suffix=".partial")
        self.pending.append((temporary, final))
        os.fchmod(descriptor, self.mode)
        return os.fdopen(descriptor, "wb")

    def commit(self) -> None:
        refuse_links([final for _, final in self.pending])
        while self.pending:
            temporary, final = self.pending[0]
            os.replace(temporary, final)
            self.pending.pop(0)
            self.renamed += 1

    def state(self) -> str:
        """What a failure leaves, in words: nothing replaced, a mixed set, or the new set in place."""
        if not self.renamed:
            return "the temporary files were removed and no shard, index or manifest was replaced"
        if self.pending:
            return (f"only {self.renamed} of {self.renamed + len(self.pending)} files were renamed into place, so "
                    f"the set may be mixed: convert again ('dali-bridge verify' names each shard that differs)")
        return "the new shards, indexes and manifest are in place; some old shards past them may remain"

    def discard(self) -> None:
        for temporary, _ in self.pending:
            with contextlib.suppress(FileNotFoundError):
                os.remove(temporary)
        self.pending.clear()


def leftover_temporaries(out_pattern: str) -> list[str]:
    """Temporary files a killed conversion into ``out_pattern`` left (its shards', indexes' and
    manifest's), to remove while this conversion holds the pattern's lock."""
    folder, name = os.path.split(os.path.abspath(out_pattern))
    shard = DIRECTIVE.sub("[0-9]+", re.escape(name.replace("%%", "\0"))).replace("\0", "%")
    finals = "|".join((shard, shard[:-len(re.escape(".tar"))] + re.escape(".idx"),
                       re.escape(os.path.basename(manifest_path(out_pattern)))))
    temporary = re.compile(rf"\.(?:{finals})\.[A-Za-z0-9_]{{8}}\.partial")
    with os.scandir(folder) as entries:
        return [entry.path for entry in entries if temporary.fullmatch(entry.name)]


@contextlib.contextmanager
def pattern_lock(out_pattern: str) -> Iterator[None]:
    """Hold ``out_pattern``'s lock (``.<manifest name>.lock`` beside the shards, ``flock``) for one
    conversion: a second convert into the pattern is refused while it is held. The kernel releases
    it when the process ends, killed or not; a clean end also removes the file."""
    target = manifest_path(out_pattern)
    lock = os.path.join(os.path.dirname(os.path.abspath(target)), f".{os.path.basename(target)}.lock")
    for _ in range(10):   # the file we locked may have been removed by the convert that held it
        try:
            descriptor = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            raise ConvertError(f"cannot open the lock file {safe_name(lock)}: {exc.strerror or exc}"
                               f"{' (a link: remove it)' if exc.errno == errno.ELOOP else ''}") from None
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            os.close(descriptor)
            raise ConvertError(f"the lock file {safe_name(lock)} is not a regular file: remove it")
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            raise ConvertError(f"another convert is writing {out_pattern} (it holds {safe_name(lock)}): wait for "
                               f"it to finish, or write to another pattern") from None
        try:
            same = os.path.samestat(os.fstat(descriptor), os.lstat(lock))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(descriptor)
    else:
        raise ConvertError(f"cannot take the lock {safe_name(lock)}: it keeps being replaced")
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(lock)
        os.close(descriptor)


def index_problem(index: str, digest: str | None, expected: str, manifest: str) -> str | None:
    """The problem an index whose sha256 is ``digest`` (None: missing) has against the ``expected``
    one its manifest records, or None; the same words for a folder and a URL."""
    if digest == expected:
        return None
    found = "missing" if digest is None else f"sha256 {digest} differs from the manifest's {safe_name(expected)}"
    return (f"{index}: {found}: not the index {manifest} records (damaged, or written by another conversion); "
            f"convert again to rewrite the shards, their indexes and the manifest together")
