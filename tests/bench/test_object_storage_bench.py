"""A smoke test of benchmarks/object_storage.py: its --quick mode runs end to end on loopback and
writes a results file that `python -m dali_bridge.bench readme` renders; and the page's ratios and
goal verdicts computed from a results file. It checks that the script works, never its figures
(taken here, under the test suite's load, they say nothing)."""
from __future__ import annotations

import json
import subprocess
import sys
import pytest

from tests.helpers.nginx_fixtures import missing_reason
from tests.helpers.paths import REPO
from dali_bridge.bench.report import render_file


@pytest.mark.slow
def test_the_object_storage_benchmark_smoke_run_writes_a_file_bench_readme_renders(sample_root, tmp_path):
    pytest.importorskip("moto.server", reason="the benchmark needs moto[server] (the test extra)")
    pytest.importorskip("s3fs", reason="the benchmark needs s3fs: pip install 'dali-bridge[s3]'")
    out = tmp_path / "object_storage.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "object_storage.py"), "--quick",
                           "--parts", "epochs,ranged,listing", "--data", str(sample_root), "--out", str(out)],
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["quick"] is True and record["samples"] == 37
    servers = {"s3-moto", "http-python"} | (set() if missing_reason() else {"http-nginx"})
    assert {(r["mode"], r["access"], r["images"]) for r in record["epochs"]} == {
        (m, access, 37) for m in servers | {"local"} for access in ("ranged", "cached")}
    assert record["access"]["cached"]["shards"] == 4 and record["access"]["cached"]["window"] == 2
    assert all(r["loader_cpu_ms_per_image"] > 0 for r in record["epochs"])
    assert all(r["server_cpu_ms_per_image"] is not None for r in record["epochs"] if r["mode"] != "local")
    assert record["listing"][0]["samples"] == 16
    assert record["listing"][0]["warm_requests"] == {"GET": 1 + 1}   # one LIST page, the manifest
    done_reads = {(r["server"], r["client"]) for r in record["ranged_reads"] if "skipped" not in r}
    assert {("s3-moto", "the bridge's (s3fs signs, aiohttp GETs)"),
            ("http-python", "fsspec HTTP (the bridge's)")} <= done_reads
    page = render_file(out)
    assert page.startswith("## Shards in object storage (object_storage.json)")
    assert "A smoke run (`--quick`)" in page and "| 0 | torchvision | a GET per sample | S3 (moto) |" in page
    assert "| 0 | torchvision | whole shards, cached | S3 (moto) |" in page
    assert ("* S3 (moto), a GET per sample: loader CPU per image ÷ local shards', median over the delays and "
            "repeats") in page
    assert "* S3 (moto), whole shards, cached: loader CPU per image ÷ local shards'" in page
    assert "| 0 | 16 |" in page


