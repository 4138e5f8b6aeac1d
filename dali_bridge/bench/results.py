"""What a bench run records: the candidates, their measurements, the machine they ran on and
the report's JSON form (``format: dali-bridge-bench/1``)."""
from __future__ import annotations

import os
import platform
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

PROTOCOL_FD_ENV = "DALI_BRIDGE_BENCH_FD"
BASELINE_NAMES = ("torchvision", "torchvision-pil", "dali-cpu", "dali", "spdl", "spdl-torchvision")
REFERENCE_NAMES = ("ceiling",) + BASELINE_NAMES
SAMPLE_SET = {"images": 2000, "classes": 10, "seed": 0}   # the generated set `--data sample` reads


class BenchError(RuntimeError):
    """The bench cannot do what was asked: a baseline for a pipeline it cannot express, a plot of nothing."""


@dataclass(frozen=True)
class Candidate:
    """One thing to measure: ``kind`` backend | baseline | ceiling, its ``name``, at ``threads``."""
    kind: str
    name: str
    threads: int

    @property
    def label(self) -> str:
        if self.kind == "backend":
            return self.name
        if self.kind == "ceiling":
            return "decode-only ceiling"
        return {"torchvision": "hand-written torchvision", "torchvision-pil": "hand-written torchvision (PIL)",
                "dali-cpu": "hand-written DALI (cpu)", "dali": "hand-written DALI (gpu)",
                "spdl": "hand-written SPDL", "spdl-torchvision": "hand-written SPDL (torchvision)"}[self.name]


@dataclass
class CandidateResult:
    """Everything measured for one candidate (all windows of all rounds pooled)."""
    candidate: Candidate
    windows: list[dict[str, float]] = field(default_factory=list)
    first_batch_s: list[float] = field(default_factory=list)
    peak_rss_mib: float = 0.0
    pss_mib: float = 0.0
    gpu_mib: float | None = None
    wait: list[dict[str, float]] = field(default_factory=list)
    output: dict[str, Any] = field(default_factory=dict)
    loadavg: list[tuple[float, float]] = field(default_factory=list)   # 1-min load before/after each round
    error: str | None = None

    def summary(self, model_ms: float | None = None) -> dict[str, Any]:
        """The row of the table: medians and spreads over the windows."""
        c = self.candidate
        row: dict[str, Any] = {"candidate": c.label, "kind": c.kind, "name": c.name, "threads": c.threads}
        if self.output.get("description"):  # what a reference is, as its measuring process ran it
            row["description"] = self.output["description"]
        if self.output.get("views"):  # a pipeline with views: img/s counts samples, each this many views
            row.update(views=self.output["views"], view_shapes=self.output["view_shapes"])
        if self.error:
            return {**row, "error": self.error}
        rates = [w["images"] / w["seconds"] for w in self.windows]
        mpix = [w["megapixels"] / w["seconds"] for w in self.windows]
        images = sum(w["images"] for w in self.windows)
        median = statistics.median(rates)
        row.update(
            images_per_s=median, images_per_s_min=min(rates), images_per_s_max=max(rates),
            spread_pct=100.0 * (max(rates) - min(rates)) / median if median else 0.0,
            megapixels_per_s=statistics.median(mpix),
            cpu_ms_per_image=1000.0 * sum(w["cpu_seconds"] for w in self.windows) / images if images else 0.0,
            peak_rss_mib=self.peak_rss_mib, pss_mib=self.pss_mib, gpu_mib=self.gpu_mib,
            first_batch_s=statistics.median(self.first_batch_s), windows=len(self.windows), images=images,
            megapixels=sum(w["megapixels"] for w in self.windows),
        )
        staged = [w for w in self.windows if w.get("stage_images")]
        if staged and len(staged) == len(self.windows):  # the torchvision backend: its CPU split by stage
            covered = sum(w["stage_images"] for w in staged)
            row["stages_cpu_ms_per_image"] = {
                stage: 1000.0 * sum(w["stage_cpu_seconds"][stage] for w in staged) / covered
                for stage in staged[0]["stage_cpu_seconds"]}
        if self.loadavg:  # absent where /proc/loadavg is (macOS)
            row.update(load_before=min(a for a, _ in self.loadavg), load_after=max(b for _, b in self.loadavg))
        if self.wait:
            waited = sum(w["wait_s"] for w in self.wait)
            stepped = sum(w["model_s"] for w in self.wait)
            row["data_wait_pct"] = 100.0 * waited / (waited + stepped) if waited + stepped else 0.0
            if model_ms and median:
                loader_ms = 1000.0 * self.output.get("batch_size", 0) / median
                row["data_wait_pct_from_throughput"] = 100.0 * max(0.0, loader_ms - model_ms) / max(loader_ms, model_ms)
        return row


