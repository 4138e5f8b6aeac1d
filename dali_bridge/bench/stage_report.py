"""Where a bench row's CPU went, stage by stage, and what that split bounds.

A ``torchvision`` backend row records its CPU per image by stage over the timed windows
(``stages_cpu_ms_per_image``, from ``loader.stats()["stages"]``). When the loader is CPU-bound (as
many workers as cores), images/s follows the CPU spent per image, so the split bounds two ratios:

* against the decode-only ceiling: with nothing but its decode and its steps' kernels, the backend
  could reach at most the ceiling's CPU per image over those two stages' — the other stages (each
  sample's Python, the collate, the transfer, the finish) are what stands between it and that;
* against another backend giving the same pixels with the same decode, kernels and finish (``dali-cpu``
  runs torchvision's kernels and the same finish): that backend can be ahead by at most this row's
  CPU per image over those three stages' — all it can save is the rest.
"""
from __future__ import annotations

from typing import Any

STAGE_NAMES = {"sample_python": "per-sample Python", "decode": "decode", "kernels": "kernels", "collate": "collate",
               "transfer": "transfer", "finish": "finish"}
CEILING_STAGES = ("decode", "kernels")              # what the fallback cannot do without
SHARED_STAGES = ("decode", "kernels", "finish")     # what a backend giving the same pixels does too
# The stages are each thread's CPU time per batch handed over, the process tree's CPU is read per window
# from /proc: two clocks, which on the recording virtual machine differed by up to 5 % over a run. A split
# up to this share above the tree's CPU leaves the rest at about none; more means windows too short.
ALIGNMENT = 0.1


def stage_bounds(row: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """For a row with a stage split: the CPU per image outside the stages (``rest_ms``), in decode +
    kernels + finish (``shared_ms``) and in decode + kernels (``unavoidable_ms``), and, with a
    ceiling row at the same thread count, ``ceiling_bound_pct`` (the ceiling's CPU per image over
    decode + kernels, as a percentage); ``ahead_bound`` (the row's CPU per image, or its stages' sum
    where that is more, over decode + kernels + finish); and the measured ratios to set beside them."""
    stages = row["stages_cpu_ms_per_image"]
    staged = sum(stages.values())
    found: dict[str, Any] = {"rest_ms": row["cpu_ms_per_image"] - staged,
                             "shared_ms": sum(stages[s] for s in SHARED_STAGES),
                             "unavoidable_ms": sum(stages[s] for s in CEILING_STAGES)}
    # the work is at least its stages'
    found["ahead_bound"] = max(row["cpu_ms_per_image"], staged) / found["shared_ms"]
    ceiling = next((r for r in rows if r.get("kind") == "ceiling" and r["threads"] == row["threads"]
                    and "cpu_ms_per_image" in r), None)
    if ceiling is not None:
        found["ceiling_bound_pct"] = 100.0 * ceiling["cpu_ms_per_image"] / found["unavoidable_ms"]
        found["ceiling_cpu_ms"] = ceiling["cpu_ms_per_image"]
    found["ahead_measured"] = {r["name"]: r["vs_torchvision"] for r in rows
                               if r.get("kind") == "backend" and r["threads"] == row["threads"]
                               and r.get("vs_torchvision") is not None}
    return found


def stage_lines(rows: list[dict[str, Any]], cores: int | None) -> list[str]:
    """A paragraph per row with a stage split: the split, and at a thread count of at least ``cores``
    (CPU-bound) the two bounds it sets, each beside what was measured — where the split lines up with
    the process's CPU (no more than it: windows long enough)."""
    lines = []
    for row in (r for r in rows if r.get("stages_cpu_ms_per_image") and "cpu_ms_per_image" in r):
        stages = row["stages_cpu_ms_per_image"]
        bounds = stage_bounds(row, rows)
        split = ", ".join(f"{STAGE_NAMES.get(stage, stage)} {ms:.2f}" for stage, ms in stages.items())
        text = f"`{row['name']}` × {row['threads']}, CPU ms per image by stage: {split}; "
        lined_up = bounds["rest_ms"] >= -ALIGNMENT * row["cpu_ms_per_image"]
        if lined_up:
            text += (f"the rest {max(bounds['rest_ms'], 0.0):.2f} (the loop, the steps after the finish, idle "
                     f"workers) of {row['cpu_ms_per_image']:.2f}.")
        else:  # the stages follow the batches handed over, the process's CPU the clock: short windows part them
            text += (f"together more than the process's {row['cpu_ms_per_image']:.2f} over the windows, as batches "
                     f"made before a window opened were handed over in it: longer windows (--batches) line them up.")
        if cores and row["threads"] >= cores and lined_up:
            if "ceiling_bound_pct" in bounds:
                text += (f" With its decode and kernels alone ({bounds['unavoidable_ms']:.2f}) against "
                         f"the ceiling's {bounds['ceiling_cpu_ms']:.2f}, it could reach at most "
                         f"{bounds['ceiling_bound_pct']:.0f} % of the ceiling"
                         + (f" (measured: {row['vs_ceiling_pct']:.0f} %)." if "vs_ceiling_pct" in row else "."))
            measured = ", ".join(f"`{name}` {ratio:.2f}×" for name, ratio in bounds["ahead_measured"].items())
            text += (f" A backend doing the same decode, kernels and finish at the same cost "
                     f"({bounds['shared_ms']:.2f}) can be at most {bounds['ahead_bound']:.2f}× "
                     f"ahead of it here" + (f" (measured: {measured})." if measured else "."))
        lines.append(text)
    return lines
