"""Overrides: dotted key paths (``source.root``, ``ops.1.resize.size``,
``views.global.ops.0.random_resized_crop.scale``, ``views.global.per_view.1.solarize.probability``) set
on raw pipeline data, from ``--set KEY=VALUE`` flags or a mapping, before it is validated; each problem
names the override.

Applying them changes nothing it walks: every container on an overridden path is a new one, the rest
of the data is shared with what was given.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from ..util.checks import type_name
from .op_keys import op_entry
from .problems import Problem, SpecError, format_path
from .reading import read_yaml


def parse_override(text: str) -> tuple[str, Any]:
    """``"batch_size=32"`` → ``("batch_size", 32)``; the value is read as YAML (safe_load)."""
    if "=" not in text:
        raise SpecError([Problem(f"--set {text}", text, "expected KEY=VALUE, e.g. batch_size=32")], "overrides")
    key, _, raw = text.partition("=")
    try:
        value = read_yaml(raw, f"--set {text}")[0] if raw.strip() else None
    except SpecError as exc:
        message = exc.problems[0].message.removeprefix("not valid YAML: ")
        raise SpecError([Problem(f"--set {text}", key.strip(), f"value is not valid YAML: {message}")],
                        "overrides") from None
    return key.strip(), value


class SetFlags(dict):
    """Overrides written as ``KEY=VALUE`` text (``--set`` flags, or a list of such strings): their problems
    name the flag (``--set batch_size=0``); a plain mapping's name the entry (``overrides["batch_size"]=0``)."""


def parse_overrides(texts: Iterable[str]) -> SetFlags:
    """``["batch_size=32", ...]`` → ``SetFlags({"batch_size": 32, ...})`` (see :func:`parse_override`)."""
    return SetFlags(parse_override(text) for text in texts)


def apply_overrides(data: dict, overrides: Mapping[str, Any]) -> tuple[dict, dict[tuple, str], list[Problem]]:
    """Apply dotted-path overrides (``source.root``, ``ops.1.resize.size``) to raw pipeline data.

    A mapping value replaces the mapping at that path whole. Returns the new data, where each
    overridden path came from, and problems for paths that cannot be addressed (such an override
    leaves the data as it was). ``data`` itself is not changed.
    """
    origin: dict[tuple, str] = {}
    problems: list[Problem] = []
    for dotted, value in overrides.items():
        label = f"--set {dotted}={value!r}" if isinstance(overrides, SetFlags) else f'overrides["{dotted}"]={value!r}'
        parts: list[Any] = [int(p) if p.lstrip("-").isdigit() else p for p in str(dotted).split(".") if p != ""]
        if not parts:
            problems.append(Problem(label, str(dotted), "empty key path"))
            continue
        try:
            data, path = _with_value(data, parts, value)
        except _Unaddressable as exc:
            problems.append(Problem(label, format_path(exc.path), f"cannot address '{exc.path[-1]}' inside "
                                                                  f"{type_name(exc.node)}"))
            continue
        origin[path] = label
    return data, origin, problems


class _Unaddressable(Exception):
    """A part of an override's path names nothing in the container it reaches (a key of a list, an
    index out of range)."""

    def __init__(self, path: tuple, node: Any):
        super().__init__(path)
        self.path, self.node = path, node


def _op_list(path: tuple) -> bool:
    """Whether ``path`` is a list of ops: the shared ``ops``, or a views group's (``views.NAME.ops``)."""
    return path == ("ops",) or (len(path) == 3 and path[0] == "views" and path[2] == "ops")


def _with_value(data: dict, parts: Sequence[Any], value: Any) -> tuple[dict, tuple]:
    """A copy of ``data`` with ``value`` at ``parts``, and the path as addressed (a negative index made
    positive). A missing or scalar mapping value on the way becomes a new mapping; an op written as a
    shorthand becomes ``{name: {params}}`` when the path reaches into it, so one parameter can be set.
    :class:`_Unaddressable` when a part cannot be addressed."""
    chain: list[tuple[Any, Any]] = []  # (container as reached, key or index in it), top down
    path: tuple = ()
    node: Any = data
    for i, part in enumerate(parts):
        inner = i < len(parts) - 1
        if isinstance(node, dict):
            key, child = part, node.get(part)
            if inner and not isinstance(child, (dict, list)):
                child = {}
        elif isinstance(node, list) and isinstance(part, int) and -len(node) <= part < len(node):
            key = part % len(node)
            child = node[key]
            if inner and _op_list(path):  # reaching into an op: its shorthand must not be lost
                parsed = op_entry(child)
                child = {parsed[0]: parsed[1]} if parsed is not None and isinstance(parsed[1], dict) else child
        else:
            raise _Unaddressable(path + (part,), node)
        chain.append((node, key))
        path += (key,)
        node = child
    new = value
    for container, key in reversed(chain):
        new = {**container, key: new} if isinstance(container, dict) else [*container[:key], new, *container[key + 1:]]
    return new, path
