"""The SPDL bench baseline builds and yields batches of the pipeline's shape, in each configuration,
and the bench table says which configuration ran. Never timed."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from tests.helpers.backends import plan_of
from tests.helpers.paths import TRAIN
from dali_bridge.bench.results import BenchError
from dali_bridge.bench.baselines import reference_description
from dali_bridge.bench.report import bench_table
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.data.sources.local import list_source
from dali_bridge.spec.pipeline import load_spec

needs_spdl = pytest.mark.skipif(importlib.util.find_spec("spdl") is None,
                                reason="spdl is not installed (pip install dali-bridge[bench])")


def _ffmpeg_problem() -> str | None:
    if importlib.util.find_spec("spdl") is None:
        return "spdl is not installed"
    from dali_bridge.bench.spdl_baseline import spdl_io_problem
    return spdl_io_problem()


needs_spdl_io = pytest.mark.skipif(_ffmpeg_problem() is not None, reason=f"spdl.io cannot decode here: "
                                   f"{_ffmpeg_problem()}")


def _batches(sample_root, name: str, count: int, threads: int = 2, **overrides):
    from dali_bridge.bench.spdl_baseline import spdl_baseline

    spec = load_spec(TRAIN, {"source": {"type": "folder", "root": str(sample_root)}, "batch_size": 8, **overrides})
    listing = list_source(spec.source)
    stream, close = spdl_baseline(spec, listing, build_plan(spec), threads, name=name)
    try:
        return [next(stream) for _ in range(count)], len(listing)
    finally:
        stream.close()
        close()


@needs_spdl_io
def test_the_spdl_io_baseline_yields_normalised_batches_of_the_pipelines_shape(sample_root):
    batches, count = _batches(sample_root, "spdl", 6)  # 48 samples: past the end of the 37-sample epoch
    for images, indices in batches:
        assert images.shape == (8, 3, 224, 224) and images.dtype == torch.float32
        assert indices.dtype == np.int64 and len(indices) == 8
        assert float(images.min()) < -0.5 < 0.5 < float(images.max())  # normalised, not 0-255 or 0-1
    seen = np.concatenate([indices for _, indices in batches])
    assert sorted(seen[:count].tolist()) == list(range(count))  # epoch 0 reads every sample once, in order


@needs_spdl
def test_the_naive_spdl_baseline_runs_torchvisions_transforms_in_threads(sample_root):
    batches, count = _batches(sample_root, "spdl-torchvision", 5, threads=1)
    assert [tuple(images.shape) for images, _ in batches] == [(8, 3, 224, 224)] * 5
    assert sorted(np.concatenate([i for _, i in batches])[:count].tolist()) == list(range(count))


def test_the_spdl_io_baseline_refuses_a_step_ffmpeg_filters_do_not_express():
    from dali_bridge.bench.spdl_baseline import filter_steps

    plan = plan_of([{"random_resized_crop": {"size": 96}}, {"color_jitter": {"brightness": 0.4}}])
    with pytest.raises(BenchError, match="no spdl.io filter equivalent for step 'color_jitter'.*spdl-torchvision"):
        filter_steps(plan)


def test_sample_filters_crop_scale_and_flip_with_the_baselines_own_draws():
    from dali_bridge.bench.spdl_baseline import sample_filter

    plan = plan_of([{"resize": 256}, {"center_crop": 224}, {"horizontal_flip": {"probability": 1.0}}])
    chain = sample_filter(list(plan.steps), 300, 400, np.random.default_rng(0))
    assert chain == "scale=341:256:flags=bilinear,crop=224:224:58:16,hflip,format=pix_fmts=rgb24"
    rrc = plan_of([{"random_resized_crop": {"size": [64, 48]}}])
    first, second = (sample_filter(list(rrc.steps), 300, 400, np.random.default_rng(seed)) for seed in (1, 2))
    assert first != second and first.endswith(",scale=48:64:flags=bilinear,format=pix_fmts=rgb24")


def test_the_bench_table_says_what_each_reference_is_and_which_spdl_configuration_ran(monkeypatch):
    from dali_bridge.bench import spdl_baseline

    monkeypatch.setattr(spdl_baseline, "spdl_io_problem", lambda: "spdl.io cannot load FFmpeg (libavutil)")
    naive = reference_description("baseline", "spdl", 4)
    assert naive.startswith("SPDL ") and "torchvision.io decode + transforms.v2 in 4 threads" in naive
    assert "(spdl.io unavailable: spdl.io cannot load FFmpeg (libavutil))" in naive
    monkeypatch.setattr(spdl_baseline, "spdl_io_problem", lambda: None)
    full = reference_description("baseline", "spdl", 2)
    assert "spdl.io FFmpeg decode + crop/scale/flip filters in 2 threads" in full
    rows = [{"candidate": "hand-written SPDL", "kind": "baseline", "name": "spdl", "threads": 2, "description": full},
            {"candidate": "torchvision", "kind": "backend", "name": "torchvision", "threads": 2}]
    for row in rows:
        row.update(images_per_s=1.0, images_per_s_min=1.0, images_per_s_max=1.0, megapixels_per_s=1.0,
                   cpu_ms_per_image=1.0, pss_mib=1.0, peak_rss_mib=1.0, first_batch_s=1.0)
    table = bench_table({"settings": {}, "results": rows})
    assert f"What each reference is, as it ran:\n\n* hand-written SPDL × 2: {full}" in table
    assert "DataLoader with 1 worker: torchvision.io.decode_image" in reference_description("baseline",
                                                                                            "torchvision", 1)
    assert reference_description("ceiling", "decode", 2).startswith("read + torchvision.io full decode on a pool "
                                                                    "of 2 threads")


@pytest.mark.slow
@needs_spdl
def test_bench_measures_the_spdl_baseline_and_records_its_configuration(sample_root, tmp_path, capsys):
    import json

    from dali_bridge.cli.main import main

    out = tmp_path / "bench.json"
    assert main(["bench", str(TRAIN), "--data", str(sample_root), "--backends", "none", "--baselines", "spdl",
                 "--threads", "1", "--warmup", "1", "--batches", "1", "--repeat", "1", "--set", "batch_size=4",
                 "--json", str(out), "-q"]) == 0
    (row,) = json.loads(out.read_text())["results"]
    assert row["candidate"] == "hand-written SPDL" and "error" not in row and row["images"] == 4
    assert row["description"] == reference_description("baseline", "spdl", 1)
    assert f"reference hand-written SPDL × 1: {row['description']}" in capsys.readouterr().out
