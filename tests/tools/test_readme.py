"""The README's examples run as printed.

Its fenced blocks are parsed and each kind is checked as far as this machine allows:
* the Python loop runs, verbatim, in an empty folder whose `data/train` is a small generated set
  (the shipped pipeline it names reads it);
* `dali-bridge` commands: `validate` runs; the others must parse with the real argument parser
  (running them is minutes of work the other tests already cover);
* `./dev.sh run` / `./dev.sh test`: dev.sh is executable, its syntax is valid and it accepts both
  subcommands (running them installs a virtual environment);
* `pip install` and `torchrun` lines: shell syntax only; the distributed Python block compiles and
  names only what `dali_bridge` exports (it needs a process group);
* YAML blocks validate as pipelines.
Every relative link in the README and docs/ points at a file (and heading) that exists.
"""
from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers.paths import REPO
from dali_bridge.cli.main import build_parser, main
from dali_bridge.data.sources.synthetic import ensure_sample_data
from dali_bridge.spec.pipeline import spec_from_dict

README = REPO / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(language: str) -> list[str]:
    found = [body for lang, body in FENCE.findall(README.read_text()) if lang == language]
    assert found, f"the README has no {language} block"
    return found


def shell_commands() -> list[str]:
    """Every command line of the README's bash blocks, comments stripped."""
    lines = []
    for body in blocks("bash"):
        for line in body.splitlines():
            command = line.split(" #", 1)[0].strip()
            if command and not command.startswith("#"):
                lines.append(command)
    return lines


def test_readme_fits_a_screenful_of_essentials():
    assert README.stat().st_size <= 12 * 1024


WRITTEN_ELSEWHERE = {"docs/adding-an-op.md", "docs/gpu.md"}  # written alongside the op and GPU work


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a markdown page's headings."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.M)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", [README, *sorted((REPO / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_links_point_at_files_and_headings_that_exist(page):
    for target, anchor in re.findall(r"\]\(([^)#\s]+)(?:#([^)]*))?\)", page.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path = (page.parent / target).resolve()
        if str(path.relative_to(REPO)) in WRITTEN_ELSEWHERE and not path.exists():
            continue
        assert path.exists(), f"{page.name} links to missing {target}"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{page.name} links to missing heading {target}#{anchor}"


@pytest.mark.slow
def test_python_loop_runs_as_printed(tmp_path, monkeypatch, capsys):
    loop = next(b for b in blocks("python") if "init_process_group" not in b)
    ensure_sample_data(tmp_path / "data" / "train", images=24, classes=3, seed=0)  # the loop's source.root
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the CPU path, whatever this host has
    exec(compile(loop, "README.md", "exec"), {"__name__": "readme"})
    backend, batches, shape = capsys.readouterr().out.split(maxsplit=2)
    assert backend in ("torchvision", "dali-cpu", "dali") and int(batches) == 1
    assert shape.strip() == "(24, 3, 224, 224)"


@pytest.mark.slow
def test_soft_target_loop_runs_as_printed(tmp_path, monkeypatch):
    loop = next(b for b in blocks("python") if "CrossEntropyLoss" in b)
    ensure_sample_data(tmp_path / "data" / "train", images=24, classes=3, seed=0)  # the loop's source.root
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the CPU path, whatever this host has
    scope = {"__name__": "readme"}
    exec(compile(loop, "README.md", "exec"), scope)
    targets = scope["targets"]
    assert targets.shape == (32, 3) and torch.allclose(targets.sum(dim=1), torch.ones(32))
    assert scope["model"][2].weight.grad is not None


def test_distributed_example_compiles_and_uses_only_the_public_api():
    import dali_bridge

    example = next(b for b in blocks("python") if "init_process_group" in b)
    compile(example, "README.md", "exec")
    for name in re.findall(r"from dali_bridge import (.+)", example):
        for imported in name.split(","):
            assert hasattr(dali_bridge, imported.strip()), imported


def test_yaml_blocks_are_valid_pipelines():
    for body in blocks("yaml"):
        spec = spec_from_dict(yaml.safe_load(body), base_dir=REPO / "pipelines")
        assert spec.batch_size > 0


def test_shell_lines_have_valid_syntax():
    for command in shell_commands():
        assert subprocess.run(["bash", "-n", "-c", command]).returncode == 0, command


def test_dali_bridge_commands_parse_and_validate_runs(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    commands = [shlex.split(c)[1:] for c in shell_commands() if c.startswith("dali-bridge ")]
    assert commands
    parser = build_parser()
    for argv in commands:
        parser.parse_args(argv)  # exits 2 on an unknown command or option
        if argv[0] == "validate":
            assert main(argv) == 0


def test_dev_sh_offers_the_two_commands():
    dev = REPO / "dev.sh"
    assert any(c.startswith("./dev.sh run") for c in shell_commands())
    assert any(c.startswith("./dev.sh test") for c in shell_commands())
    assert dev.stat().st_mode & 0o111, "dev.sh must be executable"
    assert subprocess.run(["bash", "-n", str(dev)]).returncode == 0
    script = dev.read_text()
    assert re.search(r"^\s+run\)", script, re.M) and re.search(r"^\s+test\)", script, re.M)
    usage = subprocess.run([str(dev), "no-such-command"], capture_output=True, text=True)
    assert usage.returncode == 2 and "./dev.sh run [--full] | ./dev.sh test" in usage.stderr

