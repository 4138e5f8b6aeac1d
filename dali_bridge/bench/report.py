"""What a bench run says to a reader: the plain-text table ``dali-bridge bench`` prints, the
warnings about figures too unstable to trust, and the markdown of ``benchmarks/README.md``.

Everything here reads the recorded JSON (:meth:`BenchReport.as_dict`), never re-measures.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from .results import BenchError, BenchReport
from .ray_report import RAY_EXECUTOR_FORMAT, ray_executor_section
from .scale_report import SCALE_FORMAT, scale_section
from .ssl_report import SSL_VIEWS_FORMAT, ssl_views_section
from .stage_report import stage_lines
from .storage_report import OBJECT_STORAGE_FORMAT, object_storage_section

TABLE_COLUMNS = [("candidate", "candidate"), ("threads", "threads"), ("images_per_s", "img/s"),
                 ("spread_pct", "spread %"), ("megapixels_per_s", "MP/s"), ("cpu_ms_per_image", "CPU ms/img"),
                 ("peak_rss_mib", "peak RSS MiB"), ("pss_mib", "PSS MiB"),
                 ("first_batch_s", "first batch s"), ("vs_ceiling_pct", "% of ceiling"),
                 ("vs_baseline", "x hand-written")]

# A timed window shorter than this is dominated by the batches prefetched before it opened and by
# start-up: its img/s (and the ratios built on it) can be off by several times.
MIN_WINDOW_IMAGES = 256
# More spread than this between a candidate's windows (all rounds pooled), as (max - min) / median.
MAX_SPREAD_PCT = 25.0
MIN_WINDOWS = 3


def table_columns(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The table's columns; GPU memory and data-wait columns only where some row has them."""
    columns = list(TABLE_COLUMNS)
    if any(r.get("gpu_mib") is not None for r in rows):
        columns.append(("gpu_mib", "GPU MiB"))
    if any("data_wait_pct" in r for r in rows):
        columns.append(("data_wait_pct", "data wait %"))
    return columns


def format_report(report: BenchReport) -> str:
    """The plain-text table printed at the end of ``bench``: the machine, the rows, the errors,
    then any warning that the figures are not stable (:func:`stability_warnings`)."""
    from .timing import format_table

    m = report.machine
    lines = [f"{report.settings['pipeline_name']} on {m['cpu_model']} ({m['cpu_cores_available']} cores, "
             f"{m['ram_gib']} GiB RAM{', ' + ', '.join(m['gpus']) if m['gpus'] else ''}); "
             f"{report.data['images']} images, mean {report.data['mean_megapixels']:.3f} MP; batch "
             f"{report.settings['batch_size']}, {report.settings['repeat'] * report.settings['rounds']} windows x "
             f"{report.settings['batches']} batches; 1-min load average {_first(m['loadavg_at_start'])} at start, "
             f"{_first(m['loadavg_at_end'])} at end"]
    good = [r for r in report.rows if "error" not in r]
    rows = [{**r, "threads": str(r["threads"])} for r in good]
    lines += views_lines(good)
    lines.append(format_table(rows, table_columns(good)))
    if report.settings.get("model_ms"):
        lines.append(f"data wait %: share of step time the consumer waited for data with a "
                     f"{report.settings['model_ms']:g} ms model step per batch ({report.settings['model_ms_method']})")
    lines += [f"reference {line}" for line in reference_lines(good)]
    lines += stage_lines(good, m.get("cpu_cores_available"))
    for row in report.rows:
        if "error" in row:
            lines.append(f"{row['candidate']} x{row['threads']}: FAILED: {row['error']}")
    lines += [f"warning: {text}" for text in stability_warnings(report.settings, report.rows, report.machine)]
    return "\n".join(lines)


def views_lines(rows: list[dict[str, Any]]) -> list[str]:
    """For a pipeline with views: how many views each sample gives, their shapes, and that img/s
    counts samples (one sample, every view of it); empty for one image per sample."""
    with_views = [r for r in rows if r.get("views")]
    if not with_views:
        return []
    shapes = [" x ".join(str(n) for n in shape[1:]) for shape in with_views[0]["view_shapes"]]
    counted = ", ".join(f"{shapes.count(s)} of {s}" for s in dict.fromkeys(shapes))
    return [f"{with_views[0]['views']} views per sample ({counted}); img/s and CPU ms/img count samples, "
            f"each with all its views"]


