"""Reading YAML within bounds: nesting depth and alias expansion are capped while composing, so
neither the validator's walks nor its messages can grow beyond a small multiple of the text; the
composed nodes also say where each key path starts (``file:line:column``) for the problems.

YAML is data: the safe loader constructs plain values, so nothing in a pipeline file can execute code.
"""
from __future__ import annotations

from typing import Any

import yaml

from .problems import Problem, SpecError

MAX_NESTING = 64            # mappings/lists inside each other; a pipeline file needs about 5
ALIAS_NODE_BUDGET = 10_000  # nodes reached through aliases (*name), counted with repeats


class _LimitError(yaml.MarkedYAMLError):
    """A bound of :class:`_BoundedLoader` was passed (reported like a YAML syntax error)."""


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses deep nesting and alias expansion beyond the budgets.

    Every alias adds the number of nodes it stands for (its anchor's nodes, aliases inside
    expanded) to a running count: a "billion laughs" file is refused at its first costly alias
    instead of being walked path by path. An alias inside its own anchor (a recursive value) is
    refused too: no walk of it ends.
    """

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0
        self._alias_nodes = 0
        self._sizes: dict[int, int] = {}
        self._open_anchors: set[str] = set()

    def _size(self, node: yaml.Node) -> int:
        size = self._sizes.get(id(node))
        if size is None:
            children: list = []
            if isinstance(node, yaml.SequenceNode):
                children = node.value
            elif isinstance(node, yaml.MappingNode):
                children = [child for pair in node.value for child in pair]
            size = 1 + sum(self._size(child) for child in children)
            self._sizes[id(node)] = size
        return size

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open_anchors:
                raise _LimitError(None, None, f"alias *{event.anchor} refers to its own anchor: a recursive "
                                  f"value cannot be validated; write the value out", event.start_mark)
            node = self.anchors.get(event.anchor)
            if node is not None:
                self._alias_nodes += self._size(node)
                if self._alias_nodes > ALIAS_NODE_BUDGET:
                    raise _LimitError(None, None, f"aliases expand to more than {ALIAS_NODE_BUDGET} values "
                                      f"(the budget for *name references); write repeated values out or "
                                      f"alias smaller ones", event.start_mark)
            return super().compose_node(parent, index)
        self._depth += 1
        if self._depth > MAX_NESTING:
            raise _LimitError(None, None, f"nested more than {MAX_NESTING} levels deep (a pipeline file needs "
                              f"about 5)", event.start_mark)
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self._open_anchors.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1
            self._open_anchors.discard(anchor)


def read_yaml(text: str, filename: str) -> tuple[Any, dict[tuple, str]]:
    """The data of a YAML text and where each key path starts; :class:`SpecError` if unreadable."""
    loader = None
    try:
        loader = _BoundedLoader(text)
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
        problem = getattr(exc, "problem", None) or exc
        message = str(problem) if isinstance(exc, _LimitError) else f"not valid YAML: {problem}"
        raise SpecError([Problem(where, "<yaml>", message)], filename) from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, _node_positions(root, filename)


def positions(text: str, filename: str) -> dict[tuple, str]:
    """Where each key path of a YAML text starts; empty when the text cannot be read (within bounds)."""
    try:
        return read_yaml(text, filename)[1]
    except SpecError:
        return {}


def _node_positions(root: yaml.Node | None, filename: str) -> dict[tuple, str]:
    """Where each key path starts (``file:line:column``), from the composed (bounded) node tree."""
    marks: dict[tuple, str] = {}

    def where(node: yaml.Node) -> str:
        return f"{filename}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"

    def walk(node: yaml.Node, path: tuple) -> None:
        marks.setdefault(path, where(node))
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    child = path + (key_node.value,)
                    marks[child] = where(key_node)
                    walk(value_node, child)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, path + (i,))

    if root is not None:
        walk(root, ())
    return marks
