"""Imports run one way: the executors sit side by side above what they share, and neither borrows
from the other (what must be identical on every backend lives below both); the value checks and
text helpers sit at the bottom, below the op layer; the spec layer is small modules."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGE = REPO / "dali_bridge"
BACKENDS = PACKAGE / "backends"
EXECUTORS = ("dali", "torchvision")
# The modules of each executor's wing (the DALI executor's feeder and graph builder sit beside it).
WINGS = {"dali": ("dali", "dali_feed"), "torchvision": ("torchvision",)}
# Modules at the bottom: they import nothing of the project but one another.
LEAVES = ("checks", "text", "quoting", "wording")


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
        others = {f".{module}" for other in EXECUTORS if other != name for module in WINGS[other]} | \
                 {f"dali_bridge.backends.{module}" for other in EXECUTORS if other != name for module in WINGS[other]}
        for module in WINGS[name]:
            assert not imported_modules(BACKENDS / f"{module}.py") & others, module


def test_leaf_modules_import_nothing_of_the_project_but_one_another():
    for name in LEAVES:
        project = {m for m in imported_modules(PACKAGE / f"{name}.py") if m.startswith((".", "dali_bridge"))}
        assert project <= {f".{leaf}" for leaf in LEAVES}, name


def test_sources_and_the_converter_take_value_checks_and_utf8_from_the_leaves_not_the_op_layer():
    for name in ("sources", "listing", "shard_listing", "convert", "convert_staging", "remote_tools"):
        imported = imported_modules(PACKAGE / f"{name}.py")
        assert not {m for m in imported if m == ".ops" or m.startswith((".ops.", "dali_bridge.ops"))}, name


def test_no_spec_module_is_over_500_lines_nor_a_function_over_60():
    for path in sorted((PACKAGE / "spec").glob("*.py")):
        text = path.read_text()
        assert len(text.splitlines()) <= 500, path.name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno + 1 <= 60, f"{path.name}: {node.name}"


def test_every_relative_import_names_a_module_that_exists():
    # Imports inside functions run only when called: one that moved with its module must still resolve.
    for path in sorted(PACKAGE.rglob("*.py")):
        package = path.relative_to(REPO).with_suffix("").parts[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level and node.module:
                target = REPO.joinpath(*package[: len(package) - node.level + 1], *node.module.split("."))
                assert target.with_suffix(".py").is_file() or (target / "__init__.py").is_file(), \
                    f"{path.relative_to(REPO)}:{node.lineno}: from {'.' * node.level}{node.module}"


def imported_names(path: Path, module: str) -> set[str]:
    """The names ``path`` imports from ``module`` (as spelled in its ``from ... import``)."""
    return {alias.name for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and ("." * node.level + (node.module or "")) == module
            for alias in node.names}


def test_the_per_sample_loop_lives_in_the_core_alone():
    # Draws and a sample's steps are computed in one place (backends/per_sample.py), under one error policy.
    for name in EXECUTORS:
        for module in WINGS[name]:
            assert not imported_names(BACKENDS / f"{module}.py", "..sampling") & {"draws", "sample_steps"}, module
        assert any(".per_sample" in imported_modules(BACKENDS / f"{module}.py") for module in WINGS[name]), name


def test_what_the_executors_share_imports_neither_executor():
    wings = [module for name in EXECUTORS for module in WINGS[name]]
    executors = {f".{name}" for name in wings} | {f"dali_bridge.backends.{name}" for name in wings}
    for shared in ("base", "finishing", "per_sample", "thread_pool"):
        assert not imported_modules(BACKENDS / f"{shared}.py") & executors, shared


# A ratchet a little above the house rule (modules of ~500 lines, functions of ~60): the package as a
# whole stays readable in pieces. Tables (rows of data, not steps) are named here and may be longer.
MAX_MODULE_LINES = 560
MAX_FUNCTION_LINES = 80
TABLE_FUNCTIONS = {("reference.py", "_key_rows")}


def test_no_module_is_over_560_lines_nor_a_function_over_80_but_the_named_tables():
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        text = path.read_text()
        assert len(text.splitlines()) <= MAX_MODULE_LINES, f"{name}: split it along its seams"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and (name, node.name) not in TABLE_FUNCTIONS:
                assert node.end_lineno - node.lineno + 1 <= MAX_FUNCTION_LINES, f"{name}: {node.name}"
