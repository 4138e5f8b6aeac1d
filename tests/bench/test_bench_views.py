"""``dali-bridge bench`` on a pipeline with views: every view of a sample measured, img/s counted in
samples, the views per sample stated; the hand-written single-image baselines refused beside it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dali_bridge.bench.report import format_report, render_file
from dali_bridge.bench.results import BenchError, BenchReport
from dali_bridge.bench.runner import run_bench
from dali_bridge.cli.main import main

BATCH, BATCHES = 4, 2


def _views_pipeline(tmp_path: Path, root: Path) -> Path:
    """Two views of 32 and one of 16 per sample."""
    spec = {"version": 1, "name": "views-bench", "source": {"type": "folder", "root": str(root)},
            "batch_size": BATCH, "seed": 0,
            "views": {"global": {"count": 2, "ops": [{"random_resized_crop": {"size": 32}}, {"normalize": {}}]},
                      "local": {"ops": [{"random_resized_crop": {"size": 16, "scale": [0.05, 0.4]}},
                                        {"normalize": {}}]}},
            "outputs": ["views", "label"], "loader": {"workers": 0}}
    path = tmp_path / "views.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.slow
def test_bench_measures_every_view_counts_samples_and_states_the_views(sample_root, tmp_path):
    json_path = tmp_path / "bench.json"
    status = main(["bench", str(_views_pipeline(tmp_path, sample_root)), "--backends", "torchvision",
                   "--baselines", "none", "--threads", "1", "--warmup", "1", "--batches", str(BATCHES),
                   "--repeat", "1", "--json", str(json_path), "-q"])
    report = json.loads(json_path.read_text())
    row, = report["results"]
    assert status == 0 and "error" not in row
    assert row["views"] == 3
    assert row["view_shapes"] == [[BATCH, 3, 32, 32], [BATCH, 3, 32, 32], [BATCH, 3, 16, 16]]
    assert row["images"] == BATCH * BATCHES  # samples, not views
    note = "3 views per sample (2 of 3 x 32 x 32, 1 of 3 x 16 x 16); img/s and CPU ms/img count samples"
    printed = format_report(BenchReport(report["machine"], report["settings"], report["data"], report["results"]))
    assert note in printed
    assert note in render_file(json_path, out_dir=tmp_path)


def test_hand_written_baselines_are_refused_beside_a_views_pipeline(sample_root, tmp_path):
    with pytest.raises(BenchError, match=r"\(torchvision\) build one image per sample, and this pipeline gives 3 "
                                         r"views per sample \(views: global, local\): use --baselines ceiling or none"):
        run_bench(_views_pipeline(tmp_path, sample_root), backends=["torchvision"],
                  baselines=["ceiling", "torchvision"], threads=[1], progress=False)


def test_a_report_without_views_states_none():
    rows = [{"candidate": "torchvision", "kind": "backend", "name": "torchvision", "threads": 1}]
    from dali_bridge.bench.report import views_lines
    assert views_lines(rows) == []


def test_bench_of_a_views_pipeline_by_default_measures_it_beside_the_ceiling_alone(sample_root, tmp_path,
                                                                                   monkeypatch):
    from dali_bridge.bench import runner

    asked = {}

    def measured(file, *, backends, baselines, **_):
        asked.update(backends=backends, baselines=baselines)
        raise BenchError("stop here")   # what run_bench was asked is all this test needs

    monkeypatch.setattr(runner, "run_bench", measured)
    main(["bench", str(_views_pipeline(tmp_path, sample_root)), "--backends", "torchvision", "-q"])
    assert asked == {"backends": ["torchvision"], "baselines": ["ceiling"]}
    assert runner.default_baselines(["torchvision"]) == ["ceiling", "torchvision"]   # one image per sample


def test_the_ceilings_list_of_decoded_images_is_not_taken_for_views():
    import torch

    from dali_bridge.bench.measure import _pixels_description

    decoded = [torch.zeros(3, 20, 30, dtype=torch.uint8), torch.zeros(3, 10, 40, dtype=torch.uint8)]
    assert "views" not in _pixels_description(decoded, torch, views=False)   # a reference's images
    assert _pixels_description(decoded, torch, views=True)["views"] == 2       # a bridge backend's views
