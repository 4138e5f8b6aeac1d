"""The bench's bar chart (Pillow): images/s per candidate, grouped by thread count, with min–max
whiskers; the decode-only ceiling of each group drawn as a dashed line across it."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .results import BenchError, BenchReport

_COLOURS = {"decode-only ceiling": (120, 120, 120), "hand-written torchvision": (243, 166, 148),
            "hand-written torchvision (PIL)": (250, 205, 160), "hand-written DALI (cpu)": (160, 200, 160),
            "hand-written DALI (gpu)": (150, 190, 230), "torchvision": (214, 69, 65), "dali-cpu": (46, 139, 87),
            "dali": (40, 100, 190)}
_GREY, _DARK = (90, 90, 90), (60, 60, 60)


class _Canvas:
    """The image, its fonts and the value → y mapping shared by every part of the chart."""

    def __init__(self, width: int, height: int, top_value: float):
        from PIL import Image, ImageDraw, ImageFont

        self.image = Image.new("RGB", (width, height), "white")
        self.draw = ImageDraw.Draw(self.image)
        try:
            self.font, self.small = ImageFont.load_default(size=14), ImageFont.load_default(size=12)
        except TypeError:  # Pillow < 10.1: one bitmap size
            self.font = self.small = ImageFont.load_default()
        self.left, self.right, self.top, self.bottom = 80, width - 250, 50, height - 60
        self.scale = (self.bottom - self.top) / top_value

    def y_of(self, value: float) -> float:
        return self.bottom - value * self.scale


def plot_report(report: BenchReport, out: str | Path, width: int = 1100, height: int = 560) -> None:
    """Write the chart of ``report`` to ``out`` (PNG); :class:`BenchError` when no row has a figure."""
    rows = [r for r in report.rows if "images_per_s" in r]
    if not rows:
        raise BenchError("nothing to plot: every candidate failed")
    groups = sorted({r["threads"] for r in rows})
    bars = [label for label in dict.fromkeys(r["candidate"] for r in rows if r["kind"] != "ceiling")]
    top = max(r["images_per_s_max"] for r in rows) * 1.12
    canvas = _Canvas(width, height, top)
    _draw_axes(canvas, report=report, rows=rows, top=top)
    group_w = (canvas.right - canvas.left) / len(groups)
    for g, threads in enumerate(groups):
        _draw_group(canvas, rows=rows, bars=bars, threads=threads, x_start=canvas.left + g * group_w, group_w=group_w)
    _draw_legend(canvas, bars=bars)
    canvas.image.save(out, format="PNG")


def _draw_axes(canvas: _Canvas, *, report: BenchReport, rows: list[dict[str, Any]], top: float) -> None:
    """Title, load line, horizontal grid with its labels, and the axes."""
    draw, left, right = canvas.draw, canvas.left, canvas.right
    step = 10 ** math.floor(math.log10(top / 5)) if top > 0 else 1
    step = next(s * step for s in (1, 2, 5, 10) if top / (s * step) <= 7)
    title = f"{report.settings['pipeline_name']}: images/s, {report.machine['cpu_model']}, " \
            f"{report.machine['cpu_cores_available']} cores"
    draw.text((left, 8), title, fill="black", font=canvas.font)
    loads = [r for r in rows if "load_before" in r]
    if loads:
        draw.text((left, 28), f"median of {rows[0].get('windows', '?')} windows per bar; 1-min load average "
                  f"{min(r['load_before'] for r in loads):.2f}-{max(r['load_after'] for r in loads):.2f}",
                  fill=_GREY, font=canvas.small)
    tick = 0.0
    while tick <= top:
        y = canvas.y_of(tick)
        draw.line([(left, y), (right, y)], fill=(230, 230, 230))
        draw.text((left - 8, y), f"{tick:,.0f}", fill="black", font=canvas.small, anchor="rm")
        tick += step
    draw.line([(left, canvas.top), (left, canvas.bottom), (right, canvas.bottom)], fill="black")


def _draw_group(canvas: _Canvas, *, rows: list[dict[str, Any]], bars: list[str], threads: int, x_start: float,
                group_w: float) -> None:
    """One thread count: its label, a bar with whisker per candidate, the dashed ceiling line."""
    draw, small = canvas.draw, canvas.small
    plural = "s" if threads != 1 else ""
    draw.text((x_start + 0.5 * group_w, canvas.bottom + 18), f"{threads} thread{plural} / worker{plural}",
              fill="black", font=canvas.font, anchor="mm")
    bar_w = group_w * 0.8 / max(1, len(bars))
    x0 = x_start + group_w * 0.1
    for b, label in enumerate(bars):
        row = next((r for r in rows if r["candidate"] == label and r["threads"] == threads), None)
        if row is None:
            continue
        xa, xb = x0 + b * bar_w + 2, x0 + (b + 1) * bar_w - 2
        draw.rectangle([xa, canvas.y_of(row["images_per_s"]), xb, canvas.bottom],
                       fill=_COLOURS.get(label, (100, 100, 100)))
        xm = (xa + xb) / 2
        draw.line([(xm, canvas.y_of(row["images_per_s_min"])), (xm, canvas.y_of(row["images_per_s_max"]))],
                  fill="black")
        label_y = canvas.y_of(max(row["images_per_s"], row["images_per_s_max"])) - 4  # above the whisker
        draw.text((xm, label_y), f"{row['images_per_s']:,.0f}", fill="black", font=small, anchor="mb")
    ceiling = next((r for r in rows if r["kind"] == "ceiling" and r["threads"] == threads), None)
    if ceiling:
        y, x, end = canvas.y_of(ceiling["images_per_s"]), x_start + 4, x_start + group_w - 4
        while x < end:
            draw.line([(x, y), (min(x + 8, end), y)], fill=_DARK, width=2)
            x += 14
        draw.text((x_start + group_w - 6, y - 3), f"decode ceiling {ceiling['images_per_s']:,.0f}",
                  fill=_DARK, font=small, anchor="rb")


def _draw_legend(canvas: _Canvas, *, bars: list[str]) -> None:
    draw, small, right = canvas.draw, canvas.small, canvas.right
    legend_y = canvas.top
    for label in bars:
        draw.rectangle([right + 20, legend_y, right + 34, legend_y + 14], fill=_COLOURS.get(label, (100, 100, 100)))
        draw.text((right + 40, legend_y), label, fill="black", font=small)
        legend_y += 22
    draw.line([(right + 20, legend_y + 7), (right + 34, legend_y + 7)], fill=_DARK, width=2)
    draw.text((right + 40, legend_y), "decode-only ceiling", fill="black", font=small)
    draw.text((right + 20, legend_y + 30), "whiskers: min-max over windows", fill=_GREY, font=small)
