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


def imported_names(path: Path, module: str) -> set[str]:
    """The names ``path`` imports from ``module`` (as spelled in its ``from ... import``)."""
    return {alias.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and ("." * node.level + (node.module or "")) == module
            for alias in node.names}


def test_the_per_sample_loop_lives_in_the_core_alone():
    # Draws and a sample's steps are computed in one place (backends/per_sample.py), under one error policy.
    for name in EXECUTORS:
        assert not imported_names(BACKENDS / f"{name}.py", "..sampling") & {"draws", "sample_steps"}, name
        assert ".per_sample" in imported_modules(BACKENDS / f"{name}.py"), name


def test_what_the_executors_share_imports_neither_executor():
    executors = {f".{name}" for name in EXECUTORS} | {f"dali_bridge.backends.{name}" for name in EXECUTORS}
    for shared in ("base", "finishing", "per_sample", "thread_pool"):
        assert not imported_modules(BACKENDS / f"{shared}.py") & executors, shared