def reference_lines(rows: list[dict[str, Any]]) -> list[str]:
    """``candidate × threads: what it is`` for each reference row that recorded its description."""
    return [f"{r['candidate']} × {r['threads']}: {r['description']}" for r in rows if r.get("description")]


def _first(values: list[float]) -> str:
    return f"{values[0]:.2f}" if values else "n/a"


def stability_warnings(settings: dict[str, Any], rows: list[dict[str, Any]],
                       machine: dict[str, Any] | None = None) -> list[str]:
    """Why the figures of a run may not be worth comparing, each with the flags that fix it:
    windows holding too few images, too few windows to judge the spread, or a large spread
    between a candidate's windows and rounds. Empty when the run looks stable."""
    measured = [r for r in rows if "images_per_s" in r]
    if not measured:
        return []
    warnings = []
    batch_size, batches = settings["batch_size"], settings["batches"]
    window_images = batch_size * batches
    if window_images < MIN_WINDOW_IMAGES:
        needed = math.ceil(MIN_WINDOW_IMAGES / batch_size)
        warnings.append(
            f"each timed window holds {window_images} images ({batches} batches of {batch_size}): too few for a "
            f"stable figure, as batches prefetched before a window opens and start-up weigh on it, so img/s, "
            f"'% of ceiling' and 'x hand-written' can be far off. Use --batches {needed} or more "
            f"(windows of at least {MIN_WINDOW_IMAGES} images).")
    windows = min(r.get("windows", 0) for r in measured)
    if windows < MIN_WINDOWS:
        warnings.append(f"{windows} timed window(s) per candidate cannot show how much the figures vary: use "
                        f"--repeat {MIN_WINDOWS} or more, and --rounds 2 or more for fresh processes.")
    spread = [r for r in measured if r.get("spread_pct", 0.0) > MAX_SPREAD_PCT]
    if spread:
        listed = ", ".join(f"{r['candidate']} x{r['threads']} ({r['spread_pct']:.0f} %)" for r in spread)
        warnings.append(
            f"img/s varies by more than {MAX_SPREAD_PCT:.0f} % between windows for {listed}"
            f"{_load_note(rows, machine)}. "
            f"For a stable figure: more windows in fresh processes (--repeat 4 --rounds 3), longer windows "
            f"(--batches {max(2 * batches, math.ceil(MIN_WINDOW_IMAGES / batch_size))}) and a quiet machine; "
            f"compare candidates within one run, and prefer CPU ms/img, which varies less.")
    return warnings


def _load_note(rows: list[dict[str, Any]], machine: dict[str, Any] | None) -> str:
    loads = [r for r in rows if "load_after" in r]
    if not loads:
        return ""
    cores = (machine or {}).get("cpu_cores_available")
    on = f" on {cores} cores" if cores else ""
    return (f"; the 1-minute load average was {min(r['load_before'] for r in loads):.2f}-"
            f"{max(r['load_after'] for r in loads):.2f}{on} during the run")


# ---------------------------------------------------------------------------------------------
# Markdown for benchmarks/README.md, from recorded JSON

RUNS_FORMAT = "dali-bridge-runs/1"   # a file holding several runs of one benchmark, each labelled


def load_runs(path: str | Path) -> tuple[str | None, list[dict[str, Any]]]:
    """(title, runs) of a results file: a runs file as recorded by :func:`add_run`, or one bench
    report (``--json`` of ``dali-bridge bench``) as a single unlabelled run."""
    data = json.loads(Path(path).read_text())
    if data.get("format") == RUNS_FORMAT:
        return data.get("title"), data["runs"]
    return None, [{"label": None, "command": None, "environment": {}, "report": data}]


