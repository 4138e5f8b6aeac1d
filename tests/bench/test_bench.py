"""``dali-bridge bench`` mechanics on a tiny set: it runs every candidate, counts images and pixels
right, writes valid JSON and a PNG. Never a timed assertion: speeds are only checked to exist."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.backends import CPU_BACKENDS
from tests.helpers.paths import REPO, TRAIN
from dali_bridge.bench.baseline_transforms import torchvision_baseline_transform
from dali_bridge.bench.plot import plot_report
from dali_bridge.bench.procstats import tree_cpu_seconds, tree_memory_mib
from dali_bridge.bench.report import format_report, stability_warnings
from dali_bridge.bench.results import BenchError, BenchReport, Candidate, CandidateResult, SAMPLE_SET, add_ratios
from dali_bridge.bench.runner import data_overrides, run_candidate
from dali_bridge.bench import runner
from dali_bridge.cli.main import main
from dali_bridge.data.sources.images import probe
from dali_bridge.pipeline.sampling import rank_batches
from dali_bridge.data.sources.local import list_source
from dali_bridge.spec.pipeline import load_spec

BATCH = 8
WARMUP, BATCHES, REPEAT = 1, 2, 2


@pytest.fixture(scope="module")
def bench_run(sample_root: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One small bench through the CLI: both CPU backends, every CPU reference, 1 thread."""
    out = tmp_path_factory.mktemp("bench")
    json_path, png_path = out / "bench.json", out / "bench.png"
    baselines = ["ceiling"] + [b for b in ("torchvision", "dali-cpu") if b in CPU_BACKENDS]
    status = main(["bench", str(TRAIN), "--data", str(sample_root), "--set", f"batch_size={BATCH}",
                   "--backends", ",".join(CPU_BACKENDS), "--baselines", ",".join(baselines), "--threads", "1",
                   "--warmup", str(WARMUP), "--batches", str(BATCHES), "--repeat", str(REPEAT),
                   "--model-ms", "5", "--json", str(json_path), "--plot", str(png_path), "-q"])
    return {"status": status, "json": json_path, "png": png_path, "report": json.loads(json_path.read_text()),
            "baselines": baselines}


def _expected_window_samples(sample_root: Path) -> list[np.ndarray]:
    """The samples each timed window holds: the bridge's epoch-0 batches after the warm-up."""
    count = len(list_source(load_spec(TRAIN, {"source": {"type": "folder", "root": str(sample_root)}}).source))
    tasks = rank_batches(count, BATCH, seed=0, epoch=0)
    assert len(tasks) >= WARMUP + BATCHES * REPEAT  # the windows stay inside epoch 0
    windows = []
    for n in range(REPEAT):
        start = WARMUP + n * BATCHES
        windows.append(np.concatenate([t.indices for t in tasks[start:start + BATCHES]]))
    return windows


@pytest.mark.slow
def test_bench_runs_every_candidate_and_exits_zero(bench_run):
    rows = bench_run["report"]["results"]
    assert bench_run["status"] == 0
    assert [r.get("error") for r in rows] == [None] * len(rows)
    names = {(r["kind"], r["name"]) for r in rows}
    assert names == {("ceiling", "decode")} | {("baseline", b) for b in bench_run["baselines"] if b != "ceiling"} \
        | {("backend", b) for b in CPU_BACKENDS}
    assert all(r["threads"] == 1 and r["windows"] == REPEAT for r in rows)


@pytest.mark.slow
def test_every_candidate_counts_the_same_images_and_source_pixels(bench_run, sample_root):
    windows = _expected_window_samples(sample_root)
    listing = list_source(load_spec(TRAIN, {"source": {"type": "folder", "root": str(sample_root)}}).source)
    pixels = np.array([h * w for h, w in (probe(listing.read(i)) for i in range(len(listing)))])
    expected_images = sum(len(w) for w in windows)
    expected_megapixels = sum(int(pixels[w].sum()) for w in windows) / 1e6
    for row in bench_run["report"]["results"]:
        assert row["images"] == expected_images, row["candidate"]
        # the same samples (not just as many): their source pixel counts add up to the same sum
        assert row["megapixels"] == pytest.approx(expected_megapixels), row["candidate"]
    report = bench_run["report"]
    assert report["data"]["images"] == len(listing)
    assert report["data"]["mean_megapixels"] == pytest.approx(pixels.mean() / 1e6)


