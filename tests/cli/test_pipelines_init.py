"""``dali-bridge pipelines``, ``init NAME [-o FILE]``, ``--version``, and the commands that take a
pipeline taking a shipped pipeline's name (run from an empty folder: nothing of the clone is read
by relative path)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers.paths import PIPELINES, REPO
import dali_bridge
from dali_bridge.cli.main import main
from dali_bridge.cli.options import EXIT_INVALID
from dali_bridge.spec.shipped import shipped_folder, shipped_pipelines

NAMES = sorted(path.stem for path in PIPELINES.glob("*.yaml"))


def test_pipelines_lists_every_shipped_name_with_its_description(capsys):
    assert main(["pipelines"]) == 0
    out = capsys.readouterr().out
    for name, pipeline in shipped_pipelines().items():
        assert re.search(rf"^{name} +{re.escape(pipeline.description())}$", out, re.M), name
    assert f"{len(NAMES)} shipped pipelines in {shipped_folder()}" in out
    assert "--data DIR" in out and "dali-bridge init NAME" in out


def test_init_writes_the_shipped_file_comments_and_all(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["init", "timm_train"]) == 0
    assert (tmp_path / "timm_train.yaml").read_bytes() == (PIPELINES / "timm_train.yaml").read_bytes()
    assert "wrote timm_train.yaml" in capsys.readouterr().out
    assert main(["init", "imagenet_val.yaml", "-o", "configs-val.yaml"]) == 0
    assert Path("configs-val.yaml").read_bytes() == (PIPELINES / "imagenet_val.yaml").read_bytes()
    Path("configs").mkdir()
    assert main(["init", "imagenet_val", "-o", "configs"]) == 0  # a folder: the copy goes in it
    assert Path("configs/imagenet_val.yaml").read_bytes() == (PIPELINES / "imagenet_val.yaml").read_bytes()


def test_init_refuses_to_overwrite_an_existing_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("mine.yaml").write_text("my edits\n")
    assert main(["init", "imagenet_train", "-o", "mine.yaml"]) == EXIT_INVALID
    assert Path("mine.yaml").read_text() == "my edits\n"
    assert "mine.yaml exists; not overwritten" in capsys.readouterr().err


def test_init_of_an_unknown_name_says_did_you_mean(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["init", "timm_trian"]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert "timm_trian: neither a file nor a shipped pipeline; did you mean 'timm_train'?" in err
    assert list(tmp_path.iterdir()) == []


def test_run_of_an_unknown_name_exits_2_with_did_you_mean(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "imagenet_trainn"]) == EXIT_INVALID
    assert "imagenet_trainn: neither a file nor a shipped pipeline; did you mean 'imagenet_train'?" in \
        capsys.readouterr().err


def test_show_says_which_file_was_used(tmp_path, monkeypatch, capsys, no_cuda):
    monkeypatch.chdir(tmp_path)
    assert main(["show", "imagenet_val"]) == 0
    assert capsys.readouterr().out.startswith(
        f"# resolved pipeline: imagenet_val: the shipped pipeline {shipped_folder() / 'imagenet_val.yaml'}\n")
    assert main(["init", "imagenet_val"]) == 0
    capsys.readouterr()
    assert main(["show", "imagenet_val"]) == 0
    assert capsys.readouterr().out.startswith("# resolved pipeline: imagenet_val.yaml: a local file (it takes the "
                                              "place of the shipped pipeline imagenet_val)\n")


def test_validate_takes_shipped_names(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["validate", *NAMES, "--no-source-check"]) == 0
    assert [line.split(":")[0] for line in capsys.readouterr().out.splitlines()] == NAMES


def test_run_takes_a_shipped_name_and_the_users_images(tmp_path, monkeypatch, sample_root, no_cuda):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "imagenet_train", "--data", str(sample_root), "--batches", "2", "--backends", "torchvision",
                 "--set", "batch_size=8", "--set", "loader.workers=0", "-q", "--json", "rows.json"]) == 0
    rows = json.loads(Path("rows.json").read_text())
    assert [(row["pipeline"], row["backend"], row["batches"], row["images"]) for row in rows] == \
        [("imagenet-train", "torchvision", 2, 16)]


def test_build_loader_takes_a_shipped_name(tmp_path, monkeypatch, sample_root, no_cuda):
    monkeypatch.chdir(tmp_path)
    loader = dali_bridge.build_loader("imagenet_val", "torchvision",
                                      overrides={"source.root": str(sample_root), "batch_size": 8,
                                                 "loader.workers": 0})
    try:
        images, labels = next(iter(loader))
    finally:
        loader.close()
    assert tuple(images.shape) == (8, 3, 224, 224) and len(loader.listing) == 37


def test_the_version_is_written_once():
    done = subprocess.run([sys.executable, "-m", "dali_bridge", "--version"], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert done.stdout.strip() == f"dali-bridge {dali_bridge.__version__}"
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and 'version = {attr = "dali_bridge.__version__"}' in pyproject
    assert not re.search(r"^version\s*=", pyproject.split("[tool.")[0], re.M)  # no second copy in [project]