def add_run(path: str | Path, *, label: str, report: dict[str, Any], title: str | None = None,
            command: str | None = None, environment: dict[str, str] | None = None) -> None:
    """Record ``report`` in the runs file ``path`` under ``label``, replacing a run of that label
    and keeping the others (so a script re-run refreshes its own figures, not the longer runs)."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.is_file() else {"format": RUNS_FORMAT, "runs": []}
    if data.get("format") != RUNS_FORMAT:
        raise BenchError(f"{path}: not a runs file (format {data.get('format')!r}, expected {RUNS_FORMAT})")
    if title:
        data["title"] = title
    run = {"label": label, "command": command, "environment": dict(environment or {}), "report": report}
    data["runs"] = [r for r in data["runs"] if r["label"] != label] + [run]
    path.write_text(json.dumps(data, indent=1) + "\n")


def _num(value: Any, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _shown_path(path: str) -> str:
    """A recorded absolute path as a command in the repository would write it."""
    parts = Path(path).parts
    for anchor in ("data", "pipelines", "benchmarks"):
        if anchor in parts:
            return str(Path(*parts[len(parts) - parts[::-1].index(anchor) - 1:]))
    return path


def bench_command(report: dict[str, Any], environment: dict[str, str] | None = None) -> str:
    """The ``dali-bridge bench`` command line that made ``report``, from its recorded settings."""
    s = report["settings"]
    overrides = dict(s.get("overrides") or {})
    words = [f"{k}={v}" for k, v in (environment or {}).items()] + ["dali-bridge", "bench", _shown_path(s["pipeline"])]
    source = overrides.pop("source", None)
    if source and source.get("type") == "folder":
        words += ["--data", _shown_path(source["root"])]
    elif source:
        words += ["--set", f"source={json.dumps(source)}"]
    words += ["--backends", ",".join(s["backends"]) or "none", "--baselines", ",".join(s["baselines"]) or "none",
              "--threads", ",".join(str(t) for t in s["threads"]), "--warmup", str(s["warmup"]),
              "--batches", str(s["batches"]), "--repeat", str(s["repeat"]), "--rounds", str(s["rounds"])]
    if s.get("model_ms"):
        words += ["--model-ms", f"{s['model_ms']:g}"]
    for key, value in overrides.items():
        words += ["--set", f"{key}={value}"]
    return " ".join(words)


def machine_line(report: dict[str, Any]) -> str:
    """The machine, libraries, data and settings of a bench report, in one paragraph."""
    m, s, d = report["machine"], report["settings"], report["data"]
    gpus = ", ".join(m.get("gpus") or []) or "no GPU"
    versions = m.get("versions", {})
    loads = [r for r in report["results"] if "load_before" in r]
    load = (f"{min(r['load_before'] for r in loads):.2f}–{max(r['load_after'] for r in loads):.2f}"
            if loads else "n/a")
    return (f"{m['cpu_model']}, {m['cpu_cores_available']} cores, {m['ram_gib']} GiB RAM, {gpus}; "
            f"torch {versions.get('torch')}, torchvision {versions.get('torchvision')}, "
            f"DALI {versions.get('nvidia.dali')}. `{s['pipeline']}` on {d['images']:,} images "
            f"(mean {d['mean_megapixels']:.3f} MP), batch {s['batch_size']}; median of "
            f"{s['repeat'] * s['rounds']} windows × {s['batches']} batches after {s['warmup']} warm-up batches "
            f"({s['rounds']} fresh process(es) per candidate). 1-minute load average during the run: {load}.")


def bench_table(report: dict[str, Any]) -> str:
    """Every candidate of a bench report as a markdown table (failures listed after it)."""
    rows = [r for r in report["results"] if "images_per_s" in r]
    model_ms = report["settings"].get("model_ms")
    gpu = any(r.get("gpu_mib") is not None for r in rows)
    header = ["candidate", "threads", "img/s (min–max)", "MP/s", "CPU ms/img", "PSS (peak RSS) MiB",
              "first batch s", "% of ceiling", "× hand-written"]
    header += ["GPU MiB"] if gpu else []
    header += [f"data wait % @ {model_ms:g} ms/step"] if model_ms else []
    alignment = "|".join("---" if i == 0 else "--:" for i in range(len(header)))
    lines = ["| " + " | ".join(header) + " |", f"|{alignment}|"]
    for r in rows:
        cells = [r["candidate"] if r["kind"] != "backend" else f"**{r['candidate']}**", str(r["threads"]),
                 f"{_num(r['images_per_s'])} ({_num(r['images_per_s_min'])}–{_num(r['images_per_s_max'])})",
                 _num(r["megapixels_per_s"], 1), _num(r["cpu_ms_per_image"], 2),
                 f"{_num(r['pss_mib'])} ({_num(r['peak_rss_mib'])})", _num(r["first_batch_s"], 2),
                 _num(r.get("vs_ceiling_pct")), _num(r.get("vs_baseline"), 2)]
        cells += [_num(r.get("gpu_mib"))] if gpu else []
        cells += [_num(r.get("data_wait_pct"))] if model_ms else []
        lines.append("| " + " | ".join(cells) + " |")
    described = reference_lines(rows)
    lines += ["", "What each reference is, as it ran:", "", *[f"* {line}" for line in described]] if described else []
    for r in report["results"]:
        if "error" in r:
            lines.append(f"\n{r['candidate']} × {r['threads']} failed: {r['error'].splitlines()[0]}")
    return "\n".join(lines)


def targets(report: dict[str, Any]) -> str | None:
    """The project's performance targets checked against a train-pipeline run; None when the run
    lacks the candidates they compare."""
    rows = [r for r in report["results"] if "images_per_s" in r]

    def best(kind: str, names: tuple[str, ...]) -> dict[str, Any] | None:
        found = [r for r in rows if r["kind"] == kind and r["name"] in names]
        return max(found, key=lambda r: r["images_per_s"]) if found else None

    tv_base = best("baseline", ("torchvision", "torchvision-pil"))
    dali_cpu, tv = best("backend", ("dali-cpu",)), best("backend", ("torchvision",))
    ceilings = [r for r in rows if r["kind"] == "ceiling"]
    lines = ["| target | measured | met |", "|---|--:|:-:|"]

    def add(text: str, value: float, goal: float, unit: str = "×") -> None:
        shown = f"{value:.2f}×" if unit == "×" else f"{value:.0f} %"
        lines.append(f"| {text} | {shown} | {'yes' if value >= goal else '**no**'} |")

    if tv_base:  # the ratios to the hand-written torchvision loader
        base_text = f"{tv_base['candidate']} at {tv_base['threads']} worker(s), {tv_base['images_per_s']:,.0f} img/s"
        if dali_cpu:
            add(f"`dali-cpu` (best, {dali_cpu['threads']} threads) ≥ 1.5 × best hand-written torchvision ({base_text})",
                dali_cpu["images_per_s"] / tv_base["images_per_s"], 1.5)
        if tv:
            add(f"`torchvision` (best, {tv['threads']} workers) ≥ 1.0 × best hand-written torchvision ({base_text})",
                tv["images_per_s"] / tv_base["images_per_s"], 1.0)
    for r in rows:
        if r["kind"] == "backend" and "vs_baseline" in r:
            overhead = 100.0 * (1.0 - r["vs_baseline"])
            lines.append(f"| `{r['name']}` overhead over hand-written {r['name']} at {r['threads']} thread(s) ≤ 5 % | "
                         f"{overhead:.0f} % | {'yes' if overhead <= 5.0 else '**no**'} |")
    backends = [r for r in rows if r["kind"] == "backend"]
    if ceilings and backends and tv_base:  # the full run (every backend), not a single-comparison one
        ceiling = max(ceilings, key=lambda r: r["threads"])
        top = max(backends, key=lambda r: r["images_per_s"])
        add(f"best backend (`{top['name']}`, {top['threads']} threads) ≥ 50 % of the decode-only ceiling at "
            f"{ceiling['threads']} threads ({ceiling['images_per_s']:,.0f} img/s)",
            100.0 * top["images_per_s"] / ceiling["images_per_s"], 50.0, unit="%")
    return "\n".join(lines) if len(lines) > 2 else None


def _bench_section(report: dict[str, Any], *, command: str, plot: str | None) -> list[str]:
    views = views_lines([r for r in report["results"] if "error" not in r])
    parts = [f"`{command}`", "", machine_line(report), ""] + ([*views, ""] if views else [])
    parts += [f"![images/s per candidate and thread count]({plot})", ""] if plot else []
    parts += [bench_table(report)]
    split = stage_lines(report["results"], report["machine"].get("cpu_cores_available"))
    parts += ["", "Where the CPU goes:", "", *[f"* {line}" for line in split]] if split else []
    if report["settings"].get("model_ms"):
        parts += ["", f"*data wait %*: share of each step the training loop spends waiting for the next batch "
                      f"when the model takes {report['settings']['model_ms']:g} ms per batch (measured: the consumer "
                      f"sleeps that long after each batch while the loader keeps working)."]
    warnings = stability_warnings(report["settings"], report["results"], report["machine"])
    parts += ["", *[f"> {text}" for text in warnings]] if warnings else []
    checked = targets(report) if "train" in report["settings"]["pipeline_name"] else None
    return parts + (["", "Targets:", "", checked] if checked else [])


def _vs_torchvision(row: dict[str, Any], report: dict[str, Any]) -> float | None:
    """A backend row's images/s over the ``torchvision`` backend's in the same run and thread count:
    recorded (``vs_torchvision``), or worked out from the rows of a run recorded before it was."""
    if "vs_torchvision" in row or row.get("kind") != "backend" or row.get("name") == "torchvision":
        return row.get("vs_torchvision")
    fallback = next((r for r in report["results"] if r.get("kind") == "backend" and r.get("name") == "torchvision"
                     and r.get("threads") == row.get("threads") and "images_per_s" in r), None)
    return row["images_per_s"] / fallback["images_per_s"] if fallback else None


def _runs_table(runs: list[dict[str, Any]]) -> list[str]:
    """Several bench runs of a few candidates each, in one table, then each run's command and machine."""
    lines = ["| run | candidate | threads | img/s (min–max) | CPU ms/img | % of ceiling | × hand-written "
             "| × torchvision | windows |", "|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    notes = []
    for run in runs:
        report = run["report"]
        for r in (r for r in report["results"] if "images_per_s" in r):
            lines.append(f"| {run['label']} | {r['candidate']} | {r['threads']} | {_num(r['images_per_s'])} "
                         f"({_num(r['images_per_s_min'])}–{_num(r['images_per_s_max'])}) | "
                         f"{_num(r['cpu_ms_per_image'], 2)} | {_num(r.get('vs_ceiling_pct'))} | "
                         f"{_num(r.get('vs_baseline'), 2)} | "
                         f"{_num(_vs_torchvision(r, report), 2)} | {r['windows']} |")
        notes += [f"* **{run['label']}**: `{run.get('command') or bench_command(report, run.get('environment'))}` — "
                  f"{machine_line(report)}"]
        notes += [f"  {line}" for line in stage_lines(report["results"], report["machine"].get("cpu_cores_available"))]
    return lines + [""] + notes


def _compare_section(run: dict[str, Any]) -> list[str]:
    result = run["report"]
    lines = [f"`{run['command']}`" if run.get("command") else "", "",
             f"`{result['pipeline']}`, {' vs '.join(result['backends'])}, {result['samples']:,} samples in "
             f"{result['batches']} batches: **{'PASS' if result['passed'] else 'FAIL'}**", "",
             "| output | max \\|Δ\\| | mean \\|Δ\\| | bound | mismatches |", "|---|--:|--:|---|--:|"]
    for out in result["outputs"]:
        lines.append(f"| {out['name']} | {out['max_abs']:.3g} | {out['mean_abs']:.3g} | {out['limit']} | "
                     f"{out['mismatches']} |")
    return lines


def _soak_section(runs: list[dict[str, Any]]) -> list[str]:
    lines = ["| run | backend | epochs | RSS first → last MiB | RSS slope, last half (MiB/epoch) | "
             "open files | threads | img/s (median) |", "|---|---|--:|--:|--:|--:|--:|--:|"]
    notes = []
    for run in runs:
        soak = run["report"]
        for result in soak["results"]:
            s = result["summary"]
            first, last = s["rss_first_last_mb"]
            lines.append(f"| {run['label']} | {result['backend']} | {soak['epochs']} | {first:,.0f} → {last:,.0f} | "
                         f"{s['rss_slope_last_half_mb_per_epoch']:.2f} | {'/'.join(map(str, s['fds']))} | "
                         f"{'/'.join(map(str, s['threads']))} | {s['images_per_s_median']:,.0f} |")
        notes.append(f"* **{run['label']}**: `{run.get('command') or soak.get('command')}` — {soak['cpus']} CPUs, "
                     f"Python {soak['python']}, {soak['samples']} images, batch {soak['batch_size']}, "
                     f"{soak['workers']} workers/threads")
    return lines + [""] + notes


# The benchmarks whose results file holds one report of a kind of its own: its heading and renderer.
FORMAT_SECTIONS = {
    OBJECT_STORAGE_FORMAT: ("Shards in object storage", object_storage_section),
    RAY_EXECUTOR_FORMAT: ("loader.executor: ray against local workers", ray_executor_section),
    SSL_VIEWS_FORMAT: ("Several views per image: DINO's multi-crop", ssl_views_section),
    SCALE_FORMAT: ("Cost as the dataset grows", scale_section),
}


def render_file(path: str | Path, *, out_dir: str | Path = ".") -> str:
    """One results file as a markdown section (a bench report, or a runs file of bench reports,
    comparisons or soaks)."""
    path = Path(path)
    title, runs = load_runs(path)
    first = runs[0]["report"]
    heading = f"## {title or first.get('settings', {}).get('pipeline_name', path.stem)} ({path.name})"
    if first.get("format") in FORMAT_SECTIONS:
        name, section = FORMAT_SECTIONS[first["format"]]
        heading = f"## {name} ({path.name})"
        body = section(first)
    elif "settings" in first and len(runs) == 1 and runs[0]["label"] is None:
        png = path.with_suffix(".png")
        plot = os.path.relpath(png, out_dir) if png.is_file() else None
        body = _bench_section(first, command=bench_command(first), plot=plot)
    elif "settings" in first:
        body = _runs_table(runs)
    elif "outputs" in first and "bounds" in first:
        body = [line for run in runs for line in _compare_section(run)]
    elif "results" in first and "epochs" in first:
        body = _soak_section(runs)
    else:
        raise BenchError(f"{path}: not a bench, compare or soak result this report knows how to show")
    return "\n".join([heading, "", *body])


README_INTRO = """# Benchmarks

<!-- Generated by `python -m dali_bridge.bench readme` from the JSON in results/; do not edit. -->

Every figure below comes from a JSON file in [`results/`](results/), which records the machine it
was measured on; each section gives the command that made it. `bash benchmarks/run_all.sh`
re-measures the main ones and rewrites this page; the others name their script. What the columns
mean and how to read them: [docs/performance.md](../docs/performance.md)."""


def render_readme(paths: Sequence[str | Path], *, out_dir: str | Path = ".") -> str:
    """The whole benchmarks page: an introduction, then one section per results file, in order."""
    return "\n\n".join([README_INTRO] + [render_file(p, out_dir=out_dir) for p in paths]) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dali_bridge.bench readme FILE... [--out README.md]`` writes the benchmarks page;
    ``python -m dali_bridge.bench add-run RUNS.json REPORT.json --label L`` records a run in a runs file."""
    parser = argparse.ArgumentParser(prog="python -m dali_bridge.bench", description=main.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    readme = commands.add_parser("readme", help="markdown of results files, in the order given")
    readme.add_argument("files", nargs="+", metavar="FILE")
    readme.add_argument("--out", metavar="PATH", help="write here (image links relative to it) instead of stdout")
    record = commands.add_parser("add-run", help="record REPORT (JSON) in RUNS under LABEL, replacing that label")
    record.add_argument("runs", metavar="RUNS")
    record.add_argument("report", metavar="REPORT")
    record.add_argument("--label", required=True)
    record.add_argument("--title", help="the benchmark's title in the generated page")
    record.add_argument("--command", help="the command that made REPORT (bench reports: rebuilt from the settings)")
    record.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable the run was made with (repeatable)")
    args = parser.parse_args(argv)
    if args.command == "readme":
        out_dir = Path(args.out).parent if args.out else Path(".")
        page = render_readme(args.files, out_dir=out_dir)
        if args.out:
            Path(args.out).write_text(page)
        else:
            sys.stdout.write(page)
        return 0
    environment = dict(item.split("=", 1) for item in args.env)
    add_run(args.runs, label=args.label, report=json.loads(Path(args.report).read_text()), title=args.title,
            command=args.command, environment=environment)
    return 0
