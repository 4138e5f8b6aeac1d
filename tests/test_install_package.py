"""The package as pip sees it: the wheel carries the shipped pipelines, LICENSE and py.typed, and
the sdist builds the same wheel (.ci/install_check.py's own build, run here on a copy of the
tree); the base requirements hold no DALI build and each CUDA extra one; .ci/constraints.txt pins
every distribution the tested install holds, so pip resolves it without searching."""
from __future__ import annotations

import importlib.util
import re
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.helpers.paths import PIPELINES, REPO
import dali_bridge

tomllib = pytest.importorskip("tomllib")


def _install_check():
    spec = importlib.util.spec_from_file_location("install_check", REPO / ".ci" / "install_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Raises CheckFailed when the sdist's wheel differs from the tree's, or the wheel lacks a
    # shipped pipeline, LICENSE or py.typed, or is not dali_bridge.__version__.
    return _install_check().build_and_compare(tmp_path_factory.mktemp("build"))


@pytest.mark.slow
def test_the_wheel_carries_the_pipelines_license_and_type_hints(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert sorted(n for n in names if n.startswith("dali_bridge/pipelines/")) == \
        sorted(f"dali_bridge/pipelines/{p.name}" for p in PIPELINES.glob("*.yaml"))
    assert "dali_bridge/py.typed" in names
    license_file = next(n for n in names if n.endswith(".dist-info/licenses/LICENSE"))
    assert zipfile.ZipFile(wheel).read(license_file) == (REPO / "LICENSE").read_bytes()
    assert wheel.name == f"dali_bridge-{dali_bridge.__version__}-py3-none-any.whl"


@pytest.mark.slow
def test_the_wheels_metadata_puts_dali_in_one_extra_per_cuda_major(wheel):
    meta = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
    text = zipfile.ZipFile(wheel).read(meta).decode()
    assert "License-Expression: Apache-2.0" in text and f"Version: {dali_bridge.__version__}" in text
    requires = [Requirement(line.split(":", 1)[1].strip()) for line in text.splitlines()
                if line.startswith("Requires-Dist:")]
    linux = {"sys_platform": "linux", "platform_machine": "x86_64"}

    def dali_for(extra: str) -> list[str]:
        return [r.name for r in requires if r.name.startswith("nvidia-dali")
                and (r.marker is None or r.marker.evaluate({**linux, "extra": extra}))]

    assert dali_for("") == []
    assert dali_for("cuda12") == ["nvidia-dali-cuda120"]
    assert dali_for("cuda13") == ["nvidia-dali-cuda130"]
    macos = {"sys_platform": "darwin", "platform_machine": "arm64"}
    assert not [r for r in requires if r.name.startswith("nvidia-dali")
                and r.marker.evaluate({**macos, "extra": "cuda12"})]  # DALI has no macOS wheels


def test_the_license_file_is_apache_2_as_declared():
    assert _pyproject()["project"]["license"] == "Apache-2.0"
    text = (REPO / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text


def _constraints() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (REPO / ".ci" / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line)
            name = canonicalize_name(requirement.name)
            assert name not in pins, f"{name} is pinned twice"
            assert len(requirement.specifier) == 1 and next(iter(requirement.specifier)).operator == "==", line
            pins[name] = next(iter(requirement.specifier)).version
    return pins


def test_constraints_pin_every_distribution_the_tested_install_holds():
    # What ./dev.sh test and .ci/run install: dali-bridge[test,cuda12]. With every distribution of
    # it pinned, pip has one candidate for each and never backtracks.
    project = _pyproject()["project"]
    requirements = [Requirement(text) for text in project["dependencies"] + project["optional-dependencies"]["test"]
                    + project["optional-dependencies"]["cuda12"]]
    installed = _install_check().closure(requirements, extras=("", "test", "cuda12"))
    pins = _constraints()
    unpinned = sorted(installed - set(pins))
    assert not unpinned, f"not pinned in .ci/constraints.txt: {unpinned}"
    from importlib.metadata import version
    differ = {name: (pins[name], version(name)) for name in installed
              if re.sub(r"\+.*", "", version(name)) != pins[name]}
    assert not differ, f"constraints pin other releases than the ones installed and tested: {differ}"


REPOSITORY_FOLDERS = ("docs", "benchmarks", "tests", "pipelines")


def test_nothing_in_the_package_reads_a_repository_folder_by_relative_path():
    # An installed dali-bridge has no clone around it: a path built from a literal naming one of the
    # repository's folders (Path("docs/..."), open("pipelines/x.yaml"), ROOT / "tests") would read
    # whatever the user's current folder holds. The shipped pipelines are read as package data
    # (importlib.resources' joinpath("pipelines") inside the package).
    import ast

    found = []
    for path in sorted((REPO / "dali_bridge").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            joined = isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)  # ROOT / "tests"
            operands = node.args if isinstance(node, ast.Call) else [node.left, node.right] if joined else []
            for operand in operands:
                text = operand.value if isinstance(operand, ast.Constant) and isinstance(operand.value, str) else ""
                if text.split("/")[0] in REPOSITORY_FOLDERS and ("/" in text or joined):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: {text!r}")
    assert not found, found
