"""A listing's sample names, packed: :class:`PathTable`, a read-only sequence of strings held in four
numpy arrays, and :class:`PathTableBuilder`, which the listers fill folder by folder.

Why not a tuple of strings: a million Python strings cost about 100 bytes each, and a DataLoader
worker forked from the process that holds them copies every page it looks a string up on (the
lookup writes the string's reference count), so over an epoch each worker holds its own copy of
the whole index. Here each name is its folder (stored once per folder) and the rest of it, both
UTF-8 in one buffer each; looking a name up reads the arrays and writes nothing in them, so forked
workers keep sharing their pages. A name is decoded when it is asked for (a read, a message),
which costs far less than reading the sample.

Names are encoded with ``surrogatepass``, which gives back every string exactly, including the
lone surrogates a file name that is not UTF-8 decodes to.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence, overload

import numpy as np

_ENCODING, _ERRORS = "utf-8", "surrogatepass"


def _ends(lengths: np.ndarray) -> np.ndarray:
    """Cumulative ends of consecutive byte strings, in the narrowest type that holds the last one."""
    ends = np.cumsum(lengths, dtype=np.int64)
    total = int(ends[-1]) if len(ends) else 0
    return ends.astype(np.uint32) if total < 2**32 else ends


def _has_surrogate(data: np.ndarray) -> bool:
    """Whether UTF-8 written with ``surrogatepass`` holds a surrogate (ED A0..BF ..)."""
    return bool(np.any((data[:-1] == 0xED) & (data[1:] >= 0xA0)))


class _Packed:
    """Byte strings back to back in one ``bytes`` buffer, the ``i``-th ending at ``ends[i]``.

    ``bytes`` rather than an array: slicing it is the cheapest way to a name's bytes, and its
    reference count sits in its first page alone, so forked workers share the rest."""

    __slots__ = ("data", "ends", "_ends")

    def __init__(self, data: bytes, ends: np.ndarray):
        self.data, self.ends = data, ends
        ends.flags.writeable = False   # shared by forked workers: never written
        self._ends = memoryview(ends)  # indexing gives Python ints, faster than numpy scalars

    @classmethod
    def of(cls, chunks: Sequence[bytes], lengths: Sequence[np.ndarray]) -> "_Packed":
        return cls(b"".join(chunks), _ends(np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)))

    def __len__(self) -> int:
        return len(self.ends)

    def bytes_of(self, index: int) -> bytes:
        ends = self._ends
        return self.data[ends[index - 1] if index else 0:ends[index]]

    @property
    def array(self) -> np.ndarray:
        """The buffer as uint8 (a view, no copy)."""
        return np.frombuffer(self.data, dtype=np.uint8)


class PathTable(Sequence[str]):
    """Sample names as a read-only sequence of strings: ``table[i]`` is folder ``folder_of[i]``
    followed by the ``i``-th rest of a name. Equal to another table, tuple or list of the same
    strings; pickles as its arrays."""

    __slots__ = ("_folders", "_folder_of", "_names", "_folder_view")

    def __init__(self, folders: _Packed, folder_of: np.ndarray, names: _Packed):
        if len(folder_of) != len(names):
            raise ValueError(f"a path table needs a folder per name: {len(folder_of)} folders, {len(names)} names")
        self._folders, self._folder_of, self._names = folders, folder_of, names
        folder_of.flags.writeable = False   # shared by forked workers: never written
        self._folder_view = memoryview(folder_of)

    @classmethod
    def of(cls, paths: Iterable[str]) -> "PathTable":
        """The table of ``paths`` (any iterable of strings; a table is returned as it is)."""
        if isinstance(paths, PathTable):
            return paths
        builder = PathTableBuilder()
        builder.add_paths(paths)
        return builder.build()

    def __len__(self) -> int:
        return len(self._names)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        index = int(index)
        count = len(self._names)
        if index < 0:
            index += count
        if not 0 <= index < count:
            raise IndexError(f"sample {index} is outside the {count} listed")
        folder = self._folders.bytes_of(self._folder_view[index])
        return (folder + self._names.bytes_of(index)).decode(_ENCODING, _ERRORS)

    def __iter__(self) -> Iterator[str]:
        data, ends, folder_of = self._names.data, self._names._ends, self._folder_view
        folders = [self._folders.bytes_of(number) for number in range(len(self._folders))]
        start = 0
        for index in range(len(ends)):
            end = ends[index]
            yield (folders[folder_of[index]] + data[start:end]).decode(_ENCODING, _ERRORS)
            start = end

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PathTable):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        if isinstance(other, (tuple, list)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to tuples, which hash otherwise

    def __repr__(self) -> str:
        shown = ", ".join(repr(self[i]) for i in range(min(len(self), 2)))
        return f"PathTable({len(self)} names: {shown}{', …' if len(self) > 2 else ''})"

    @property
    def nbytes(self) -> int:
        """The bytes of its arrays."""
        return (len(self._folders.data) + self._folders.ends.nbytes + self._folder_of.nbytes
                + len(self._names.data) + self._names.ends.nbytes)

    def feed(self, digest: Any, *, strip: str = "", chunk: int = 1 << 14) -> None:
        """Update ``digest`` (a hashlib object) with what updating it with every name in turn would
        give: the name with ``strip`` removed where it begins with it (``strip`` ends with ``/``),
        as UTF-8 (lone surrogates as ``surrogateescape`` writes them), then a NUL byte. Done on the
        arrays, ``chunk`` names at a time, where the names hold no surrogate and no ``/`` after
        their folder (what the listers store); name by name otherwise."""
        prefix = strip.encode(_ENCODING, _ERRORS)
        names, folders = self._names.array, self._folders.array
        if (strip and not strip.endswith("/")) or _has_surrogate(names) or _has_surrogate(folders) \
                or bool(np.any(names == ord("/"))):
            for name in self:
                digest.update((name[len(strip):] if strip and name.startswith(strip) else name)
                              .encode(_ENCODING, "surrogateescape") + b"\0")
            return
        # A name begins with ``strip`` exactly when its folder does: ``strip`` ends at a "/", and
        # the rest of the name holds none.
        folder_ends = self._folders.ends.astype(np.int64)
        folder_starts = folder_ends - np.diff(folder_ends, prepend=0)
        skip = np.array([len(prefix) if prefix and folders[start:end].tobytes().startswith(prefix) else 0
                         for start, end in zip(folder_starts.tolist(), folder_ends.tolist())], dtype=np.int64)
        name_ends = self._names.ends.astype(np.int64)
        for first in range(0, len(self), chunk):
            last = min(first + chunk, len(self))
            folder = self._folder_of[first:last].astype(np.int64)
            starts = [folder_starts[folder] + skip[folder], name_ends[first - 1] if first else 0]
            starts[1] = np.concatenate(([starts[1]], name_ends[first:last - 1]))
            lengths = [folder_ends[folder] - starts[0], name_ends[first:last] - starts[1]]
            out_starts = np.cumsum(lengths[0] + lengths[1] + 1) - (lengths[0] + lengths[1] + 1)
            out = np.zeros(int(out_starts[-1] + lengths[0][-1] + lengths[1][-1] + 1), dtype=np.uint8)
            for source, start, length, at in ((folders, starts[0], lengths[0], out_starts),
                                              (names, starts[1], lengths[1], out_starts + lengths[0])):
                within = np.arange(int(length.sum())) - np.repeat(np.cumsum(length) - length, length)
                out[np.repeat(at, length) + within] = source[np.repeat(start, length) + within]
            digest.update(out.tobytes())   # each name's NUL: the zeros left between them

    def __getstate__(self) -> dict[str, Any]:
        return {"folders": self._folders.data, "folder_ends": self._folders.ends, "folder_of": self._folder_of,
                "names": self._names.data, "name_ends": self._names.ends}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(_Packed(state["folders"], state["folder_ends"]), state["folder_of"],
                      _Packed(state["names"], state["name_ends"]))


class PathTableBuilder:
    """Collects names in order, a folder's at a time, into a :class:`PathTable`."""

    def __init__(self) -> None:
        self._folder_chunks: list[bytes] = []
        self._folder_ids: dict[str, int] = {}
        self._name_chunks: list[bytes] = []
        self._name_lengths: list[np.ndarray] = []
        self._folder_of: list[np.ndarray] = []

    def _folder(self, folder: str) -> int:
        number = self._folder_ids.get(folder)
        if number is None:
            number = self._folder_ids[folder] = len(self._folder_ids)
            self._folder_chunks.append(folder.encode(_ENCODING, _ERRORS))
        return number

    def add_in_folder(self, folder: str, names: Sequence[str]) -> None:
        """Names whose paths are ``folder + name`` (``folder`` ends with its separator)."""
        if not names:
            return
        joined = "\0".join(names)
        self._folder_of.append(np.full(len(names), self._folder(folder), dtype=np.uint32))
        data = np.frombuffer(joined.encode(_ENCODING, _ERRORS), dtype=np.uint8)
        separators = np.flatnonzero(data == 0)
        if len(separators) == len(names) - 1:   # no name holds a NUL (no file name can): split at them
            self._name_chunks.append(data[data != 0].tobytes())
            bounds = np.concatenate(([-1], separators, [len(data)]))
            self._name_lengths.append(np.diff(bounds) - 1)
            return
        encoded = [name.encode(_ENCODING, _ERRORS) for name in names]
        self._name_chunks.append(b"".join(encoded))
        self._name_lengths.append(np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)))

    def add_paths(self, paths: Iterable[str], prefix: str = "") -> None:
        """Paths ``prefix + path``, each stored as its folder (``prefix`` and ``path`` up to its last
        ``/``) and the rest."""
        folder, names = None, []
        for path in paths:
            head, slash, tail = path.rpartition("/")
            if head + slash != folder:
                if folder is not None:
                    self.add_in_folder(prefix + folder, names)
                folder, names = head + slash, []
            names.append(tail)
        if folder is not None:
            self.add_in_folder(prefix + folder, names)

    def build(self) -> PathTable:
        folders = _Packed.of(self._folder_chunks, [np.fromiter(map(len, self._folder_chunks), dtype=np.int64,
                                                               count=len(self._folder_chunks))])
        folder_of = (np.concatenate(self._folder_of) if self._folder_of else np.zeros(0, dtype=np.uint32))
        return PathTable(folders, folder_of, _Packed.of(self._name_chunks, self._name_lengths))
