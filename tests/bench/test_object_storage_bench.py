"""A smoke test of benchmarks/object_storage.py: its --quick mode runs end to end on loopback and
writes a results file that `python -m dali_bridge.bench readme` renders. It checks that the
script works, never its figures (taken here, under the test suite's load, they say nothing)."""
from __future__ import annotations

import json
import subprocess
import sys
import pytest

from tests.helpers.paths import REPO
from dali_bridge.bench.report import render_file


@pytest.mark.slow
def test_the_object_storage_benchmark_smoke_run_writes_a_file_bench_readme_renders(sample_root, tmp_path):
    pytest.importorskip("moto.server", reason="the benchmark needs moto[server] (the test extra)")
    pytest.importorskip("s3fs", reason="the benchmark needs s3fs: pip install 'dali-bridge[s3]'")
    out = tmp_path / "object_storage.json"
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "object_storage.py"), "--quick",
                           "--data", str(sample_root), "--out", str(out)], capture_output=True, text=True,
                          timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["quick"] is True and record["samples"] == 37
    assert {(r["mode"], r["images"]) for r in record["epochs"]} == {("local", 37), ("ranged", 37), ("ranged-http", 37),
                                                                     ("cache", 37)}
    assert record["listing"][0]["samples"] == 16
    assert record["listing"][0]["warm_requests"] == {"GET": 1 + 1}   # one LIST page, the manifest
    targets = {(r["target"], r["client"]) for r in record["ranged_reads"] if "skipped" not in r}
    assert {("moto", "the bridge's (s3fs signs, aiohttp GETs)"),
            ("HTTP server", "fsspec HTTP (the bridge's)")} <= targets
    assert all(r["cpu_s_per_1000"] > 0 for r in record["ranged_reads"] if "skipped" not in r)
    page = render_file(out)
    assert page.startswith("## Shards in object storage (object_storage.json)")
    assert "A smoke run (`--quick`)" in page and "| 0 | torchvision | ranged |" in page
    assert "the bridge's (s3fs signs, aiohttp GETs)" in page and "| 0 | 16 |" in page


def test_the_ceiling_with_the_servers_on_the_cores_adds_each_gets_cpu_to_an_images_local_cost():
    from dali_bridge.bench.storage_report import object_storage_section, served_ceiling

    bridge, other = "the bridge's (s3fs signs, aiohttp GETs)", "s3fs calls (aiobotocore per GET)"
    rates = {"ranges": 100, "max_requests": 4, "ranges_per_s": 50.0, "mib_per_s": 1.0}
    report = {"machine": {"cpus": 2}, "ranged_reads": [
        {**rates, "latency_ms": 20.0, "target": "moto via the proxy", "client": other, "cpu_s_per_1000": 9.0},
        {**rates, "latency_ms": 0.0, "target": "moto via the proxy", "client": bridge, "cpu_s_per_1000": 9.0},
        {**rates, "latency_ms": 20.0, "target": "moto via the proxy", "client": bridge, "cpu_s_per_1000": 0.5,
         "moto_cpu_s_per_1000": 2.0, "proxy_and_http_cpu_s_per_1000": 0.5}]}
    ranged = {"latency_ms": 20.0, "mode": "ranged", "backend": "dali-cpu", "images_per_s": 250.0}
    # 2 cores at 1,000 img/s locally: 2 ms an image, plus 3 ms of GET: 2 / 0.005 s.
    assert served_ceiling(report, ranged, 1000.0) == pytest.approx(400.0)
    assert served_ceiling(report, {**ranged, "mode": "cache"}, 1000.0) is None
    assert served_ceiling(report, {**ranged, "latency_ms": 5.0}, 1000.0) is None   # no row at that latency
    page = "\n".join(object_storage_section({
        **report, "command": "c", "pipeline": "p", "batch_size": 8, "max_requests": 4, "listing": [],
        "epochs": [{**ranged, "mode": "local", "images_per_s": 1000.0, "first_batch_s": 0.1, "peak_rss_mib": 1.0},
                   {**ranged, "first_batch_s": 0.5, "peak_rss_mib": 1.0}]}))
    assert "| 20 | dali-cpu | ranged | 250 | 25% | 400 | 62% |" in page
