"""The package's architecture (docs/architecture.md) as the code has it: each folder imports only the
folders its row of the allowed-imports table names, and the table has no circle; no module reaches
itself through its imports (at any depth); no module imports another's private names, and no package
face re-exports; the executors sit side by side above what they share, and neither borrows from the
other (what must be identical on every backend lives below both); the plan is below every backend;
the value checks and text helpers sit at the bottom, below the op layer."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers.paths import REPO

PACKAGE = REPO / "dali_bridge"
BACKENDS = PACKAGE / "backends"
EXECUTORS = ("dali", "torchvision")
# The modules of each executor's wing (the DALI executor's feeder and graph builder sit beside it).
WINGS = {"dali": ("dali_bridge.backends.dali.executor", "dali_bridge.backends.dali.feed",
                  "dali_bridge.backends.dali.tail_runner", "dali_bridge.backends.dali.outputs"),
         "torchvision": ("dali_bridge.backends.torchvision",)}
# What the executors share: below both wings.
SHARED = ("dali_bridge.backends.base", "dali_bridge.backends.finishing", "dali_bridge.backends.per_sample",
          "dali_bridge.backends.thread_pool")
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


# The import graph -----------------------------------------------------------------------------
# Every import counts wherever it is written (module level, under TYPE_CHECKING, inside a function:
# one there runs as soon as it is called), and so do ``importlib.import_module`` / ``__import__`` of
# a literal name, or of an f-string over a loop through a module-level tuple of names (the op
# registry's built-in modules). Importing ``a.b.c`` runs the ``__init__`` of ``a`` and ``a.b`` too,
# except a package the importer lies in (it is already being imported). ``from pkg import name``
# leads to the submodule ``pkg.name`` where there is one, else to ``pkg``'s ``__init__`` — also from
# inside ``pkg``: a submodule importing a name its package's face re-exports makes a circle.

def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _absolute(importer: str, is_package: bool, level: int, name: str) -> str:
    if not level:
        return name
    base = importer.split(".")[: None if is_package else -1]
    base = base[: len(base) - level + 1]
    return ".".join(base + ([name] if name else []))


def _run_by(importer: str, module: str, names: tuple[str, ...], modules: dict[str, Path]) -> set[str]:
    """The ``modules`` that importing ``module`` (and ``names`` from it) runs, from ``importer``."""
    parts = module.split(".")
    run = {prefix for prefix in (".".join(parts[:n]) for n in range(1, len(parts) + 1))
           if prefix in modules and not (importer == prefix or importer.startswith(prefix + "."))}
    for name in names:
        run.add(f"{module}.{name}" if f"{module}.{name}" in modules else module)
    return {found for found in run if found in modules} - {importer}


def _string_tuples(tree: ast.Module) -> dict[str, tuple[str, ...]]:
    """Module-level ``NAME = ("a", "b", ...)`` assignments of string constants."""
    found = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, (ast.Tuple, ast.List))
                and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.value.elts)):
            found[node.targets[0].id] = tuple(e.value for e in node.value.elts)
    return found


def _dynamic_names(call: ast.Call, loops: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """The module names an ``import_module(...)`` / ``__import__(...)`` call can import, as far as the
    source says: a literal, or an f-string whose one placeholder is a loop variable over a name tuple."""
    if not call.args:
        return ()
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return (arg.value,)
    if isinstance(arg, ast.JoinedStr):
        fixed = [part.value for part in arg.values if isinstance(part, ast.Constant)]
        holes = [part.value for part in arg.values if isinstance(part, ast.FormattedValue)]
        if len(holes) == 1 and isinstance(holes[0], ast.Name) and holes[0].id in loops and len(fixed) <= 1:
            prefix = fixed[0] if fixed and isinstance(arg.values[0], ast.Constant) else ""
            return tuple(prefix + name for name in loops[holes[0].id])
    return ()


def import_edges(name: str, path: Path, modules: dict[str, Path] = MODULES) -> dict[str, int]:
    """Each of ``modules`` that module ``name`` (at ``path``) runs by importing, with the first line that does."""
    tree = ast.parse(path.read_text())
    is_package = path.name == "__init__.py"
    tuples = _string_tuples(tree)
    loops = {node.target.id: tuples[node.iter.id] for node in ast.walk(tree)
             if isinstance(node, ast.For) and isinstance(node.target, ast.Name)
             and isinstance(node.iter, ast.Name) and node.iter.id in tuples}
    edges: dict[str, int] = {}
    for node in ast.walk(tree):
        run: set[str] = set()
        if isinstance(node, ast.Import):
            for alias in node.names:
                run |= _run_by(name, alias.name, (), modules)
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(name, is_package, node.level, node.module or "")
            run = _run_by(name, module, tuple(alias.name for alias in node.names), modules)
        elif isinstance(node, ast.Call) and (getattr(node.func, "id", None) or getattr(node.func, "attr", None)) \
                in ("import_module", "__import__"):
            for target in _dynamic_names(node, loops):
                level = len(target) - len(target.lstrip("."))
                run |= _run_by(name, _absolute(name, is_package, level, target.lstrip(".")), (), modules)
        for module in run:
            edges[module] = min(edges.get(module, node.lineno), node.lineno)
    return edges


def import_graph() -> dict[str, dict[str, int]]:
    return {name: import_edges(name, path) for name, path in MODULES.items()}


def circles(graph: dict[str, dict[str, int]]) -> list[tuple[list[str], list[str]]]:
    """The import circles: each strongly connected set of more than one module (or a module importing
    itself), sorted, with one closed path through it (Tarjan's algorithm, then a walk inside the set)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph[module]:
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            members = set()
            while True:
                member = stack.pop()
                members.add(member)
                if member == module:
                    break
            if len(members) > 1 or module in graph[module]:
                found.append(members)

    for module in graph:
        if module not in index:
            visit(module)
    return [(sorted(members), _closed_path(graph, members)) for members in found]


def _closed_path(graph: dict[str, dict[str, int]], members: set[str]) -> list[str]:
    start = min(members)
    paths, seen = [[start]], {start}
    while paths:  # breadth first: the shortest way back to the start within the set
        path = paths.pop(0)
        for target in sorted(graph[path[-1]]):
            if target == start:
                return path + [start]
            if target in members and target not in seen:
                seen.add(target)
                paths.append(path + [target])
    raise AssertionError(f"no path back to {start} in {sorted(members)}")


def described(graph: dict[str, dict[str, int]], path: list[str]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(path, path[1:])) + f" -> {path[-1]}"


def reachable(graph: dict[str, dict[str, int]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen - {start}


def test_no_module_reaches_itself_through_its_imports_at_any_depth():
    graph = import_graph()
    found = circles(graph)
    heading = "import circles: the modules of each, and one way round (module (line of its import) -> ...)"
    assert not found, heading + "".join(f"\n  {', '.join(members)}:\n    {described(graph, path)}"
                                        for members, path in found)


def test_the_circle_finder_sees_imports_inside_functions_and_through_import_module(tmp_path):
    # The graph's own rules on two small modules: a function-level import and an import_module loop.
    (tmp_path / "a.py").write_text("def f():\n    from . import b\n")
    (tmp_path / "b.py").write_text("from importlib import import_module\nNAMES = ('a',)\n"
                                   "for name in NAMES:\n    import_module(f'.{name}', __package__)\n")
    (tmp_path / "c.py").write_text("import importlib\n\ndef g():\n    importlib.import_module('pkg.b')\n")
    modules = {f"pkg.{stem}": tmp_path / f"{stem}.py" for stem in "abc"}
    graph = {name: import_edges(name, path, modules) for name, path in modules.items()}
    assert graph == {"pkg.a": {"pkg.b": 2}, "pkg.b": {"pkg.a": 4}, "pkg.c": {"pkg.b": 4}}
    assert circles(graph) == [(["pkg.a", "pkg.b"], ["pkg.a", "pkg.b", "pkg.a"])]
    assert described(graph, ["pkg.a", "pkg.b", "pkg.a"]) == "pkg.a (line 2) -> pkg.b (line 4) -> pkg.a"


def test_the_plan_imports_no_backend_at_any_depth():
    # Which steps a DALI graph runs, and where each stage runs, are the backends' decisions, above the plan.
    below = reachable(import_graph(), "dali_bridge.pipeline.plan")
    assert not {m for m in below if m.startswith("dali_bridge.backends")}, sorted(below)


def test_no_backend_executor_imports_another():
    graph = import_graph()
    for name in EXECUTORS:
        others = {module for other in EXECUTORS if other != name for module in WINGS[other]}
        for module in WINGS[name]:
            assert not set(graph[module]) & others, module


def test_leaf_modules_import_nothing_of_the_project_but_one_another():
    for name in LEAVES:
        project = {m for m in imported_modules(PACKAGE / "util" / f"{name}.py") if m.startswith((".", "dali_bridge"))}
        assert project <= {f".{leaf}" for leaf in LEAVES}, name


def test_sources_and_the_converter_take_value_checks_and_utf8_from_the_leaves_not_the_op_layer():
    graph = import_graph()
    for name in ("data.sources.local", "data.sources.listing", "data.sources.webdataset", "tools.convert",
                 "tools.convert_staging", "tools.remote"):
        assert not {m for m in graph[f"dali_bridge.{name}"] if m.startswith("dali_bridge.ops")}, name


def test_every_relative_import_names_a_module_that_exists():
    # Imports inside functions run only when called: one that moved with its module must still resolve.
    for path in sorted(PACKAGE.rglob("*.py")):
        package = path.relative_to(REPO).with_suffix("").parts[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level and node.module:
                target = REPO.joinpath(*package[: len(package) - node.level + 1], *node.module.split("."))
                assert target.with_suffix(".py").is_file() or (target / "__init__.py").is_file(), \
                    f"{path.relative_to(REPO)}:{node.lineno}: from {'.' * node.level}{node.module}"


def imported_names(importer: str, module: str) -> set[str]:
    """The names module ``importer`` imports from module ``module`` (both absolute), wherever it writes it."""
    path = MODULES[importer]
    return {alias.name for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom)
            and _absolute(importer, path.name == "__init__.py", node.level, node.module or "") == module
            for alias in node.names}


def test_the_per_sample_loop_lives_in_the_core_alone():
    # Draws and a sample's steps are computed in one place (backends/per_sample.py), under one error policy.
    graph = import_graph()
    assert {"draws", "sample_steps"} <= imported_names("dali_bridge.backends.per_sample",
                                                       "dali_bridge.pipeline.sampling")
    for name in EXECUTORS:
        for module in WINGS[name]:
            assert not imported_names(module, "dali_bridge.pipeline.sampling") & {"draws", "sample_steps"}, module
        assert any("dali_bridge.backends.per_sample" in graph[module] for module in WINGS[name]), name


def test_what_the_executors_share_imports_neither_executor():
    graph = import_graph()
    wings = {module for name in EXECUTORS for module in WINGS[name]}
    for shared in SHARED:
        assert not reachable(graph, shared) & wings, shared


# The folders and the allowed-imports table -----------------------------------------------------
ARCHITECTURE = REPO / "docs" / "architecture.md"


def folder_of(module: str, modules: dict[str, Path] = MODULES) -> str:
    """``dali_bridge.data.shards.tar`` -> ``data/shards``; a module at the top is its file name
    (``errors.py``), the package's face ``dali_bridge``."""
    path = modules[module].relative_to(PACKAGE)
    if len(path.parts) > 1:
        return "/".join(path.parts[:-1])
    return "dali_bridge" if path.name == "__init__.py" else path.name


def holds_code(path: Path) -> bool:
    """Whether a module holds more than its docstring (a folder's ``__init__`` that only describes it
    is no edge: importing a subfolder runs it, and it runs nothing)."""
    body = ast.parse(path.read_text()).body
    return any(not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)) for node in body)


def allowed_imports(text: str) -> dict[str, set[str]]:
    """The ``| folder | may import |`` table under the "Allowed imports" heading."""
    section = text.split("## Allowed imports", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = set(re.findall(r"`([^`]+)`", cells[1].split("(")[0]))
    return rows


def folder_edges(graph: dict[str, dict[str, int]], modules: dict[str, Path] = MODULES) -> dict[tuple[str, str], str]:
    """Each (importing folder, imported folder) pair with one module-level example."""
    edges = {}
    for importer, targets in graph.items():
        for target, line in targets.items():
            pair = (folder_of(importer, modules), folder_of(target, modules))
            if pair[0] != pair[1] and holds_code(modules[target]):
                edges.setdefault(pair, f"{importer} (line {line}) -> {target}")
    return edges


def violations(edges: dict[tuple[str, str], str], table: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}: {example}" for (a, b), example in edges.items() if b not in table.get(a, set()))


def test_every_folder_imports_only_what_its_row_of_the_table_allows():
    table = allowed_imports(ARCHITECTURE.read_text())
    found = violations(folder_edges(import_graph()), table)
    assert not found, "imports docs/architecture.md does not allow (add the row's entry, or move the code):\n  " + \
        "\n  ".join(found)


def test_the_table_of_allowed_imports_has_no_circle_and_names_every_folder():
    table = allowed_imports(ARCHITECTURE.read_text())
    folders = {folder_of(module) for module in MODULES} - {"data"}
    assert set(table) == folders, (sorted(folders - set(table)), sorted(set(table) - folders))
    assert all(targets <= folders for targets in table.values()), table
    graph = {folder: {target: 0 for target in targets} for folder, targets in table.items()}
    assert circles(graph) == []


def test_the_folder_check_names_an_import_its_row_does_not_allow(tmp_path):
    # The check on two folders: ``low`` imports ``high`` lazily, inside a function, which its row does not allow.
    (tmp_path / "low").mkdir()
    (tmp_path / "high").mkdir()
    (tmp_path / "low" / "a.py").write_text("def f():\n    from ..high import b\n")
    (tmp_path / "high" / "b.py").write_text("from ..low import a\n")
    modules = {"dali_bridge.low.a": tmp_path / "low" / "a.py", "dali_bridge.high.b": tmp_path / "high" / "b.py"}
    graph = {name: import_edges(name, path, modules) for name, path in modules.items()}
    edges = {(a.split(".")[1], b.split(".")[1]): f"{a} -> {b}" for a, targets in graph.items() for b in targets}
    assert violations(edges, {"high": {"low"}, "low": set()}) == [
        "low -> high: dali_bridge.low.a -> dali_bridge.high.b"]
    assert violations(edges, {"high": {"low"}, "low": {"high"}}) == []
    assert circles({"high": {"low": 0}, "low": {"high": 0}}) == [(["high", "low"], ["high", "low", "high"])]


def test_no_module_imports_a_private_name_from_another():
    # What another module needs is public in its home (or the two belong together).
    found = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("dali_bridge")):
                found += [f"{name}:{node.lineno} {alias.name}" for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert not found, found


def test_no_package_face_but_the_public_one_imports_anything():
    # A folder's __init__ describes the folder; it re-exports nothing (imports name the real home).
    for name, path in MODULES.items():
        if path.name == "__init__.py" and name != "dali_bridge":
            imports = [node for node in ast.parse(path.read_text()).body
                       if isinstance(node, (ast.Import, ast.ImportFrom))
                       and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")]
            assert not imports, f"{path.relative_to(REPO)} imports at line {imports[0].lineno}"