# ---------------------------------------------------------------------------------------------
# The machine and the data

def machine_description() -> dict[str, Any]:
    """CPU model, cores, RAM, kernel, GPU and library versions: what a result was measured on."""
    info: dict[str, Any] = {"platform": f"{platform.system()} {platform.release()} {platform.machine()}",
                            "python": platform.python_version()}
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        models = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
        info["cpu_model"] = models[0] if models else platform.processor() or "unknown"
    except OSError:
        info["cpu_model"] = platform.processor() or "unknown"
    info["cpu_cores_total"] = os.cpu_count()
    try:
        info["cpu_cores_available"] = len(os.sched_getaffinity(0))
    except AttributeError:
        info["cpu_cores_available"] = os.cpu_count()
    try:
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        info["ram_gib"] = round(int(meminfo["MemTotal"].split()[0]) / 2**20, 1)
    except (OSError, KeyError, ValueError):
        info["ram_gib"] = None
    versions = {}
    for module in ("torch", "torchvision", "nvidia.dali", "numpy", "PIL"):
        try:
            versions[module] = __import__(module, fromlist=["__version__"]).__version__
        except Exception as exc:  # DALI absent or broken: say so
            versions[module] = f"unavailable ({type(exc).__name__})"
    info["versions"] = versions
    try:
        import torch
        info["gpus"] = [torch.cuda.get_device_name(n) for n in range(torch.cuda.device_count())]
    except Exception:
        info["gpus"] = []
    info["loadavg_at_start"] = loadavg()
    return info


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages (empty where /proc/loadavg does not exist)."""
    try:
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def source_pixels(listing) -> np.ndarray:
    """Pixel count of every sample's source image, from its header (int64 [N]); 0 where unreadable."""
    from ..errors import ImageError
    from ..data.sources.images import probe

    pixels = np.zeros(len(listing), dtype=np.int64)
    for index in range(len(listing)):
        try:
            height, width = probe(listing.read(index))
        except ImageError:
            continue
        pixels[index] = height * width
    return pixels


def default_data_dir() -> Path:
    """Where ``bench --data sample`` keeps the generated sample set: ``./data/sample``, or
    ``$DALI_BRIDGE_SAMPLES``."""
    return Path(os.environ.get("DALI_BRIDGE_SAMPLES", "data/sample"))


@dataclass
class BenchReport:
    """The run: machine, settings, one row per candidate (see :meth:`CandidateResult.summary`)."""
    machine: dict[str, Any]
    settings: dict[str, Any]
    data: dict[str, Any]
    rows: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        return {"format": "dali-bridge-bench/1", "machine": self.machine, "settings": self.settings,
                "data": self.data, "results": self.rows}


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """``vs_ceiling_pct`` (images/s over the decode ceiling at the same thread count) and
    ``vs_baseline`` (over the matching hand-written baseline at the same thread count) and, for a
    backend other than ``torchvision``, ``vs_torchvision`` (over the ``torchvision`` backend's images/s
    at the same thread count: what choosing it buys over the fallback, in the same run)."""
    by_key = {(r["kind"], r["name"], r["threads"]): r for r in rows if "images_per_s" in r}
    for row in rows:
        if "images_per_s" not in row:
            continue
        ceiling = by_key.get(("ceiling", "decode", row["threads"]))
        if ceiling and row["kind"] != "ceiling":
            row["vs_ceiling_pct"] = 100.0 * row["images_per_s"] / ceiling["images_per_s"]
        if row["kind"] == "backend":
            baseline = by_key.get(("baseline", row["name"], row["threads"]))
            if baseline:
                row["vs_baseline"] = row["images_per_s"] / baseline["images_per_s"]
            fallback = by_key.get(("backend", "torchvision", row["threads"]))
            if fallback and row["name"] != "torchvision":
                row["vs_torchvision"] = row["images_per_s"] / fallback["images_per_s"]


