"""README-ready markdown from ``dali-bridge bench --json`` results.

    python benchmarks/report.py benchmarks/results/bench_train.json [more.json ...] > report.md

For each file: the machine, a table of every candidate, and — for the train pipeline — the
performance targets of the project (issues 3, 4 and 6) checked against the measured figures.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def _num(value: Any, digits: int = 0) -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}"


def machine_line(report: dict[str, Any]) -> str:
    m, s, d = report["machine"], report["settings"], report["data"]
    gpus = ", ".join(m.get("gpus") or []) or "no GPU"
    versions = m.get("versions", {})
    loads = [r for r in report["results"] if "load_before" in r]
    load = (f"{min(r['load_before'] for r in loads):.2f}–{max(r['load_after'] for r in loads):.2f}"
            if loads else "n/a")
    return (f"{m['cpu_model']}, {m['cpu_cores_available']} cores, {m['ram_gib']} GiB RAM, {gpus}; "
            f"torch {versions.get('torch')}, torchvision {versions.get('torchvision')}, "
            f"DALI {versions.get('nvidia.dali')}. `{s['pipeline']}` on {d['images']} images "
            f"(mean {d['mean_megapixels']:.3f} MP), batch {s['batch_size']}; median of "
            f"{s['repeat'] * s['rounds']} windows × {s['batches']} batches after {s['warmup']} warm-up batches "
            f"({s['rounds']} fresh process(es) per candidate). 1-minute load average during the run: {load}.")


def table(report: dict[str, Any]) -> str:
    rows = [r for r in report["results"] if "images_per_s" in r]
    model_ms = report["settings"].get("model_ms")
    gpu = any(r.get("gpu_mib") is not None for r in rows)
    header = ["candidate", "threads", "img/s (min–max)", "MP/s", "CPU ms/img", "PSS (peak RSS) MiB",
              "first batch s", "% of ceiling", "× hand-written"]
    if gpu:
        header.append("GPU MiB")
    if model_ms:
        header.append(f"data wait % @ {model_ms:g} ms/step")
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if i == 0 else "--:" for i in range(len(header))) + "|"]
    for r in rows:
        cells = [r["candidate"] if r["kind"] != "backend" else f"**{r['candidate']}**", str(r["threads"]),
                 f"{_num(r['images_per_s'])} ({_num(r['images_per_s_min'])}–{_num(r['images_per_s_max'])})",
                 _num(r["megapixels_per_s"], 1), _num(r["cpu_ms_per_image"], 2),
                 f"{_num(r['pss_mib'])} ({_num(r['peak_rss_mib'])})", _num(r["first_batch_s"], 2),
                 _num(r.get("vs_ceiling_pct")), _num(r.get("vs_baseline"), 2)]
        if gpu:
            cells.append(_num(r.get("gpu_mib")))
        if model_ms:
            cells.append(_num(r.get("data_wait_pct")))
        lines.append("| " + " | ".join(cells) + " |")
    for r in report["results"]:
        if "error" in r:
            lines.append(f"\n{r['candidate']} × {r['threads']} failed: {r['error'].splitlines()[0]}")
    return "\n".join(lines)


def targets(report: dict[str, Any]) -> str | None:
    """The project's targets on the train pipeline; None when the run lacks the candidates they need."""
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


def render_hybrid(path: Path, report: dict[str, Any]) -> str:
    """The dali_cpu_hybrid.py experiment: shipped dali-cpu vs DALI decode + torch geometry."""
    m = report["machine"]
    lines = [f"### dali-cpu: where the time goes ({path.name})", "",
             f"{m['cpu_model']}, {m['cpu_cores_available']} cores; `{report['settings']['pipeline']}`, median of "
             f"{report['settings']['rounds']} fresh processes × {report['settings']['batches']} batches.", "",
             "| loader | threads | img/s (each run) | CPU ms/img | 1-min load before each run |", "|---|--:|--:|--:|--:|"]
    for r in report["candidates"]:
        lines.append(f"| {r['name']} | {r['threads']} | {r['images_per_s']:,.0f} "
                     f"({', '.join(f'{v:,.0f}' for v in r['images_per_s_all'])}) | {r['cpu_ms_per_image']:.2f} | "
                     f"{', '.join(f'{v:.2f}' for v in r['load_before'])} |")
    same = report["identical_to_torchvision"]
    lines += ["", f"hybrid batches bit-identical to the torchvision backend's: "
                  f"{'yes' if same['bit_identical'] else 'no'} ({same['batches_compared']} batches, "
                  f"max |difference| {same['max_abs_diff']:g})."]
    stages = report["stages"].get("stages_cpu_ms_per_image") or {}
    if stages:
        lines += ["", "CPU ms per image of plain DALI graphs on the bridge's feeder, stage by stage: " +
                  ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in stages.items()) + "."]
    return "\n".join(lines)


def render(path: Path) -> str:
    report = json.loads(path.read_text())
    if "candidates" in report and "stages" in report:
        return render_hybrid(path, report)
    parts = [f"### {report['settings']['pipeline_name']} ({path.name})", "", machine_line(report), "", table(report)]
    if report["settings"].get("model_ms"):
        parts += ["", f"*data wait %*: share of each step the training loop spends waiting for the next batch "
                      f"when the model takes {report['settings']['model_ms']:g} ms per batch (measured: the consumer "
                      f"sleeps that long after each batch while the loader keeps working)."]
    checked = targets(report) if "train" in report["settings"]["pipeline_name"] else None
    if checked:
        parts += ["", "Targets:", "", checked]
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    print("\n\n".join(render(Path(p)) for p in argv))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
