"""The object-storage benchmark's results file (``benchmarks/object_storage.py``) as a section of
the benchmarks page: epochs per latency, mode and backend against local disk, ranged-read rates
per client, listing times — with the goals beside the figures."""
from __future__ import annotations

from typing import Any

OBJECT_STORAGE_FORMAT = "dali-bridge-object-storage/1"
GOAL_SHARE = 0.90        # of local-disk images/s, at 20 ms added latency, ranged reads
GOAL_FIRST_BATCH_S = 2.0


def _num(value: Any, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


# The ranged-read row whose CPU costs per GET stand for each epoch mode's requests.
_COST_ROWS = {"ranged": "moto via the proxy", "ranged-http": "HTTP server via the proxy"}


def served_ceiling(report: dict[str, Any], run: dict[str, Any], local: float | None) -> float | None:
    """The img/s this machine allows a ranged mode when the servers share its cores: the cores' CPU
    seconds divided by each image's cost, the local epoch's (cores / local img/s) plus the GET's on
    the servers' side and the bridge's client (the ranged-read row of that server at that latency).
    None where a figure is missing (another mode, no ranged-read row, a file without CPU counts)."""
    cores, target = report.get("machine", {}).get("cpus"), _COST_ROWS.get(run["mode"])
    if not cores or not local or target is None:
        return None
    for row in report.get("ranged_reads", []):
        if (row.get("target") == target and row["latency_ms"] == run["latency_ms"]
                and "the bridge's" in row["client"] and row.get("cpu_s_per_1000") is not None):
            per_get = (row["cpu_s_per_1000"] + (row.get("moto_cpu_s_per_1000") or 0.0)
                       + (row.get("proxy_and_http_cpu_s_per_1000") or 0.0)) / 1000
            return cores / (cores / local + per_get)
    return None


def _epochs(report: dict[str, Any]) -> list[str]:
    lines = ["| added latency (ms) | backend | mode | img/s | of local | ceiling with the servers here (img/s) | "
             "of the ceiling | first batch (s) | peak RSS (MiB) | most GETs in flight |",
             "|--:|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    local = {(r["latency_ms"], r["backend"]): r.get("images_per_s") for r in report["epochs"] if r["mode"] == "local"}
    for run in report["epochs"]:
        if "error" in run:
            lines.append(f"| {run['latency_ms']:g} | {run['backend']} | {run['mode']} | {run['error']} | | | | | | |")
            continue
        reference = local.get((run["latency_ms"], run["backend"]))
        share = f"{run['images_per_s'] / reference:.0%}" if reference else "–"
        ceiling = served_ceiling(report, run, reference)
        of_ceiling = f"{run['images_per_s'] / ceiling:.0%}" if ceiling else "–"
        lines.append(f"| {run['latency_ms']:g} | {run['backend']} | {run['mode']} | {_num(run['images_per_s'])} | "
                     f"{share} | {_num(ceiling)} | {of_ceiling} | {_num(run['first_batch_s'], 2)} | "
                     f"{_num(run['peak_rss_mib'])} | {_num(run.get('peak_in_flight'))} |")
    return lines


def _ranged_reads(report: dict[str, Any]) -> list[str]:
    lines = ["| added latency (ms) | server | client | ranges | in flight | ranges/s | MiB/s | "
             "client CPU s / 1,000 | moto CPU s / 1,000 | proxies' and HTTP server's CPU s / 1,000 |",
             "|--:|---|---|--:|--:|--:|--:|--:|--:|--:|"]
    for row in report["ranged_reads"]:
        target = row.get("target", "moto via the proxy")   # files before the targets were named
        if "skipped" in row:
            lines.append(f"| {row['latency_ms']:g} | {target} | {row['client']} | {row['skipped']} | | | | | | |")
            continue
        lines.append(f"| {row['latency_ms']:g} | {target} | {row['client']} | {row['ranges']:,} | "
                     f"{row['max_requests']} | {_num(row['ranges_per_s'])} | {_num(row['mib_per_s'], 1)} | "
                     f"{_num(row.get('cpu_s_per_1000'), 2)} | {_num(row.get('moto_cpu_s_per_1000'), 2)} | "
                     f"{_num(row.get('proxy_and_http_cpu_s_per_1000'), 2)} |")
    return lines


def _requests(counts: dict[str, int]) -> str:
    return ", ".join(f"{count:,} {method}" for method, count in sorted(counts.items())) or "none"


def _listing(report: dict[str, Any]) -> list[str]:
    lines = ["| added latency (ms) | shards | cold (s) | its requests | warm (s) | its requests |",
             "|--:|--:|--:|---|--:|---|"]
    for row in report["listing"]:
        lines.append(f"| {row['latency_ms']:g} | {row['shards']:,} | {_num(row['cold_s'], 2)} | "
                     f"{_requests(row['cold_requests'])} | {_num(row['warm_s'], 2)} | "
                     f"{_requests(row['warm_requests'])} |")
    return lines


def object_storage_section(report: dict[str, Any]) -> list[str]:
    """The markdown lines of one object-storage results file."""
    machine = report.get("machine", {})
    lines = [f"`{report['command']}`", "",
             f"{report['pipeline']}, {report.get('samples', '?')} samples, batch {report['batch_size']}, "
             f"{report['max_requests']} requests in flight per process; moto's S3 server on 127.0.0.1 (and "
             f"Python's HTTP server on the same shards: mode ranged-http) behind a proxy adding the latency to "
             f"every request. Machine: {machine.get('platform', '?')}, "
             f"{machine.get('cpus', '?')} CPUs, load average {machine.get('load_average', '?')}.", ""]
    if report.get("quick"):
        lines += ["**A smoke run (`--quick`): these figures only show that the script works; they measure "
                  "nothing.**", ""]
    lines += [f"Goals: at 20 ms added latency, ranged reads (no cache) at least {GOAL_SHARE:.0%} of local-disk "
              f"img/s; the first batch within {GOAL_FIRST_BATCH_S:g} s; memory bounded by max_requests × sample "
              f"size.", "",
              "The servers run on the loader's cores here: *ceiling with the servers here* is what the cores "
              "allow once each GET's CPU on the servers' and the client's side (the ranged-read table below) "
              "is added to an image's local cost (cores ÷ local img/s). Against storage on other machines only "
              "the client's share stays.", "", *_epochs(report), "",
              "Ranged reads of the samples' byte ranges, per server and client, each client in a process of its "
              "own (its CPU seconds are the client's alone; with no proxy: the server's own ceiling):", "",
              *_ranged_reads(report), "", "Listing (one sample per shard; warm: the node's listing cache):", "",
              *_listing(report)]
    return lines
