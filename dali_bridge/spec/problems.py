"""Problems and their collector: every problem of a pipeline file is gathered in one pass, each at
``file:line:column`` (or the override that set it) with its key path, and raised together as one
:class:`SpecError`; the two key readers every section uses (an integer, a choice) report through it,
reading the key's range, choices and default from its schema entry (:mod:`~dali_bridge.spec.keys`).
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from ..util.checks import choice_checker, is_int, shown, type_name
from ..ops.base import REQUIRED  # the marker of a value with no default, for keys as for op parameters
from ..util.quoting import quoted, shortened
from ..util.urls import Scrubbed, redact
from ..util.wording import problem_list
from .keys import Key


def format_path(path: Sequence[Any]) -> str:
    """``("ops", 1, "resize", "size")`` → ``ops[1].resize.size``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = str(part)
            out += ("." if out else "") + (text if len(text) <= 80 else quoted(text))
    return out or "<top level>"


MISSING_SOURCE = "missing source"  # Problem.kind of a source path that does not exist (load_spec check_sources)


@dataclass(frozen=True)
class Problem:
    """One validation problem: where (``file:line:col`` or the override), the key path, the message;
    ``kind`` tells apart the problems a caller may treat otherwise (:data:`MISSING_SOURCE`)."""
    where: str
    path: str
    message: str
    kind: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        # A value quoted in a problem (a URL with user:password@, a signed query) is shown scrubbed.
        for name in ("where", "path", "message"):
            object.__setattr__(self, name, redact(getattr(self, name)))

    def __str__(self) -> str:
        return f"{self.where}: {self.path}: {self.message}"


class SpecError(Scrubbed, ValueError):
    """A pipeline file (or its overrides) is invalid; ``problems`` lists every problem found."""

    def __init__(self, problems: Sequence[Problem], source: str = "pipeline"):
        self.problems = list(problems)
        self.source = source
        super().__init__(problem_list(source, self.problems))


class ProblemCollector:
    """Collects problems; knows where each key path came from."""

    def __init__(self, filename: str, marks: dict[tuple, str], override_origin: dict[tuple, str]):
        self.filename = filename
        self.marks = marks
        self.override_origin = override_origin
        self.problems: list[Problem] = []

    def where(self, path: tuple) -> str:
        # An override of a prefix replaced what the file had there, so it wins over the file's marks.
        for n in range(len(path), -1, -1):
            if path[:n] in self.override_origin:
                return self.override_origin[path[:n]]
        for n in range(len(path), -1, -1):
            if path[:n] in self.marks:
                return self.marks[path[:n]]
        return self.filename

    def add(self, path: tuple, message: str, kind: str = "") -> None:
        self.problems.append(Problem(self.where(path), format_path(path), shortened(message), kind))

    def unknown_keys(self, mapping: Mapping, allowed: Iterable[str], path: tuple, what: str,
                     hints: Mapping[str, str] | None = None) -> None:
        """Report each key of ``mapping`` not in ``allowed``; ``hints``: what to write instead of a key."""
        allowed = list(allowed)
        for key in mapping:
            if key not in allowed:
                hint = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
                suggestion = f"; did you mean '{hint[0]}'?" if hint else ""
                if hints and key in hints:
                    suggestion = f"; {hints[key]}"
                self.add(path + (key,), f"unknown key {quoted(str(key))} in {what} (expected one of: "
                                        f"{', '.join(allowed)}){suggestion}")

    def mapping(self, data: Any, path: tuple, what: str) -> dict | None:
        if data is None:
            return {}
        if not isinstance(data, dict):
            self.add(path, f"expected {what} as a mapping, found {type_name(data)} {quoted(data)}")
            return None
        return data


def check_choice(chk: ProblemCollector, mapping: dict, key: Key) -> Any:
    """A key whose value is one of the schema's ``key.choices``; its default when the mapping lacks it."""
    if key.leaf not in mapping:
        return key.default
    value, message = choice_checker(key.choices)(mapping[key.leaf])
    if message:
        chk.add(key.path + (key.leaf,), message)
    return value


def check_int(chk: ProblemCollector, mapping: dict, key: Key, allow_none: bool = False) -> Any:
    """An integer key >= the schema's ``key.minimum``, at most ``key.maximum`` (the largest allowed,
    why) for a bounded count; its default when the mapping lacks it."""
    path, name, minimum, maximum = key.path, key.leaf, key.minimum, key.maximum
    if name not in mapping:
        if key.default is REQUIRED:
            chk.add(path or (name,), f"missing required key '{format_path(path + (name,))}' "
                                     f"(expected an integer >= {minimum})")
            return None
        return key.default
    value = mapping[name]
    if value is None and allow_none:
        return None
    if not is_int(value):
        chk.add(path + (name,), f"expected an integer >= {minimum}{' or null' if allow_none else ''}, "
                                f"found {type_name(value)} {quoted(value)}")
    elif value < minimum:
        chk.add(path + (name,), f"expected an integer >= {minimum}, found {shown(value)}")
    elif maximum is not None and value > maximum.value:
        chk.add(path + (name,), f"expected an integer >= {minimum}, at most {maximum.value} ({maximum.why}), "
                                f"found {shown(value)}")
    return value
