"""The object-storage benchmark's results file (``benchmarks/object_storage.py``) as a section of
the benchmarks page: per added delay, backend, access (a ranged GET per sample, or whole shards
through a bounded cache) and server, an epoch's img/s and the loader's CPU per image against local
shards' read the same way (the servers' CPU apart), with the goals beside the figures; ranged reads
per client and listing times where the run measured them."""
from __future__ import annotations

import statistics
from typing import Any

OBJECT_STORAGE_FORMAT = "dali-bridge-object-storage/2"
GOAL_CPU_RATIO = 1.10    # the loader's CPU per image over S3/HTTP, at most this × local shards'
GOAL_LATENCY_SHARE = 0.95   # img/s at the largest delay, at least this share of 0 ms on the same server

MODES = {"local": "local shards", "s3-moto": "S3 (moto)", "http-python": "HTTP (Python's server)",
         "http-nginx": "HTTP (nginx)"}
ACCESS = {"ranged": "a GET per sample", "cached": "whole shards, cached"}


def _num(value: Any, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def _ok(run: dict[str, Any]) -> bool:
    return "error" not in run and "images_per_s" in run


def _access(run: dict[str, Any]) -> str:
    return run.get("access", "ranged")


def _local_medians(report: dict[str, Any], figure: str) -> dict[tuple[str, str], float]:
    """Per (backend, access), the median ``figure`` of its local-shard epochs (the benchmark measures
    them between its servers' epochs): the reference of a local row itself."""
    runs: dict[tuple[str, str], list[float]] = {}
    for run in report["epochs"]:
        if run["mode"] == "local" and _ok(run):
            runs.setdefault((run["backend"], _access(run)), []).append(run[figure])
    return {key: statistics.median(values) for key, values in runs.items()}


def local_cpu_per_image(report: dict[str, Any]) -> dict[tuple[str, str], float]:
    """Per (backend, access), the median loader CPU ms per image of its local-shard epochs."""
    return _local_medians(report, "loader_cpu_ms_per_image")


def adjacent_local(report: dict[str, Any], figure: str) -> dict[int, float]:
    """Each remote epoch (by ``id``) with the mean ``figure`` of the local-shard epochs of its backend and
    access measured just before and just after it (the benchmark measures local shards between servers:
    the machine's speed drifts over a run, so a ratio compares epochs minutes apart, not the run's ends)."""
    runs = report["epochs"]
    out: dict[int, float] = {}
    for number, run in enumerate(runs):
        if run["mode"] == "local" or not _ok(run):
            continue
        def same(other: dict[str, Any]) -> bool:
            return (other["mode"] == "local" and _ok(other) and other["backend"] == run["backend"]
                    and _access(other) == _access(run))
        before = next((r[figure] for r in reversed(runs[:number]) if same(r)), None)
        after = next((r[figure] for r in runs[number + 1:] if same(r)), None)
        sides = [value for value in (before, after) if value is not None]
        if sides:
            out[id(run)] = statistics.fmean(sides)
    return out


def cpu_ratios(report: dict[str, Any]) -> list[tuple[dict[str, Any], float]]:
    """Each remote epoch with its loader CPU per image ÷ that of the local-shard epochs of its backend and
    access measured just before and after it."""
    local = adjacent_local(report, "loader_cpu_ms_per_image")
    return [(run, run["loader_cpu_ms_per_image"] / local[id(run)]) for run in report["epochs"] if id(run) in local]


def latency_shares(report: dict[str, Any]) -> list[tuple[dict[str, Any], float]]:
    """Each epoch at a delay other than 0 with its img/s ÷ the median img/s of the same backend, server
    and access at 0 ms."""
    zero = _zero_ms_medians(report)
    return [(run, run["images_per_s"] / zero[_server_key(run)]) for run in report["epochs"]
            if run["mode"] != "local" and run["latency_ms"] != 0 and _ok(run) and zero.get(_server_key(run))]


def _server_key(run: dict[str, Any]) -> tuple[str, str, str]:
    return run["backend"], run["mode"], _access(run)


def _zero_ms_medians(report: dict[str, Any]) -> dict[tuple[str, str, str], float]:
    rates: dict[tuple[str, str, str], list[float]] = {}
    for run in report["epochs"]:
        if run["latency_ms"] == 0 and run["mode"] != "local" and _ok(run):
            rates.setdefault(_server_key(run), []).append(run["images_per_s"])
    return {key: statistics.median(values) for key, values in rates.items()}


def delay_shares(report: dict[str, Any]) -> dict[tuple[str, str, str, float], float]:
    """Per backend, server, access and delay other than 0: the median img/s of its epochs ÷ the median at 0 ms
    (the repeats of one delay taken together: one process's speed varies from another's)."""
    zero = _zero_ms_medians(report)
    rates: dict[tuple[str, str, str, float], list[float]] = {}
    for run in report["epochs"]:
        if run["mode"] != "local" and run["latency_ms"] != 0 and _ok(run) and zero.get(_server_key(run)):
            rates.setdefault((*_server_key(run), run["latency_ms"]), []).append(run["images_per_s"])
    return {key: statistics.median(values) / zero[key[:3]] for key, values in rates.items()}


def _epochs(report: dict[str, Any]) -> list[str]:
    local_cpu = local_cpu_per_image(report)
    local_rate = _local_medians(report, "images_per_s")
    adjacent_rate = adjacent_local(report, "images_per_s")
    ratio = {id(run): value for run, value in cpu_ratios(report)}
    share = {id(run): value for run, value in latency_shares(report)}
    lines = ["| added delay (ms) | backend | read | shards from | img/s | of local img/s | of 0 ms img/s | "
             "loader CPU ms/img | × local CPU/img | server CPU ms/img | shards downloaded per epoch | "
             "first batch (s) | peak RSS (MiB) |",
             "|--:|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for run in report["epochs"]:
        access = _access(run)
        head = (f"| {run['latency_ms']:g} | {run['backend']} | {ACCESS.get(access, access)} | "
                f"{MODES.get(run['mode'], run['mode'])} |")
        if not _ok(run):
            lines.append(f"{head} {run.get('error', '?')} | | | | | | | | |")
            continue
        reference = adjacent_rate.get(id(run), local_rate.get((run["backend"], access)))
        local = local_cpu.get((run["backend"], access))
        of_local = f"{run['images_per_s'] / reference:.0%}" if reference else "–"
        of_zero = f"{share[id(run)]:.0%}" if id(run) in share else "–"
        times_local = (f"{ratio[id(run)]:.2f}" if id(run) in ratio else
                       f"({run['loader_cpu_ms_per_image'] / local:.2f})" if local else "–")
        lines.append(f"{head} {_num(run['images_per_s'])} | {of_local} | {of_zero} | "
                     f"{_num(run['loader_cpu_ms_per_image'], 2)} | {times_local} | "
                     f"{_num(run.get('server_cpu_ms_per_image'), 2)} | "
                     f"{_num(run.get('shard_downloads_per_epoch'), 1)} | {_num(run['first_batch_s'], 2)} | "
                     f"{_num(run['peak_rss_mib'])} |")
    return lines


def _verdicts(report: dict[str, Any]) -> list[str]:
    """One line per server and goal. The CPU ratio does not depend on the delay, so per backend its
    median over the delays and repeats stands for it (the range beside it); the worst backend decides.
    The img/s share is the worst delay's, each the median of its repeats."""
    lines = []
    ratios: dict[tuple[str, str], dict[str, list[float]]] = {}
    for run, value in cpu_ratios(report):
        ratios.setdefault((run["mode"], _access(run)), {}).setdefault(run["backend"], []).append(value)
    for (mode, access), per_backend in ratios.items():
        figures = {backend: statistics.median(values) for backend, values in per_backend.items()}
        worst = max(figures.values())
        detail = ", ".join(f"{backend} {figures[backend]:.2f} ({min(v):.2f}–{max(v):.2f})"
                           for backend, v in per_backend.items())
        lines.append(f"* {MODES.get(mode, mode)}, {ACCESS.get(access, access)}: loader CPU per image ÷ local "
                     f"shards', median over the delays and repeats {detail} (goal ≤ {GOAL_CPU_RATIO:.2f}): "
                     f"**{'met' if worst <= GOAL_CPU_RATIO else 'missed'}**")
    shares: dict[tuple[str, str], list[tuple[tuple[str, str, str, float], float]]] = {}
    for key, value in delay_shares(report).items():
        shares.setdefault((key[1], key[2]), []).append((key, value))
    for (mode, access), found in shares.items():
        (backend, _, _, latency_ms), worst = min(found, key=lambda pair: pair[1])
        met = worst >= GOAL_LATENCY_SHARE
        lines.append(f"* {MODES.get(mode, mode)}, {ACCESS.get(access, access)}: img/s with a delay ÷ at 0 ms "
                     f"(medians over the repeats), worst {worst:.1%} "
                     f"({backend}, {latency_ms:g} ms; goal ≥ {GOAL_LATENCY_SHARE:.0%}): "
                     f"**{'met' if met else 'missed'}**")
    return lines


def _ranged_reads(report: dict[str, Any]) -> list[str]:
    lines = ["| added delay (ms) | server | client | ranges | in flight | ranges/s | MiB/s | "
             "client CPU s / 1,000 | server CPU s / 1,000 |", "|--:|---|---|--:|--:|--:|--:|--:|--:|"]
    for row in report["ranged_reads"]:
        head = f"| {row['latency_ms']:g} | {MODES.get(row['server'], row['server'])} | {row['client']} |"
        if "skipped" in row:
            lines.append(f"{head} {row['skipped']} | | | | | |")
            continue
        lines.append(f"{head} {row['ranges']:,} | {row['max_requests']} | {_num(row['ranges_per_s'])} | "
                     f"{_num(row['mib_per_s'], 1)} | {_num(row['cpu_s_per_1000'], 2)} | "
                     f"{_num(row['server_cpu_s_per_1000'], 2)} |")
    return lines


def _requests(counts: dict[str, int]) -> str:
    return ", ".join(f"{count:,} {method}" for method, count in sorted(counts.items())) or "none"


def _listing(report: dict[str, Any]) -> list[str]:
    lines = ["| added delay (ms) | shards | cold (s) | its requests | warm (s) | its requests |",
             "|--:|--:|--:|---|--:|---|"]
    for row in report["listing"]:
        lines.append(f"| {row['latency_ms']:g} | {row['shards']:,} | {_num(row['cold_s'], 2)} | "
                     f"{_requests(row['cold_requests'])} | {_num(row['warm_s'], 2)} | "
                     f"{_requests(row['warm_requests'])} |")
    return lines


def _header(report: dict[str, Any]) -> list[str]:
    machine = report.get("machine", {})
    load = machine.get("load_average_1min_range")
    workers = report.get("workers")
    lines = [f"`{report['command']}`", "",
             f"Machine: {machine.get('cpu', '?')}, {machine.get('cpus', '?')} cores, {machine.get('platform', '?')}; "
             f"1-minute load average during the run {load[0]:g}–{load[1]:g}; the run took "
             f"{report.get('run_s', 0):.0f} s." if load else f"Machine: {machine.get('platform', '?')}.", "",
             f"{report['pipeline']}, {report.get('samples', '?')} samples, batch {report['batch_size']}, "
             f"loader.workers {'as the pipeline sets it' if workers is None else workers}, "
             f"{report['max_requests']} GETs in flight per process. The servers run on 127.0.0.1, on the "
             f"loader's cores; the delay is {report['delay']}.", ""]
    access = report.get("access") or {"ranged": {"description": "each sample one ranged GET"}}
    lines += [f"* *{ACCESS.get(name, name)}*: {what['description']}" for name, what in access.items()] + [""]
    if report.get("quick"):
        lines += ["**A smoke run (`--quick`): these figures only show that the script works; they measure "
                  "nothing.**", ""]
    skipped = [f"* {MODES.get(name, name)}: skipped — {s['skipped']}" for name, s in report.get("servers", {}).items()
               if "skipped" in s]
    return lines + (skipped + [""] if skipped else [])


def object_storage_section(report: dict[str, Any]) -> list[str]:
    """The markdown lines of one object-storage results file."""
    measured = report.get("measured_epochs", 1)
    rows = "the second epoch" if measured == 1 else f"epochs 2–{measured + 1}, together,"
    lines = _header(report) + [
        f"Each row is {rows} of a process of its own (the first starts the workers and their "
        "clients and times the first batch). *Loader CPU* is the user + system CPU of the loader's process, "
        "threads and DataLoader workers over the measured epochs; *server CPU* is the server's processes' over "
        "the same epochs, apart. *× local CPU/img* and *of local img/s* divide by the mean of the local-shard "
        "rows of the same backend and access measured just before and just after its server's rows (for a "
        "local row, by the median of them all); each server's delays take turns, so *of 0 ms img/s* (the "
        "median of the 0 ms rows) compares epochs a minute or two apart. "
        "The servers share the loader's cores here, so their CPU comes out of the decode's: img/s against "
        "moto or Python's server is the test server's bound, not the client's.", "", *_epochs(report), "",
        f"Goals: the loader's CPU per image over S3/HTTP at most {GOAL_CPU_RATIO:.2f} × local shards'; img/s "
        f"with an added delay at least {GOAL_LATENCY_SHARE:.0%} of 0 ms on the same server.", "",
        *_verdicts(report)]
    if report.get("ranged_reads"):
        lines += ["", "Ranged reads of the samples' byte ranges with nothing to decode, per server and client, "
                  "each client in a process of its own:", "", *_ranged_reads(report)]
    if report.get("listing"):
        lines += ["", "Listing (one sample per shard; warm: the node's listing cache):", "", *_listing(report)]
    return lines