@pytest.mark.slow
def test_json_describes_machine_settings_and_positive_measurements(bench_run):
    report = bench_run["report"]
    assert report["format"] == "dali-bridge-bench/1"
    machine = report["machine"]
    for key in ("cpu_model", "cpu_cores_available", "ram_gib", "versions", "loadavg_at_start", "loadavg_at_end"):
        assert key in machine
    assert "torch" in machine["versions"] and "torchvision" in machine["versions"]
    settings = report["settings"]
    assert (settings["batch_size"], settings["warmup"], settings["batches"], settings["repeat"]) == \
        (BATCH, WARMUP, BATCHES, REPEAT)
    for row in report["results"]:
        assert 0 < row["images_per_s_min"] <= row["images_per_s"] <= row["images_per_s_max"]
        assert row["megapixels_per_s"] > 0 and row["cpu_ms_per_image"] > 0
        assert row["peak_rss_mib"] >= row["pss_mib"] > 10  # a Python process with torch is > 10 MiB
        assert row["first_batch_s"] > 0
        assert 0 <= row["data_wait_pct"] <= 100
    backends = [r for r in report["results"] if r["kind"] == "backend"]
    assert all("vs_ceiling_pct" in r for r in backends)
    assert {r["name"] for r in backends if "vs_baseline" in r} == \
        {b for b in CPU_BACKENDS if b in bench_run["baselines"]}


@pytest.mark.slow
def test_plot_is_a_png_of_the_default_size(bench_run):
    from PIL import Image

    with Image.open(bench_run["png"]) as image:
        assert image.format == "PNG"
        assert image.size == (1100, 560)
        assert len(image.getcolors(maxcolors=100_000)) > 5  # bars, text and lines were drawn


@pytest.mark.slow
def test_unavailable_gpu_baseline_fails_its_row_and_the_exit_status(sample_root, tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("the GPU baseline runs on this host")
    status = main(["bench", str(TRAIN), "--data", str(sample_root), "--set", f"batch_size={BATCH}",
                   "--backends", "none", "--baselines", "dali", "--threads", "1", "--warmup", "1",
                   "--batches", "1", "--repeat", "1", "--json", str(tmp_path / "out.json"), "-q"])
    assert status == 1
    rows = json.loads((tmp_path / "out.json").read_text())["results"]
    failed = [r for r in rows if "error" in r]
    assert [(r["kind"], r["name"]) for r in failed] == [("baseline", "dali")]
    assert "FAILED" in capsys.readouterr().out


def test_unknown_baseline_name_is_refused_with_the_choices():
    with pytest.raises(SystemExit, match="unknown baseline.*expected ceiling, torchvision"):
        main(["bench", str(TRAIN), "--baselines", "ceiling,tensorflow", "--data", "."])


def test_thread_list_must_be_positive_integers():
    with pytest.raises(SystemExit, match="--threads must be"):
        main(["bench", str(TRAIN), "--threads", "0,2", "--data", "."])


# ---- accounting helpers, no subprocess of the bench

def test_tree_cpu_seconds_counts_a_busy_child_process():
    before = tree_cpu_seconds()
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\n"
                              "time.sleep(5)"])
    try:
        deadline = time.monotonic() + 20
        while tree_cpu_seconds() - before < 0.35 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tree_cpu_seconds() - before >= 0.35  # the live child's own CPU time is in the tree
    finally:
        child.kill()
        child.wait()
    assert tree_cpu_seconds() - before >= 0.35      # and stays once it is reaped (cutime)


