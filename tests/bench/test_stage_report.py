"""The bench's CPU split by stage (the ``torchvision`` backend's ``loader.stats()["stages"]`` over the
timed windows) and the bounds it sets on the ratios the bench reports."""
from __future__ import annotations

import pytest

from dali_bridge.bench.measure import _timed_windows, _window_stages
from dali_bridge.bench.results import Candidate, CandidateResult
from dali_bridge.bench.stage_report import stage_bounds, stage_lines
from dali_bridge.backends.stages import STAGES

import numpy as np


def _figures(images: int, **ms: float) -> dict:
    return {"images": images, "cpu_ms_per_image": {stage: ms.get(stage, 0.0) for stage in STAGES}}


def test_a_window_keeps_only_the_stage_cpu_of_its_own_batches():
    before, after = _figures(100, decode=1.0, finish=0.2), _figures(300, decode=0.8, finish=0.3)
    window = _window_stages(before, after)
    assert window["stage_images"] == 200
    # 0.24 s of decode after, 0.1 s before: 0.14 s over the window's 200 images
    assert window["stage_cpu_seconds"]["decode"] == pytest.approx(0.14)
    assert window["stage_cpu_seconds"]["finish"] == pytest.approx(0.07)
    assert _window_stages(None, after)["stage_images"] == 300   # nothing handed over before the window
    assert _window_stages(after, after) == {} and _window_stages(before, None) == {}


def test_timed_windows_record_the_split_only_for_a_candidate_that_has_one():
    handed = iter([_figures(0), _figures(4, decode=2.0), _figures(4, decode=2.0), _figures(8, decode=1.5)])
    stream = iter([(None, np.array([0, 1])), (None, np.array([2, 3]))] * 2)
    config = {"repeat": 2, "batches": 1}
    windows, _ = _timed_windows(stream, config=config, pixels=np.ones(4), tick=lambda: None, gpu_before=None,
                                stages=lambda: next(handed))
    assert [w["stage_images"] for w in windows] == [4, 4]
    assert windows[1]["stage_cpu_seconds"]["decode"] == pytest.approx(0.004)   # 12 ms - 8 ms
    plain, _ = _timed_windows(iter([(None, np.array([0]))] * 2), config=config, pixels=np.ones(4),
                              tick=lambda: None, gpu_before=None)
    assert all("stage_images" not in w for w in plain)


def test_the_row_pools_each_stage_over_every_window():
    result = CandidateResult(Candidate("backend", "torchvision", 2))
    result.first_batch_s = [0.1]
    result.windows = [{"images": 100, "seconds": 1.0, "megapixels": 1.0, "cpu_seconds": 0.2, "stage_images": 100,
                       "stage_cpu_seconds": {"decode": 0.1, "finish": 0.01}},
                      {"images": 100, "seconds": 1.0, "megapixels": 1.0, "cpu_seconds": 0.2, "stage_images": 300,
                       "stage_cpu_seconds": {"decode": 0.1, "finish": 0.03}}]
    stages = result.summary()["stages_cpu_ms_per_image"]
    assert stages == {"decode": pytest.approx(0.5), "finish": pytest.approx(0.1)}   # 0.2 s and 40 ms over 400
    result.windows[1] = {k: v for k, v in result.windows[1].items() if not k.startswith("stage")}
    assert "stages_cpu_ms_per_image" not in result.summary()   # a split of some windows only is no split


def _rows() -> list[dict]:
    split = {"sample_python": 0.1, "decode": 0.6, "kernels": 0.3, "collate": 0.05, "transfer": 0.05, "finish": 0.1}
    return [{"kind": "ceiling", "name": "decode", "threads": 2, "cpu_ms_per_image": 0.81},
            {"kind": "backend", "name": "torchvision", "threads": 2, "cpu_ms_per_image": 1.5,
             "stages_cpu_ms_per_image": split, "vs_ceiling_pct": 60.0},
            {"kind": "backend", "name": "dali-cpu", "threads": 2, "cpu_ms_per_image": 1.2, "vs_torchvision": 1.25},
            {"kind": "backend", "name": "torchvision", "threads": 1, "cpu_ms_per_image": 1.4,
             "stages_cpu_ms_per_image": split}]


def test_the_bounds_are_the_cpu_per_image_over_the_stages_no_backend_can_skip():
    rows = _rows()
    bounds = stage_bounds(rows[1], rows)
    assert bounds["rest_ms"] == pytest.approx(0.3)                    # 1.5 - 1.2 in the stages
    assert bounds["ceiling_bound_pct"] == pytest.approx(90.0)         # 0.81 / (0.6 + 0.3)
    assert bounds["ahead_bound"] == pytest.approx(1.5)                # 1.5 / (0.6 + 0.3 + 0.1)
    assert bounds["ahead_measured"] == {"dali-cpu": 1.25}
    assert "ceiling_bound_pct" not in stage_bounds(rows[3], rows)     # no ceiling at 1 thread


def test_the_bounds_are_stated_only_where_the_loader_is_cpu_bound():
    two, one = stage_lines(_rows(), cores=2)
    assert "decode 0.60" in two and "the rest 0.30" in two
    assert "at most 90 % of the ceiling (measured: 60 %)" in two
    assert "at most 1.50× ahead of it here (measured: `dali-cpu` 1.25×)" in two
    assert "kernels 0.30" in one and "at most" not in one   # 1 worker on 2 cores: not CPU-bound
    assert all("at most" not in line for line in stage_lines(_rows(), cores=4))


def test_a_split_larger_than_the_process_cpu_says_the_windows_were_too_short():
    rows = _rows()
    rows[1]["cpu_ms_per_image"] = 1.05   # 1.2 ms in its stages: batches prefetched before the window
    line = stage_lines(rows, cores=2)[0]
    assert "the rest" not in line and "longer windows (--batches)" in line
    assert "at most" not in line   # no bound from a split that does not line up


def test_a_split_a_little_above_the_process_cpu_leaves_about_nothing_for_the_rest():
    rows = _rows()
    rows[1]["cpu_ms_per_image"] = 1.12   # 1.2 ms in its stages: within the two clocks' difference
    line = stage_lines(rows, cores=2)[0]
    assert "the rest 0.00" in line and "at most 1.20× ahead" in line   # the stages' 1.2 over the shared 1.0
