"""Examples in docs/ that show what a command prints are that command's output today."""
from __future__ import annotations

import re

from tests.helpers.paths import REPO
from dali_bridge.cli.main import main
from dali_bridge.cli.options import EXIT_INVALID

DOC_PROJECT = "/home/me/project"  # where the docs' examples pretend to run


def _blocks_after(text: str, heading: str) -> list[tuple[str, str]]:
    """The fenced blocks (language, body) of the section under ``heading``."""
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w*)\n(.*?)```", section, re.S)


def test_the_validate_example_in_pipeline_file_md_is_what_validate_prints(capsys, monkeypatch, tmp_path):
    (_, bad_yaml), (_, transcript) = _blocks_after((REPO / "docs" / "pipeline-file.md").read_text(),
                                                   "## Validation")[:2]
    command, expected = transcript.split("\n", 1)
    assert command == "$ dali-bridge validate bad.yaml"
    project = tmp_path / "project"
    (project / "data" / "sample").mkdir(parents=True)
    (project / "pipelines").mkdir()
    (project / "pipelines" / "bad.yaml").write_text(bad_yaml)
    monkeypatch.chdir(project / "pipelines")
    assert main(["validate", "bad.yaml"]) == EXIT_INVALID
    printed = capsys.readouterr().err.replace(str(project), DOC_PROJECT)
    assert printed == expected


def test_performance_md_names_the_ops_the_hand_written_dali_baseline_cannot_build():
    from dali_bridge.ops.facets import DaliBaseline
    from dali_bridge.ops.registry import BUILTIN_OPS

    text = (REPO / "docs" / "performance.md").read_text()
    sentence = text.split("Ops without a plain DALI counterpart:", 1)[1].split(";", 1)[0]
    documented = set(re.findall(r"`(\w+)`", sentence))
    lacking = {name for name, op in BUILTIN_OPS.items() if op.category in ("geometry", "pixel")
               and getattr(type(op), "dali_baseline", DaliBaseline.dali_baseline) is DaliBaseline.dali_baseline
               and getattr(type(op), "dali_baseline_decode",
                           DaliBaseline.dali_baseline_decode) is DaliBaseline.dali_baseline_decode}
    assert documented == lacking
    after_finish = text.split("Ops after the finish", 1)[1].split("are left out", 1)[0]
    assert set(re.findall(r"`(\w+)`", after_finish)) == {name for name, op in BUILTIN_OPS.items()
                                                         if op.category in ("after_finish", "batch")}


def test_adding_an_op_shows_the_whole_vertical_flip_module_as_it_is():
    page = (REPO / "docs" / "adding-an-op.md").read_text()
    section = page.split("## The whole op, one module", 1)[1]
    shown = section.split("```python\n", 1)[1].split("\n```", 1)[0]
    assert shown.rstrip() == (REPO / "dali_bridge" / "ops" / "vertical_flip.py").read_text().rstrip()