def test_each_remote_row_is_divided_by_the_local_rows_beside_it_and_missed_goals_are_named():
    from dali_bridge.bench.storage_report import object_storage_section

    def run(latency: float, mode: str, rate: float, cpu: float) -> dict:
        return {"latency_ms": latency, "mode": mode, "backend": "torchvision", "images": 100, "images_per_s": rate,
                "loader_cpu_ms_per_image": cpu, "server_cpu_ms_per_image": None if mode == "local" else 0.1,
                "first_batch_s": 0.1, "peak_rss_mib": 1.0, "shard_downloads_per_epoch": None}

    report = {"command": "c", "pipeline": "p", "samples": 100, "batch_size": 8, "workers": 2, "max_requests": 4,
              "delay": "d", "machine": {"cpus": 2, "cpu": "x", "platform": "y", "load_average_1min_range": [1, 2]},
              "run_s": 60, "servers": {"http-nginx": {"skipped": "nginx is not installed"}},
              "ranged_reads": [], "listing": [],
              # the machine slows down over the run: local CPU/img 1.0, then 1.2, then 1.2
              "epochs": [run(0, "local", 1000, 1.0), run(0, "http-python", 800, 1.05),
                         run(0, "http-python", 900, 1.1), run(0, "local", 900, 1.2),
                         run(100, "http-python", 600, 1.32), run(100, "http-python", 700, 1.3),
                         run(0, "local", 900, 1.2)]}
    page = "\n".join(object_storage_section(report))
    # divided by the mean of the local rows just before and after: 1.1 ms/img, 950 img/s
    assert ("| 0 | torchvision | a GET per sample | HTTP (Python's server) | 800 | 84% | – | 1.05 | 0.95 | 0.10 | – |"
            in page)
    # 100 ms against the median at 0 ms (850 img/s); CPU against 1.2 ms/img
    assert ("| 100 | torchvision | a GET per sample | HTTP (Python's server) | 600 | 67% | 71% | 1.32 | 1.10 | 0.10 "
            "| – |" in page)
    assert ("* HTTP (Python's server), a GET per sample: loader CPU per image ÷ local shards', median over the "
            "delays and repeats torchvision 1.04 (0.95–1.10) (goal ≤ 1.10): **met**") in page
    # the repeats of 100 ms together: median 650 ÷ 850
    assert ("* HTTP (Python's server), a GET per sample: img/s with a delay ÷ at 0 ms (medians over the repeats), "
            "worst 76.5% (torchvision, 100 ms; goal ≥ 95%): **missed**") in page
    assert "local shards: img/s with a delay" not in page   # the local reference has no delay to hide
    report["epochs"][4]["loader_cpu_ms_per_image"] = report["epochs"][5]["loader_cpu_ms_per_image"] = 1.8
    # 0.95, 1.00, 1.50, 1.50: the median is 1.25
    assert "torchvision 1.25 (0.95–1.50) (goal ≤ 1.10): **missed**" in "\n".join(object_storage_section(report))
    assert "* HTTP (nginx): skipped — nginx is not installed" in page


def test_each_access_is_divided_by_the_local_shards_read_the_same_way():
    from dali_bridge.bench.storage_report import object_storage_section

    def run(latency: float, mode: str, access: str, rate: float, cpu: float) -> dict:
        return {"latency_ms": latency, "mode": mode, "backend": "dali-cpu", "access": access, "images": 100,
                "images_per_s": rate, "loader_cpu_ms_per_image": cpu,
                "server_cpu_ms_per_image": None if mode == "local" else 0.1, "first_batch_s": 0.1, "peak_rss_mib": 1.0}

    report = {"command": "c", "pipeline": "p", "samples": 100, "batch_size": 8, "workers": 2, "max_requests": 4,
              "delay": "d", "machine": {"cpus": 2, "cpu": "x", "platform": "y", "load_average_1min_range": [1, 2]},
              "run_s": 60, "servers": {}, "ranged_reads": [], "listing": [],
              "access": {"ranged": {"description": "a GET each"}, "cached": {"description": "whole shards"}},
              "measured_epochs": 3,
              # ranged: local 2.0 ms/img; cached: local (shard windows) 1.6 ms/img
              "epochs": [run(0, "local", "ranged", 900, 2.0), run(0, "local", "cached", 1000, 1.6),
                         run(0, "http-nginx", "ranged", 700, 2.5), run(0, "http-nginx", "cached", 1000, 1.68),
                         run(100, "http-nginx", "ranged", 600, 2.6), run(100, "http-nginx", "cached", 960, 1.7)]}
    page = "\n".join(object_storage_section(report))
    assert "* *whole shards, cached*: whole shards" in page
    assert "Each row is epochs 2–4, together, of a process of its own" in page
    assert "| 0 | dali-cpu | whole shards, cached | HTTP (nginx) | 1,000 | 100% | – | 1.68 | 1.05 | 0.10 |" in page
    # the median of the two delays' ratios is their mean
    assert ("* HTTP (nginx), whole shards, cached: loader CPU per image ÷ local shards', median over the delays "
            "and repeats dali-cpu 1.06 (1.05–1.06) (goal ≤ 1.10): **met**") in page
    assert ("* HTTP (nginx), a GET per sample: loader CPU per image ÷ local shards', median over the delays "
            "and repeats dali-cpu 1.27 (1.25–1.30) (goal ≤ 1.10): **missed**") in page
    assert ("* HTTP (nginx), whole shards, cached: img/s with a delay ÷ at 0 ms (medians over the repeats), worst "
            "96.0% (dali-cpu, 100 ms; goal ≥ 95%): **met**") in page
