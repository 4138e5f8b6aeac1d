"""The benchmarks page's section for ``benchmarks/ray_executor.py``: local workers against
``loader.executor: ray`` on a local multi-node cluster, img/s and the trainer's CPU per image."""
from __future__ import annotations

from statistics import median
from typing import Any

RAY_EXECUTOR_FORMAT = "dali-bridge-ray-executor/1"


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [row[key] for row in rows if row.get(key) is not None]
    return median(values) if values else None


def _cell(value: float | None, digits: int) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def ray_executor_section(report: dict[str, Any]) -> list[str]:
    """The markdown lines of one ``ray_executor.json``."""
    machine = report.get("machine", {})
    load = machine.get("load_average_1min_range")
    versions = machine.get("versions", {})
    lines = [f"`{report['command']}`", "",
             f"Machine: {machine.get('cpu', '?')}, {machine.get('cpus', '?')} cores, {machine.get('ram_gib', '?')} "
             f"GiB RAM, {machine.get('platform', '?')}; torch {versions.get('torch', '?')}, Ray "
             f"{versions.get('ray', '?')}" + (f"; 1-minute load average during the run {load[0]:g}–{load[1]:g}"
                                                if load else "") + f"; the run took {report.get('run_s', 0):.0f} s.",
             "",
             f"{report['pipeline']}, batch {report['batch_size']}: {report['batches']} batches timed after "
             f"{report['warmup']} warm-up batches, each executor {report['rounds']} time(s) in a fresh process. "
             f"Local workers: {report['workers']} DataLoader worker processes. Ray: a head with no task CPUs and "
             f"{report['nodes']} raylets of {report['node_cpus']} CPU(s), all on this machine.", ""]
    if report.get("quick"):
        lines += ["**A smoke run (`--quick`): these figures only show that the script works; they measure "
                  "nothing.**", ""]
    lines += ["| executor | runs | img/s (median) | trainer CPU ms/img | trainer process alone | cluster CPU ms/img "
              "| stalls waiting on the cluster |", "|---|--:|--:|--:|--:|--:|--:|"]
    for executor, name in (("processes", "local workers (processes)"), ("ray", "ray")):
        rows = [row for row in report["rows"] if row["executor"] == executor]
        if not rows:
            continue
        stalls = [row.get("stalls", {}) for row in rows]
        stall_text = ("–" if executor != "ray" else
                      ", ".join(f"{s.get('stalls', 0)} ({s.get('stall_s', 0):.2f} s)" for s in stalls))
        lines.append(f"| {name} | {len(rows)} | {_cell(_median(rows, 'images_per_s'), 0)} | "
                     f"{_cell(_median(rows, 'trainer_cpu_ms_per_image'), 2)} | "
                     f"{_cell(_median(rows, 'trainer_process_cpu_ms_per_image'), 2)} | "
                     f"{_cell(_median(rows, 'cluster_cpu_ms_per_image'), 2)} | {stall_text} |")
    local = _median([r for r in report["rows"] if r["executor"] == "processes"], "trainer_cpu_ms_per_image")
    remote = _median([r for r in report["rows"] if r["executor"] == "ray"], "trainer_cpu_ms_per_image")
    lines += ["", "*Trainer CPU* is what the trainer's host spends per image: with local workers its process and "
              "its DataLoader workers, with `ray` its process alone (the finish, the transfer out of the object "
              "store, the scheduling). *Cluster CPU* is the raylets' and their workers' over the same batches. "
              "Every node shares this machine's cores, so img/s here is one host's, not a cluster's."]
    if local and remote:
        lines += ["", f"With `ray` the trainer spends {remote / local:.2f} × the CPU per image it spends with local "
                      f"workers ({remote:.2f} against {local:.2f} ms)."]
    return lines
