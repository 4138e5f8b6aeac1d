"""The benchmarks page renders ``benchmarks/ray_executor.py``'s results: one row per executor with the
medians of its runs, the stalls of each ray run, and the ratio of the trainer's CPU per image."""
from __future__ import annotations

import json

from dali_bridge.bench.ray_report import RAY_EXECUTOR_FORMAT
from dali_bridge.bench.report import render_file


def report(**extra) -> dict:
    rows = [{"executor": "processes", "images_per_s": 300.0, "trainer_cpu_ms_per_image": 1.6,
             "trainer_process_cpu_ms_per_image": 0.2},
            {"executor": "processes", "images_per_s": 320.0, "trainer_cpu_ms_per_image": 1.8,
             "trainer_process_cpu_ms_per_image": 0.2},
            {"executor": "ray", "images_per_s": 500.0, "trainer_cpu_ms_per_image": 0.4,
             "trainer_process_cpu_ms_per_image": 0.4, "cluster_cpu_ms_per_image": 1.9,
             "stalls": {"stalls": 3, "stall_s": 0.25}}]
    return {"format": RAY_EXECUTOR_FORMAT, "command": "python benchmarks/ray_executor.py --data data/sample",
            "machine": {"cpu": "Test CPU", "cpus": 2, "platform": "Linux", "ram_gib": 8,
                        "versions": {"torch": "2.x", "ray": "2.y"}, "load_average_1min_range": [1.0, 2.5]},
            "pipeline": "imagenet_train.yaml", "batch_size": 32, "warmup": 3, "batches": 40, "workers": 2,
            "nodes": 2, "node_cpus": 1, "rounds": 2, "quick": False, "run_s": 120.0, "rows": rows, **extra}


def test_the_section_shows_each_executors_medians_and_the_trainer_cpu_ratio(tmp_path):
    path = tmp_path / "ray_executor.json"
    path.write_text(json.dumps(report()))
    page = render_file(path)
    assert page.startswith("## loader.executor: ray against local workers (ray_executor.json)")
    assert "| local workers (processes) | 2 | 310 | 1.70 | 0.20 | – | – |" in page
    assert "| ray | 1 | 500 | 0.40 | 0.40 | 1.90 | 3 (0.25 s) |" in page
    assert "0.24 × the CPU per image" in page and "Test CPU, 2 cores" in page
    assert "smoke run" not in page


def test_a_quick_run_says_it_measures_nothing(tmp_path):
    path = tmp_path / "ray_executor.json"
    path.write_text(json.dumps(report(quick=True)))
    assert "A smoke run (`--quick`)" in render_file(path)
