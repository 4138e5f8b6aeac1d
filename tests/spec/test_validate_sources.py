"""A source that does not exist is a validation problem: positioned, with a did-you-mean, listed with the rest."""
from __future__ import annotations

import pytest

from tests.helpers.paths import VAL
from dali_bridge.cli.main import main
from dali_bridge.cli.options import EXIT_INVALID
from dali_bridge.spec.pipeline import load_spec
from dali_bridge.spec.problems import MISSING_SOURCE, SpecError


def _line_of(path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), start=1) if text in line)


@pytest.fixture
def misspelt_root(tmp_path, write_pipeline):
    """A pipeline whose source.root is ``imagse/train`` where ``images/train`` exists."""
    (tmp_path / "images" / "train").mkdir(parents=True)
    return write_pipeline(VAL, source={"type": "folder", "root": str(tmp_path / "imagse" / "train")})


def test_validate_reports_a_missing_source_root_as_a_positioned_problem_with_a_did_you_mean(
        capsys, tmp_path, misspelt_root):
    assert main(["validate", str(misspelt_root)]) == EXIT_INVALID
    captured = capsys.readouterr()
    assert captured.out == ""
    line = _line_of(misspelt_root, "root:")
    assert (f"{misspelt_root}:{line}:3: source.root: folder {tmp_path / 'imagse'} does not exist (so neither does "
            f"{tmp_path / 'imagse' / 'train'}); did you mean {tmp_path / 'images'}?") in captured.err
    assert "--no-source-check makes a missing source a warning" in captured.err


def test_a_missing_source_is_listed_with_the_files_other_problems(capsys, tmp_path, write_pipeline):
    path = write_pipeline(VAL, batch_size=0, source={"type": "folder", "root": str(tmp_path / "absent")})
    assert main(["validate", str(path)]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert f"{path}: 2 problems:" in err
    assert "batch_size: expected an integer >= 1" in err
    assert f"source.root: folder {tmp_path / 'absent'} does not exist" in err


def test_a_source_root_set_on_the_command_line_is_reported_at_the_flag(capsys, tmp_path, misspelt_root):
    missing = tmp_path / "elsewhere"
    assert main(["validate", str(misspelt_root), "--set", f"source.root={missing}"]) == EXIT_INVALID
    assert f"--set source.root='{missing}': source.root: folder {missing} does not exist" in capsys.readouterr().err
    assert main(["validate", str(misspelt_root), "--set", f"source.root={tmp_path / 'images' / 'train'}"]) == 0


def test_a_missing_file_list_is_a_problem_naming_the_file(capsys, tmp_path, write_pipeline):
    (tmp_path / "train.txt").write_text("a.jpg 0\n")
    path = write_pipeline(VAL, source={"type": "file_list", "file_list": str(tmp_path / "trian.txt")})
    assert main(["validate", str(path)]) == EXIT_INVALID
    line = _line_of(path, "file_list:")
    assert (f"{path}:{line}:3: source.file_list: file {tmp_path / 'trian.txt'} does not exist; "
            f"did you mean {tmp_path / 'train.txt'}?") in capsys.readouterr().err


def test_missing_shards_are_counted_and_the_first_named(capsys, tmp_path, write_pipeline):
    for number in (0, 1):
        (tmp_path / f"train-{number:06d}.tar").write_bytes(b"")
    pattern = str(tmp_path / "train-{000000..000003}.tar")
    path = write_pipeline(VAL, source={"type": "webdataset", "shards": pattern})
    assert main(["validate", str(path)]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert (f"source.shards: 2 of 4 shard(s) do not exist; the first: file {tmp_path / 'train-000002.tar'} "
            f"does not exist; did you mean") in err


def test_an_explicit_manifest_that_does_not_exist_is_a_problem(capsys, tmp_path, write_pipeline):
    (tmp_path / "train-000000.tar").write_bytes(b"")
    path = write_pipeline(VAL, source={"type": "webdataset", "shards": str(tmp_path / "train-000000.tar"),
                                       "manifest": str(tmp_path / "train.manifest.json")})
    assert main(["validate", str(path)]) == EXIT_INVALID
    assert f"source.manifest: file {tmp_path / 'train.manifest.json'} does not exist" in capsys.readouterr().err


def test_no_source_check_validates_a_file_away_from_its_data(capsys, tmp_path, write_pipeline):
    path = write_pipeline(VAL, batch_size=0, source={"type": "folder", "root": str(tmp_path / "absent")})
    assert main(["validate", str(path), "--no-source-check"]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert f"{path}: 1 problem:" in err and "source.root" not in err


def test_load_spec_checks_sources_when_asked_by_keyword(tmp_path, misspelt_root):
    assert load_spec(misspelt_root).source.root == str(tmp_path / "imagse" / "train")  # default: data mounted later
    with pytest.raises(SpecError) as raised:
        load_spec(misspelt_root, check_sources=True)
    (problem,) = raised.value.problems
    assert problem.path == "source.root" and problem.where.startswith(f"{misspelt_root}:")
    assert problem.kind == MISSING_SOURCE
    assert problem.message.endswith(f"did you mean {tmp_path / 'images'}?")
    fixed = load_spec(misspelt_root, {"source.root": str(tmp_path / "images" / "train")}, check_sources=True)
    assert fixed.source.root == str(tmp_path / "images" / "train")
