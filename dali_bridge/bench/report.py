"""What a bench run says to a reader: the plain-text table ``dali-bridge bench`` prints, the
warnings about figures too unstable to trust, and the markdown of ``benchmarks/README.md``.

Everything here reads the recorded JSON (:meth:`BenchReport.as_dict`), never re-measures.
"""
from __future__ import annotations

import math
from typing import Any

from .results import BenchReport

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
    from ..timing import format_table

    m = report.machine
    lines = [f"{report.settings['pipeline_name']} on {m['cpu_model']} ({m['cpu_cores_available']} cores, "
             f"{m['ram_gib']} GiB RAM{', ' + ', '.join(m['gpus']) if m['gpus'] else ''}); "
             f"{report.data['images']} images, mean {report.data['mean_megapixels']:.3f} MP; batch "
             f"{report.settings['batch_size']}, {report.settings['repeat'] * report.settings['rounds']} windows x "
             f"{report.settings['batches']} batches; 1-min load average {_first(m['loadavg_at_start'])} at start, "
             f"{_first(m['loadavg_at_end'])} at end"]
    good = [r for r in report.rows if "error" not in r]
    rows = [{**r, "threads": str(r["threads"])} for r in good]
    lines.append(format_table(rows, table_columns(good)))
    if report.settings.get("model_ms"):
        lines.append(f"data wait %: share of step time the consumer waited for data with a "
                     f"{report.settings['model_ms']:g} ms model step per batch ({report.settings['model_ms_method']})")
    for row in report.rows:
        if "error" in row:
            lines.append(f"{row['candidate']} x{row['threads']}: FAILED: {row['error']}")
    lines += [f"warning: {text}" for text in stability_warnings(report.settings, report.rows, report.machine)]
    return "\n".join(lines)


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
            f"img/s varies by more than {MAX_SPREAD_PCT:.0f} % between windows for {listed}{_load_note(rows, machine)}. "
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
