"""The dataset-scale benchmark's results file (``benchmarks/dataset_scale.py``) as a section of the
benchmarks page: per source and sample count, the listing's time and index bytes, what each forked
worker copied of the index, the time to the first batch and the state dict's size, with the goals
beside the figures."""
from __future__ import annotations

from typing import Any

SCALE_FORMAT = "dali-bridge-dataset-scale/1"
GOAL_READY_S = 10.0          # 10^6 files listed and the first batch out, at most this
GOAL_INDEX_BYTES = 64        # the index's bytes per sample, at most this
GOAL_WORKER_COPY = 0.10      # each worker's copy of the index, at most this share of it (not multiplied)
GOAL_STATE_SPREAD = 8        # the state dict's size at every count within this many bytes (its integers' widths)

_MIB = 2**20


def _ok(run: dict[str, Any]) -> bool:
    return "error" not in run


def per_sample(run: dict[str, Any], part: str = "total") -> float:
    """The index's bytes per sample (one part of it: ``paths``, ``labels``, ``shards``, or all)."""
    return run["index_bytes"][part] / run["samples"]


def worst_worker_copy(run: dict[str, Any]) -> float:
    """The largest share of the index a worker copied by looking every sample up."""
    return max(w["private_growth"] for w in run["workers_index_copy"]) / run["index_bytes"]["total"]


def _row(run: dict[str, Any]) -> str:
    head = f"| {run['source']} | {run['count']:,} |"
    if not _ok(run):
        return f"{head} {run['error']} |" + " |" * 8
    parts = "/".join(f"{per_sample(run, part):.0f}" for part in ("paths", "labels", "shards"))
    copies = ", ".join(f"{w['private_growth'] / _MIB:.2f}" for w in run["workers_index_copy"])
    workers = ", ".join(f"{w['pss'] / _MIB:.0f}/{w['uss'] / _MIB:.0f}" for w in run["loader_workers_memory"])
    return (f"{head} {run['list_s']:.2f} | {run['build_s']:.2f} + {run['first_batch_s']:.2f} = "
            f"**{run['ready_s']:.2f}** | **{per_sample(run):.1f}** ({parts}) | "
            f"{run['index_bytes']['total'] / _MIB:.1f} | {run['listing_private_growth'] / _MIB:.1f} | {copies} | "
            f"{workers} | {run['state_dict_pickle_bytes']:,} / {run['state_dict_torch_save_bytes']:,} | "
            f"{run['state_dict_s']:.2f} |")


def _verdict(text: str, met: bool) -> str:
    return f"* {text}: **{'met' if met else 'missed'}**"


def _verdicts(report: dict[str, Any]) -> list[str]:
    runs = [run for run in report["runs"] if _ok(run)]
    lines = []
    largest = max((run["count"] for run in runs if run["source"] == "folder"), default=None)
    for run in runs:
        if run["source"] == "folder" and run["count"] == largest:
            lines.append(_verdict(f"{largest:,} files listed and the first batch out in {run['ready_s']:.2f} s "
                                  f"(goal ≤ {GOAL_READY_S:g} s)", run["ready_s"] <= GOAL_READY_S))
    if runs:
        worst = max(runs, key=per_sample)
        lines.append(_verdict(f"index bytes per sample, at most {per_sample(worst):.1f} ({worst['source']}, "
                              f"{worst['count']:,}; goal ≤ {GOAL_INDEX_BYTES})", per_sample(worst) <= GOAL_INDEX_BYTES))
        # at each source's largest count: at a few thousand samples a page or two of noise is a large share
        largest_runs = [run for run in runs if run["count"] == max(r["count"] for r in runs
                                                                  if r["source"] == run["source"])]
        copied = max(largest_runs, key=worst_worker_copy)
        lines.append(_verdict(f"a worker's copy of the index after looking every sample up, at most "
                              f"{worst_worker_copy(copied):.1%} of it ({copied['source']}, {copied['count']:,}; "
                              f"goal ≤ {GOAL_WORKER_COPY:.0%}: shared, not one copy per worker)",
                              worst_worker_copy(copied) <= GOAL_WORKER_COPY))
        sizes = [run["state_dict_pickle_bytes"] for run in runs]
        lines.append(_verdict(f"state dict pickled, {min(sizes):,}–{max(sizes):,} bytes at every count (goal: "
                              f"independent of the dataset, within the {GOAL_STATE_SPREAD} bytes its integers' "
                              f"widths take)", max(sizes) - min(sizes) <= GOAL_STATE_SPREAD))
    return lines


def _machine(report: dict[str, Any]) -> str:
    m = report["machine"]
    loads = [run["load_average_1min"] for run in report["runs"]]
    load = f"{min(loads):.2f}–{max(loads):.2f}" if loads else "n/a"
    return (f"{m['cpu_model']}, {m['cpu_cores_available']} cores, {m['ram_gib']} GiB RAM, "
            f"{', '.join(m.get('gpus') or []) or 'no GPU'}; 1-minute load average {load} as each source was "
            f"measured (at the start {'/'.join(map(str, m.get('loadavg_at_start', [])))}, at the end "
            f"{'/'.join(map(str, m.get('loadavg_at_end', [])))}). Photos: {report['photos']}; "
            f"{report['classes']:,} classes; shards of {report['shard_size']:,}; {report['workers']} workers.")


def scale_section(report: dict[str, Any]) -> list[str]:
    """The section's lines: the command, the machine, the goals and the table."""
    return [f"`{report['command']}` ({report['run_s']:.0f} s)", "", _machine(report), "", *_verdicts(report), "",
            "| source | samples | listed (s) | build + first batch = ready (s) | index B/sample (names/labels/"
            "shard locations) | index MiB | listing's private growth MiB | each worker's copy of the index MiB | "
            "loader workers PSS/USS MiB | state dict bytes (pickle / torch.save) | first state_dict (s) |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
            *(_row(run) for run in report["runs"]), "",
            "Ready: `build_loader` (which lists the source) and the first batch of `imagenet_train`'s operations "
            "on `torchvision`. A worker's copy: the private memory a forked DataLoader worker gained by looking "
            "every sample's name and label up and running the garbage collector (what an epoch does to the "
            "index). The first `state_dict()` computes the dataset's fingerprint, a pass over every name."]
