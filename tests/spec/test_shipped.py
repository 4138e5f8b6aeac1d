"""Shipped pipelines by name: load_spec (and so build_loader, the DataModule and every command)
takes a shipped pipeline's name where a path is expected; a local file of that name wins; an
unknown name is neither, with a did-you-mean."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.paths import PIPELINES, TRAIN
from dali_bridge import load_spec
from dali_bridge.spec.shipped import PipelineNotFound, resolve_pipeline, shipped_folder, shipped_pipelines

NAMES = sorted(path.stem for path in PIPELINES.glob("*.yaml"))


def test_every_file_of_the_top_level_folder_is_shipped_in_the_package():
    assert list(shipped_pipelines()) == NAMES
    # the package's copy is the top-level folder's file, byte for byte
    for name, pipeline in shipped_pipelines().items():
        assert pipeline.path.parent == shipped_folder()
        assert pipeline.path.read_bytes() == (PIPELINES / f"{name}.yaml").read_bytes()


@pytest.mark.parametrize("name", NAMES)
def test_a_shipped_name_loads_the_same_spec_as_its_file(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an empty folder: nothing of the clone by relative path
    by_name = load_spec(name)
    assert by_name == load_spec(PIPELINES / f"{name}.yaml")
    assert Path(by_name.origin) == shipped_folder() / f"{name}.yaml"
    assert load_spec(f"{name}.yaml") == by_name


def test_a_shipped_pipeline_reads_the_images_an_override_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = load_spec("imagenet_train", {"source.root": "data/train"})
    assert spec.source.root == str(tmp_path / "data" / "train")  # an override's path is the caller's


def test_a_local_file_of_the_same_name_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    local = TRAIN.read_text().replace("batch_size: 64", "batch_size: 12")
    assert local != TRAIN.read_text()
    Path("imagenet_train.yaml").write_text(local)
    for given in ("imagenet_train.yaml", "imagenet_train"):  # the bare name too: the copy `init` writes
        resolved = resolve_pipeline(given)
        assert resolved.path == Path("imagenet_train.yaml") and not resolved.shipped
        assert resolved.shadows == shipped_folder() / "imagenet_train.yaml"
        assert load_spec(given).batch_size == 12
        assert "a local file (it takes the place of the shipped pipeline imagenet_train)" in resolved.describe(given)


def test_a_folder_of_the_same_name_does_not_hide_the_shipped_pipeline(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "imagenet_train").mkdir()  # an image folder named like the pipeline
    resolved = resolve_pipeline("imagenet_train")
    assert resolved.shipped and resolved.path == shipped_folder() / "imagenet_train.yaml"
    assert resolved.describe("imagenet_train") == f"imagenet_train: the shipped pipeline {resolved.path}"


def test_an_unknown_name_is_neither_a_file_nor_a_shipped_pipeline_with_a_did_you_mean(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as caught:  # what callers of load_spec already catch
        load_spec("imagenet_trian")
    assert isinstance(caught.value, PipelineNotFound) and caught.value.filename == "imagenet_trian"
    message = str(caught.value)
    assert message.startswith("imagenet_trian: neither a file nor a shipped pipeline; did you mean 'imagenet_train'?")
    assert all(name in message for name in NAMES)


def test_a_missing_path_with_a_folder_is_not_taken_for_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PipelineNotFound) as caught:
        load_spec(os.path.join("configs", "imagenet_train.yaml"))
    assert "neither a file nor a shipped pipeline; did you mean 'imagenet_train'?" in str(caught.value)


@pytest.mark.parametrize("name", NAMES)
def test_each_shipped_pipeline_has_a_one_line_description(name):
    description = shipped_pipelines()[name].description()
    assert "\n" not in description and description.endswith(".") and 20 < len(description) < 250
