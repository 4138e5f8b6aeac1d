"""benchmarks/dataset_scale.py and its section of the benchmarks page: the goals' verdicts computed
from a results file, and (slow) a small run end to end. It checks that the script works and what
the page says of the figures, never the figures (under the test suite's load they say nothing)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO
from dali_bridge.bench.report import render_file
from dali_bridge.bench.scale_report import SCALE_FORMAT, scale_section

_MIB = 2**20


def _run(source: str, count: int, *, ready: float, per_sample: float, copied: float, state: int) -> dict:
    total = int(per_sample * count)
    memory = {"rss": 400 * _MIB, "pss": 180 * _MIB, "uss": 45 * _MIB}
    return {"source": source, "count": count, "samples": count, "load_average_1min": 1.5, "imports_s": 6.0,
            "list_s": ready / 2, "build_s": ready / 2, "first_batch_s": ready / 2, "ready_s": ready,
            "index_bytes": {"paths": total - 8 * count, "labels": 8 * count, "shards": 0, "total": total},
            "listing_private_growth": 2 * total,
            "workers_index_copy": [{"private_growth": int(copied * total)}, {"private_growth": 0}],
            "loader_workers_memory": [memory, memory], "state_dict_pickle_bytes": state,
            "state_dict_torch_save_bytes": state + 1300, "state_dict_s": 0.1}


def _report(runs: list[dict]) -> dict:
    return {"format": SCALE_FORMAT, "command": "benchmarks/dataset_scale.py", "run_s": 300, "workers": 2,
            "shard_size": 1000, "classes": 1000, "photos": "scikit-image's astronaut",
            "machine": {"cpu_model": "AMD EPYC", "cpu_cores_available": 2, "ram_gib": 23.5, "gpus": [],
                        "loadavg_at_start": [1.0, 1.0, 1.0], "loadavg_at_end": [2.0, 1.0, 1.0]}, "runs": runs}


def test_the_page_judges_each_goal_at_the_counts_it_is_set_for():
    page = "\n".join(scale_section(_report([
        # a small count's worker copy is a page or two of noise: judged at the largest count only
        _run("folder", 10_000, ready=4.0, per_sample=40, copied=0.5, state=272),
        _run("folder", 1_000_000, ready=9.5, per_sample=37, copied=0.01, state=274),
        _run("webdataset", 1_000_000, ready=40.0, per_sample=70, copied=0.02, state=274)])))
    assert "* 1,000,000 files listed and the first batch out in 9.50 s (goal ≤ 10 s): **met**" in page
    assert "* index bytes per sample, at most 70.0 (webdataset, 1,000,000; goal ≤ 64): **missed**" in page
    assert "at most 2.0% of it (webdataset, 1,000,000; goal ≤ 10%: shared, not one copy per worker): **met**" in page
    assert "* state dict pickled, 272–274 bytes at every count" in page and page.count("**met**") == 3
    assert "| folder | 1,000,000 | 4.75 | 4.75 + 4.75 = **9.50** | **37.0** (29/8/0) |" in page
    assert "AMD EPYC, 2 cores, 23.5 GiB RAM, no GPU; 1-minute load average 1.50–1.50" in page


def test_a_worker_copying_the_index_and_a_state_dict_growing_with_the_dataset_are_missed_goals():
    page = "\n".join(scale_section(_report([
        _run("folder", 10_000, ready=4.0, per_sample=40, copied=0.0, state=272),
        _run("folder", 100_000, ready=11.0, per_sample=40, copied=0.95, state=900)])))
    assert "100,000 files listed and the first batch out in 11.00 s (goal ≤ 10 s): **missed**" in page
    assert "at most 95.0% of it (folder, 100,000;" in page and "272–900 bytes" in page
    assert page.count("**missed**") == 3


@pytest.mark.slow
def test_a_small_run_of_the_benchmark_writes_a_file_bench_readme_renders(tmp_path):
    pytest.importorskip("skimage", reason="the benchmark's photos are scikit-image's (the test extra)")
    out = tmp_path / "dataset_scale.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "dataset_scale.py"), "--counts", "1000",
                           "--work-dir", str(tmp_path / "work"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"writes {out}" in done.stdout and not (tmp_path / "work").exists()   # cleaned up
    record = json.loads(out.read_text())
    assert [(r["source"], r["samples"]) for r in record["runs"]] == [("folder", 1000), ("webdataset", 1000)]
    for run in record["runs"]:
        assert run["ready_s"] > 0 and run["index_bytes"]["total"] > 0 and len(run["workers_index_copy"]) == 2
        assert run["state_dict"]["num_samples"] == 1000 and run["state_dict_pickle_bytes"] > 0
    page = render_file(out)
    assert page.startswith("## Cost as the dataset grows (dataset_scale.json)")
    assert "| folder | 1,000 |" in page and "| webdataset | 1,000 |" in page
