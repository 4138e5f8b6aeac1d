"""Examples in docs/ that show what a command prints are that command's output today."""
from __future__ import annotations

import re

from conftest import REPO
from dali_bridge.cli import EXIT_INVALID, main

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