def test_tree_memory_includes_a_child_process():
    child = subprocess.Popen([sys.executable, "-c", "import sys\nblock = bytearray(200 * 2**20)\n"
                              "sys.stdout.write('ready\\n'); sys.stdout.flush()\nimport time; time.sleep(30)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        own_rss, _ = tree_memory_mib(child.pid)
        assert own_rss >= 200
        parent_rss, parent_pss = tree_memory_mib(os.getpid())
        assert parent_rss >= own_rss and parent_pss >= 200
    finally:
        child.kill()
        child.wait()


@pytest.mark.slow
def test_the_torchvision_backend_row_splits_its_cpu_by_stage(bench_run):
    from dali_bridge.backends.stages import STAGES

    for row in bench_run["report"]["results"]:
        split = row.get("stages_cpu_ms_per_image")
        if (row["kind"], row["name"]) != ("backend", "torchvision"):
            assert split is None, row["candidate"]
            continue
        assert set(split) == set(STAGES)
        assert split["decode"] > 0 and split["kernels"] > 0 and split["finish"] > 0


def test_ratios_are_against_the_same_thread_count():
    rows = [{"kind": "ceiling", "name": "decode", "threads": 1, "images_per_s": 400.0},
            {"kind": "ceiling", "name": "decode", "threads": 2, "images_per_s": 800.0},
            {"kind": "baseline", "name": "torchvision", "threads": 2, "images_per_s": 200.0},
            {"kind": "backend", "name": "torchvision", "threads": 2, "images_per_s": 300.0},
            {"kind": "backend", "name": "torchvision", "threads": 1, "images_per_s": 100.0},
            {"kind": "backend", "name": "dali-cpu", "threads": 1, "error": "boom"}]
    add_ratios(rows)
    assert rows[2]["vs_ceiling_pct"] == 25.0 and "vs_baseline" not in rows[2]
    assert rows[3]["vs_ceiling_pct"] == 37.5 and rows[3]["vs_baseline"] == 1.5
    assert rows[4]["vs_ceiling_pct"] == 25.0 and "vs_baseline" not in rows[4]  # no 1-thread baseline
    assert "vs_ceiling_pct" not in rows[0] and "vs_ceiling_pct" not in rows[5]


def test_another_backend_is_rated_against_the_torchvision_backend_at_the_same_thread_count():
    rows = [{"kind": "backend", "name": "torchvision", "threads": 2, "images_per_s": 400.0},
            {"kind": "backend", "name": "dali-cpu", "threads": 2, "images_per_s": 520.0},
            {"kind": "backend", "name": "dali-cpu", "threads": 1, "images_per_s": 300.0},
            {"kind": "baseline", "name": "dali-cpu", "threads": 2, "images_per_s": 500.0}]
    add_ratios(rows)
    assert rows[1]["vs_torchvision"] == 1.3
    assert "vs_torchvision" not in rows[0] and "vs_torchvision" not in rows[3]
    assert "vs_torchvision" not in rows[2]  # no torchvision run at 1 thread


def test_summary_takes_medians_and_pools_cpu_time():
    result = CandidateResult(Candidate("backend", "torchvision", 2))
    result.windows = [{"images": 100, "seconds": 1.0, "megapixels": 10.0, "cpu_seconds": 0.5},
                      {"images": 100, "seconds": 0.5, "megapixels": 10.0, "cpu_seconds": 0.3},
                      {"images": 100, "seconds": 0.25, "megapixels": 10.0, "cpu_seconds": 0.1}]
    result.first_batch_s = [1.5, 0.5, 1.0]
    result.loadavg = [(0.5, 1.0), (0.2, 3.0)]
    result.wait = [{"wait_s": 1.0, "model_s": 3.0, "batches": 4}]
    result.output = {"batch_size": 100}
    row = result.summary(model_ms=250.0)
    assert (row["images_per_s"], row["images_per_s_min"], row["images_per_s_max"]) == (200.0, 100.0, 400.0)
    assert row["spread_pct"] == 150.0
    assert row["megapixels_per_s"] == 20.0
    assert row["cpu_ms_per_image"] == pytest.approx(3.0)   # 0.9 s over 300 images
    assert row["first_batch_s"] == 1.0
    assert (row["load_before"], row["load_after"]) == (0.2, 3.0)
    assert row["data_wait_pct"] == 25.0
    assert row["data_wait_pct_from_throughput"] == pytest.approx(100 * (500 - 250) / 500)


def test_torchvision_baseline_transform_mirrors_the_train_pipeline():
    from torchvision.transforms import v2

    from dali_bridge.pipeline.plan import build_plan

    transform = torchvision_baseline_transform(build_plan(load_spec(TRAIN)))
    kinds = [type(t) for t in transform.transforms]
    assert kinds == [v2.RandomResizedCrop, v2.RandomHorizontalFlip, v2.ToDtype, v2.Normalize]
    crop = transform.transforms[0]
    assert list(crop.size) == [224, 224] and crop.scale == (0.08, 1.0) and crop.antialias is True
    assert transform.transforms[3].mean == [0.485, 0.456, 0.406]


def test_torchvision_baseline_does_the_recipes_erasing_and_batch_mixing_too():
    import torch
    from torchvision.transforms import v2

    from tests.helpers.paths import PIPELINES
    from dali_bridge.bench.baseline_transforms import torchvision_batch_transform
    from dali_bridge.pipeline.plan import build_plan

    plan = build_plan(load_spec(PIPELINES / "torchvision_recipe_train.yaml"))
    kinds = [type(t) for t in torchvision_baseline_transform(plan).transforms]
    assert kinds == [v2.RandomResizedCrop, v2.RandomHorizontalFlip, v2.TrivialAugmentWide, v2.ToDtype,
                     v2.Normalize, v2.RandomErasing]
    mix = torchvision_batch_transform(plan, num_classes=10)
    images, targets = mix(torch.rand(4, 3, 8, 8), torch.tensor([0, 1, 2, 3]))
    assert targets.shape == (4, 10) and torch.allclose(targets.sum(dim=1), torch.ones(4))
    assert torchvision_batch_transform(build_plan(load_spec(TRAIN)), num_classes=10) is None


def test_plot_draws_a_chart_without_a_ceiling_row(tmp_path):
    report = BenchReport(
        machine={"cpu_model": "test cpu", "cpu_cores_available": 2}, settings={"pipeline_name": "p"}, data={},
        rows=[{"candidate": "torchvision", "kind": "backend", "name": "torchvision", "threads": 1,
               "images_per_s": 120.0, "images_per_s_min": 100.0, "images_per_s_max": 130.0},
              {"candidate": "dali-cpu", "kind": "backend", "name": "dali-cpu", "threads": 1, "error": "x"}])
    plot_report(report, tmp_path / "p.png", width=600, height=300)
    from PIL import Image
    with Image.open(tmp_path / "p.png") as image:
        assert image.size == (600, 300)


def test_plot_refuses_a_report_where_everything_failed(tmp_path):
    report = BenchReport(machine={}, settings={"pipeline_name": "p"}, data={},
                               rows=[{"candidate": "x", "kind": "backend", "name": "x", "threads": 1, "error": "e"}])
    with pytest.raises(BenchError, match="every candidate failed"):
        plot_report(report, tmp_path / "p.png")


@pytest.mark.slow
def test_a_silent_candidate_is_killed_and_reported(tmp_path, monkeypatch):
    """A candidate that yields no batch (here: its pipeline file is a FIFO nobody writes, as on a
    hung file system) is killed with its process group after the stall limit, and reported."""
    monkeypatch.setattr(runner, "STALL_SECONDS", 3.0)
    fifo = tmp_path / "pipeline.yaml"
    os.mkfifo(fifo)
    pixels = tmp_path / "pixels.npy"
    np.save(pixels, np.zeros(1, dtype=np.int64))
    result = CandidateResult(Candidate("ceiling", "decode", 1))
    base = {"file": str(fifo), "overrides": {}, "pixels": str(pixels), "batches": 1, "warmup": 1, "repeat": 1,
            "model_ms": None}
    started = time.monotonic()
    run_candidate(result.candidate, base, lambda: None, result)
    assert result.error.startswith("no batch for 3 s: killed")
    assert time.monotonic() - started < 60
    assert result.windows == []


# ---- where the bench reads its images

@pytest.mark.slow
def test_bench_reads_the_pipelines_own_source_by_default(sample_root, tmp_path, monkeypatch):
    """Without --data the bench measures the pipeline's source, as every other command does, and
    generates nothing in the current folder."""
    monkeypatch.chdir(tmp_path)
    json_path = tmp_path / "out.json"
    status = main(["bench", str(TRAIN), "--set", f"source.root={sample_root}", "--set", f"batch_size={BATCH}",
                   "--backends", "none", "--baselines", "ceiling", "--threads", "1", "--warmup", "1",
                   "--batches", "1", "--repeat", "1", "--json", str(json_path), "-q"])
    assert status == 0
    report = json.loads(json_path.read_text())
    assert Path(report["data"]["root"]) == sample_root.resolve()
    assert "source" not in report["settings"]["overrides"]
    assert list(tmp_path.iterdir()) == [json_path]  # no sample set made here


def test_data_option_keeps_the_source_reads_a_folder_or_makes_the_sample_set(tmp_path, monkeypatch):
    made = []
    monkeypatch.setattr("dali_bridge.data.sources.synthetic.ensure_sample_data",
                        lambda root, **kwargs: made.append((root, kwargs)))
    monkeypatch.setenv("DALI_BRIDGE_SAMPLES", str(tmp_path / "generated"))
    assert data_overrides(None) == {} and data_overrides("source") == {}
    assert made == []
    folder = data_overrides(str(tmp_path / "images"))
    assert folder == {"source": {"type": "folder", "root": str((tmp_path / "images").resolve())}}
    assert made == []
    sample = data_overrides("sample")
    assert sample == {"source": {"type": "folder", "root": str((tmp_path / "generated").resolve())}}
    assert made == [(tmp_path / "generated", SAMPLE_SET)]


# ---- warnings about unstable figures (made-up rows, no timing)

def _row(name: str, rate: float, spread_pct: float, windows: int = 4, **extra) -> dict:
    return {"candidate": name, "kind": "backend", "name": name, "threads": 2, "images_per_s": rate,
            "images_per_s_min": rate, "images_per_s_max": rate, "spread_pct": spread_pct, "windows": windows, **extra}


def test_a_stable_run_gets_no_warning():
    settings = {"batch_size": 64, "batches": 8}
    assert stability_warnings(settings, [_row("torchvision", 900.0, 12.0), _row("dali-cpu", 850.0, 25.0)]) == []


def test_short_windows_are_warned_about_with_the_batches_that_fix_them():
    warnings = stability_warnings({"batch_size": 64, "batches": 2}, [_row("torchvision", 900.0, 5.0)])
    assert len(warnings) == 1
    assert "holds 128 images (2 batches of 64)" in warnings[0]
    assert "--batches 4 or more" in warnings[0]


def test_few_windows_are_warned_about_with_repeat_and_rounds():
    warnings = stability_warnings({"batch_size": 64, "batches": 8}, [_row("torchvision", 900.0, 0.0, windows=1)])
    assert len(warnings) == 1 and "--repeat 3" in warnings[0] and "--rounds 2" in warnings[0]


def test_a_large_spread_names_the_candidates_the_load_and_the_flags():
    rows = [_row("torchvision", 900.0, 45.0, load_before=1.2, load_after=3.4), _row("dali-cpu", 850.0, 10.0),
            {"candidate": "dali", "kind": "backend", "name": "dali", "threads": 2, "error": "no GPU"}]
    warnings = stability_warnings({"batch_size": 64, "batches": 8}, rows, {"cpu_cores_available": 2})
    assert len(warnings) == 1
    text = warnings[0]
    assert "torchvision x2 (45 %)" in text and "dali-cpu" not in text
    assert "1.20-3.40 on 2 cores" in text
    assert "--repeat 4 --rounds 3" in text and "--batches 16" in text


def test_the_printed_report_ends_with_the_warnings():
    report = BenchReport(
        machine={"cpu_model": "test cpu", "cpu_cores_available": 2, "ram_gib": 4.0, "gpus": [],
                 "loadavg_at_start": [1.0], "loadavg_at_end": [1.0]},
        settings={"pipeline_name": "p", "batch_size": 8, "batches": 2, "repeat": 1, "rounds": 1},
        data={"images": 16, "mean_megapixels": 0.1}, rows=[_row("torchvision", 3000.0, 80.0, windows=1)])
    lines = format_report(report).splitlines()
    warnings = [line for line in lines if line.startswith("warning: ")]
    assert len(warnings) == 3 and lines[-3:] == warnings


# ---- the benchmarks page, from the recorded JSON

RESULTS = REPO / "benchmarks" / "results"


def test_benchmarks_readme_is_the_one_the_recorded_json_gives():
    from dali_bridge.bench.report import render_readme

    page = RESULTS.parent / "README.md"
    assert page.read_text() == render_readme(sorted(RESULTS.glob("*.json")), out_dir=page.parent), \
        "benchmarks/README.md is stale: run python -m dali_bridge.bench readme benchmarks/results/*.json " \
        "--out benchmarks/README.md"


def test_every_bench_figure_names_its_command_and_machine():
    from dali_bridge.bench.report import render_file

    section = render_file(RESULTS / "bench_train.json", out_dir=RESULTS.parent)
    assert "`dali-bridge bench pipelines/imagenet_train.yaml --data data/sample --backends dali-cpu,torchvision " \
           "--baselines ceiling,torchvision,torchvision-pil,dali-cpu,spdl,spdl-torchvision --threads 1,2 --warmup 3 " \
           "--batches 8 " \
           "--repeat 3 --rounds 2 --model-ms 25`" in section
    assert "AMD EPYC, 2 cores, 23.5 GiB RAM, no GPU" in section
    assert "![images/s per candidate and thread count](results/bench_train.png)" in section


def test_add_run_replaces_its_own_label_and_keeps_the_others(tmp_path):
    from dali_bridge.bench.report import add_run, load_runs

    runs = tmp_path / "runs.json"
    add_run(runs, label="long", report={"n": 1}, title="t")
    add_run(runs, label="short", report={"n": 2})
    add_run(runs, label="short", report={"n": 3}, environment={"X": "1"})
    title, recorded = load_runs(runs)
    assert title == "t"
    assert [(r["label"], r["report"], r["environment"]) for r in recorded] == \
        [("long", {"n": 1}, {}), ("short", {"n": 3}, {"X": "1"})]


def test_add_run_refuses_to_write_into_a_single_report(tmp_path):
    from dali_bridge.bench.report import add_run

    single = tmp_path / "bench.json"
    single.write_text(json.dumps({"format": "dali-bridge-bench/1"}))
    with pytest.raises(BenchError, match="not a runs file"):
        add_run(single, label="x", report={})
