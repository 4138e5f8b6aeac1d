"""A smoke test of benchmarks/object_storage.py: its --quick mode runs end to end on loopback and
writes a results file that `python -m dali_bridge.bench readme` renders. It checks that the
script works, never its figures (taken here, under the test suite's load, they say nothing)."""
from __future__ import annotations

import json
import subprocess
import sys
import pytest

from conftest import REPO
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
