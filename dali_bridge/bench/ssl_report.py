"""The benchmarks page's section for ``benchmarks/ssl_views.py``: DINO's multi-crop on each CPU
backend against lightly's ``DINOTransform`` in a DataLoader, against decoding per view and against
one 224 view per image, with the goals' ratios measured round by round."""
from __future__ import annotations

from typing import Any

SSL_VIEWS_FORMAT = "dali-bridge-ssl-views/1"


def _machine(report: dict[str, Any]) -> str:
    m = report["machine"]
    versions = m.get("versions", {})
    gpus = ", ".join(m.get("gpus") or []) or "no GPU"
    loads = [v for r in report["rounds"] for w in r.values() for v in (w.get("load_before"), w.get("load_after"))
             if v is not None]
    load = f"{min(loads):.2f}–{max(loads):.2f}" if loads else "n/a"
    return (f"{m['cpu_model']}, {m['cpu_cores_available']} cores, {m['ram_gib']} GiB RAM, {gpus}; "
            f"torch {versions.get('torch')}, torchvision {versions.get('torchvision')}, DALI "
            f"{versions.get('nvidia.dali')}, lightly {versions.get('lightly')}. 1-minute load average "
            f"during the run: {load}; the run took {report['run_s']:.0f} s.")


def _settings(report: dict[str, Any]) -> str:
    s, d = report["settings"], report["data"]
    return (f"`{report['pipeline']}` on {d['images']:,} images of `{d['root']}`, batch {s['batch_size']}: each "
            f"candidate in a fresh process per round, {s['warmup']} warm-up batches then one timed window of "
            f"{s['batches']} batches; {s['rounds']} rounds, the candidates interleaved within each. img/s counts "
            f"samples (images), each with all its views; CPU ms/img is the process's and its workers' CPU time "
            f"over the window per sample. Figures are medians over the rounds.")


def _candidates(report: dict[str, Any]) -> list[str]:
    lines = ["| candidate | views / sample | img/s (min–max) | CPU ms/img | what it is |", "|---|--:|--:|--:|---|"]
    for name, c in report["candidates"].items():
        lines.append(f"| {name} | {c['views_per_sample']} | {c['images_per_s']:,.1f} "
                     f"({c['images_per_s_min']:,.1f}–{c['images_per_s_max']:,.1f}) | {c['cpu_ms_per_image']:,.1f} | "
                     f"{c['description']} |")
    return lines


def _per_round(ratio: dict[str, Any]) -> str:
    return ", ".join(f"{value:.2f}" for value in ratio["per_round"])


def _goals(report: dict[str, Any]) -> list[str]:
    lines = ["| goal | ratio of img/s (median of rounds) | per round | from CPU ms/img | met |",
             "|---|---|--:|--:|:-:|"]
    for goal in report["goals"]:
        # a "max" goal bounds time per image: its ratio is the cheaper candidate's img/s over the dearer's
        shown = f"{goal['numerator']} / {goal['denominator']} = {goal['median']:.2f}"
        lines.append(f"| {goal['goal']} | {shown} | {_per_round(goal)} | {goal['cpu_median']:.2f} | "
                     f"{'yes' if goal['met'] else '**no**'} |")
    for figure in report.get("figures", []):
        lines.append(f"| {figure['figure']} (no goal) | {figure['numerator']} / {figure['denominator']} = "
                     f"{figure['median']:.2f} | {_per_round(figure)} | {figure['cpu_median']:.2f} | – |")
    return lines


def _profile(report: dict[str, Any]) -> list[str]:
    """Each stage's CPU ms per sample, one thread, summed over the views: the bridge's kernels and
    lightly's transforms, side by side in order of cost."""
    profile = report.get("profile")
    if not profile:
        return []
    lines = [f"Profile: CPU ms per sample of each stage, one thread, summed over the ten views, over "
             f"{profile['samples']} samples (the bridge's torchvision kernels, which the `dali-cpu` backend also "
             f"runs after DALI's decode here; lightly's transforms on PIL images):", "",
             "| bridge stage | ms/sample | lightly stage | ms/sample |", "|---|--:|---|--:|"]
    ours = sorted(profile["bridge-torchvision"].items(), key=lambda item: -item[1])
    theirs = sorted(profile.get("lightly", {}).items(), key=lambda item: -item[1])
    for n in range(max(len(ours), len(theirs))):
        left = f"{ours[n][0]} | {ours[n][1]:.2f}" if n < len(ours) else " | "
        right = f"{theirs[n][0]} | {theirs[n][1]:.2f}" if n < len(theirs) else " | "
        lines.append(f"| {left} | {right} |")
    total = [sum(profile.get(key, {}).values()) for key in ("bridge-torchvision", "lightly")]
    return lines + [f"| **total** | **{total[0]:.2f}** | **total** | **{total[1]:.2f}** |"]


def ssl_views_section(report: dict[str, Any]) -> list[str]:
    """The markdown lines of one ``ssl_views.json``."""
    return [f"`{report['command'].strip()}`", "", _machine(report), "", _settings(report), "",
            *_candidates(report), "", "Goals (a ratio of two candidates' img/s, measured in the same round; "
            "for time per image, one 224 view's img/s over ten views'; *from CPU ms/img*: the same ratio from "
            "CPU time per sample, steadier on shared cores):", "", *_goals(report), "", *_profile(report)]
