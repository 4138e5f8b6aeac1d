"""Imports run one way: the executors sit side by side above what they share, and neither borrows
from the other (what must be identical on every backend lives below both)."""
from __future__ import annotations

import ast
from pathlib import Path

BACKENDS = Path(__file__).resolve().parent.parent / "dali_bridge" / "backends"
EXECUTORS = ("dali", "torchvision")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            names.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_backend_executor_imports_another():
    for name in EXECUTORS:
        others = {f".{other}" for other in EXECUTORS if other != name} | \
                 {f"dali_bridge.backends.{other}" for other in EXECUTORS if other != name}
        assert not imported_modules(BACKENDS / f"{name}.py") & others, name
