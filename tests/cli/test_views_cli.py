"""``show`` and ``validate`` of a pipeline with views: each group's output and stages, the views counted."""
from __future__ import annotations

from dali_bridge.cli.main import main
from tests.helpers.paths import PIPELINES


def test_show_prints_each_groups_output_and_stages_on_every_backend(capsys):
    assert main(["show", "dino_train"]) == 0
    out = capsys.readouterr().out
    assert "# output per batch: a list of 10 views, each cut from the sample's one decode" in out
    assert "# output per batch: views 0-1 (global): (64, 3, 224, 224) float32 (CHW)" in out
    assert "# output per batch: views 2-9 (local): (64, 3, 96, 96) float32 (CHW)" in out
    for backend in ("dali-cpu", "torchvision"):
        section = out.split(f"## {backend} (")[1].split("\n## ")[0]
        assert "### views group global: 2 views (0, 1)" in section
        assert "### views group local: 8 views (2, 3, 4, 5, 6, 7, 8, 9)" in section
    dali_cpu = out.split("## dali-cpu (")[1].split("\n## ")[0]
    assert dali_cpu.count("fn.decoders.image (once per sample: every view is cut from it)") == 2
    assert "fn.decoders.image_slice" not in dali_cpu   # no view's window alone: one whole decode for all
    assert "decoder here: torchvision.io full decode, once per sample: every view is cut from it" in out


def test_validate_counts_views_and_groups(capsys):
    assert main(["validate", str(PIPELINES / "byol_train.yaml"), "--no-source-check"]) == 0
    expected = f"{PIPELINES / 'byol_train.yaml'}: ok (byol-train: 2 views in 1 group, batch 256)"
    assert capsys.readouterr().out.strip() == expected
