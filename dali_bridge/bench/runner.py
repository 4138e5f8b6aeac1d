"""The parent side of ``dali-bridge bench``: every candidate at every thread count in a fresh
Python process (so threads, worker processes, allocator state and memory never carry over from
one candidate to the next), monitored for peak RSS and stalls, its windows pooled over rounds."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..util.urls import is_url
from .procstats import MemoryMonitor, kill_group
from .results import (BASELINE_NAMES, PROTOCOL_FD_ENV, SAMPLE_SET, BenchError, BenchReport, Candidate, CandidateResult,
                      add_ratios, default_data_dir, loadavg, machine_description, source_pixels)

STALL_SECONDS = 300.0  # a candidate that yields no batch for this long is killed and reported
_CHILD = "import sys; from dali_bridge.bench.measure import child_main; sys.exit(child_main())"
# The measuring process imports the same dali_bridge as this one, whatever its current folder.
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


def data_overrides(data: str | None) -> dict[str, Any]:
    """The source override ``bench --data`` asks for: nothing (the pipeline's own source) when
    ``data`` is None or ``"source"``; the generated sample set (made on first use in
    :func:`default_data_dir`) for ``"sample"``; else ``data`` is an image folder (ImageFolder layout)."""
    if data in (None, "source"):
        return {}
    if data == "sample":
        from ..data.sources.synthetic import ensure_sample_data

        root = default_data_dir()
        ensure_sample_data(root, **SAMPLE_SET)
    elif is_url(data):   # never a local path made of a URL: the spec says what reads objects at a URL
        return {"source": {"type": "folder", "root": data}}
    else:
        root = Path(data)
    return {"source": {"type": "folder", "root": str(root.resolve())}}


def run_candidate(candidate: Candidate, base: dict[str, Any], on_batch: Callable[[], None],
                  result: CandidateResult) -> None:
    """Measure ``candidate`` once in a fresh process group and pool what it measured into
    ``result`` (or set ``result.error``: a failure, a crash, or no batch for ``STALL_SECONDS``)."""
    overrides = dict(base["overrides"])
    if candidate.kind == "backend":
        overrides["loader.workers"] = candidate.threads
    config = {**base, "overrides": overrides, "kind": candidate.kind, "name": candidate.name,
              "threads": candidate.threads}
    with tempfile.TemporaryDirectory(prefix="dali-bridge-bench-") as tmp:
        config_path = Path(tmp, "config.json")
        config_path.write_text(json.dumps(config))
        log_path = Path(tmp, "log.txt")
        read_fd, write_fd = os.pipe()
        python_path = os.pathsep.join(p for p in (_PACKAGE_PARENT, os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, PROTOCOL_FD_ENV: str(write_fd), "PYTHONPATH": python_path}
        before = loadavg()
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(config_path)], stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, pass_fds=(write_fd,), env=env, start_new_session=True)
        os.close(write_fd)
        monitor = MemoryMonitor(process.pid, STALL_SECONDS)
        payload, error, returncode = _listen(process, read_fd=read_fd, monitor=monitor, on_batch=on_batch)
        after = loadavg()
        if monitor.stalled:
            error = f"no batch for {STALL_SECONDS:.0f} s: killed"
            payload = None
        if payload is None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
            result.error = (error or f"process exited with status {returncode}") + \
                ("\n    " + "\n    ".join(tail) if tail and not error else "")
            return
    _pool(result, payload=payload, peak_rss_mib=monitor.peak_rss, load=(before, after))


def _listen(process: subprocess.Popen, *, read_fd: int, monitor: MemoryMonitor,
            on_batch: Callable[[], None]) -> tuple[dict[str, Any] | None, str | None, int]:
    """Read the candidate's messages until it exits: (its result, its error, its exit status)."""
    monitor.start()
    payload = error = None
    try:
        with os.fdopen(read_fd, "r") as channel:
            for line in channel:
                kind, value = json.loads(line)
                monitor.last_activity = time.monotonic()
                if kind == "batch":
                    on_batch()
                elif kind == "result":
                    payload = value
                elif kind == "error":
                    error = value
        returncode = process.wait()
    except BaseException:  # Ctrl-C or a broken pipe: take the candidate's workers down too
        kill_group(process.pid)
        process.wait()
        raise
    finally:
        monitor.stop()
        # Worker processes the candidate left behind (its exit skips teardown) would go on
        # decoding prefetched batches while the next candidate is timed: end them now.
        kill_group(process.pid)
    return payload, error, returncode


def _pool(result: CandidateResult, *, payload: dict[str, Any], peak_rss_mib: float,
          load: tuple[list[float], list[float]]) -> None:
    """Add one process's measurements to the candidate's: windows appended, peaks kept."""
    result.windows += payload["windows"]
    result.first_batch_s.append(payload["first_batch_s"])
    result.peak_rss_mib = max(result.peak_rss_mib, peak_rss_mib)
    result.pss_mib = max(result.pss_mib, payload["pss_mib"])
    if payload["gpu_mib"] is not None:
        result.gpu_mib = max(result.gpu_mib or 0.0, payload["gpu_mib"])
    if payload["wait"]:
        result.wait.append(payload["wait"])
    result.output = payload["output"]
    before, after = load
    if before and after:
        result.loadavg.append((before[0], after[0]))


def default_baselines(backends: Sequence[str], *, views: bool = False) -> list[str]:
    """The decode ceiling plus the hand-written counterpart of each backend measured; the ceiling alone
    beside a pipeline with ``views`` (a hand-written loader builds one image per sample)."""
    names = ["ceiling"]
    for backend in [] if views else backends:
        if backend in BASELINE_NAMES and backend not in names:
            names.append(backend)
    return names


def candidates_for(backends: Sequence[str], baselines: Sequence[str], threads: Sequence[int]) -> list[Candidate]:
    """Every candidate, grouped by thread count: references first, then the bridge's backends."""
    found = []
    for count in threads:
        found += [Candidate("ceiling", "decode", count)] if "ceiling" in baselines else []
        found += [Candidate("baseline", name, count) for name in BASELINE_NAMES if name in baselines]
        found += [Candidate("backend", name, count) for name in backends]
    return found


def run_bench(file: str | Path, *, backends: Sequence[str], baselines: Sequence[str], threads: Sequence[int],
              batches: int = 8, warmup: int = 3, repeat: int = 4, rounds: int = 1, model_ms: float | None = None,
              overrides: dict[str, Any] | None = None, progress: bool = True) -> BenchReport:
    """Measure every candidate at every thread count (see the package docstring).

    ``batches``: batches per timed window (default 8); ``warmup``: batches discarded first,
    including the first batch (default 3, at least 1); ``repeat``: timed windows per process
    (default 4); ``rounds``: fresh processes per candidate, interleaved across candidates
    (default 1); ``model_ms``: simulated model step per batch in milliseconds (default none).
    """
    from ..data.sources.local import list_source
    from ..spec.pipeline import load_spec

    if batches < 1 or repeat < 1 or warmup < 1 or rounds < 1:
        raise ValueError("batches, repeat, warmup and rounds must each be at least 1")
    overrides = dict(overrides or {})
    spec = load_spec(file, overrides)
    _refuse_single_image_baselines(spec, baselines)
    listing = list_source(spec.source)
    pixels = source_pixels(listing)
    machine = machine_description()
    candidates = candidates_for(backends, baselines, threads)
    # the file load_spec read (a shipped pipeline's, for a name), so every measuring process reads it too
    base = {"file": str(Path(spec.origin).resolve()), "overrides": overrides, "batches": batches,
            "warmup": warmup, "repeat": repeat, "model_ms": model_ms}
    per_process = warmup + batches * repeat + (batches if model_ms else 0)
    results = _measure_all(candidates, base=base, pixels=pixels, rounds=rounds,
                           total_batches=per_process * len(candidates) * rounds if progress else None)
    rows = [results[c].summary(model_ms) for c in candidates]
    add_ratios(rows)
    settings = {"pipeline": str(file), "pipeline_name": spec.name, "batch_size": spec.batch_size,
                "backends": list(backends), "baselines": list(baselines), "threads": list(threads),
                "batches": batches, "warmup": warmup, "repeat": repeat, "rounds": rounds, "model_ms": model_ms,
                "overrides": overrides,
                "model_ms_method": "measured: the consumer sleeps model_ms after each batch and times its waits"
                if model_ms else None}
    data = {"root": listing.root, "images": len(listing), "classes": len(listing.classes),
            "mean_megapixels": float(pixels.mean() / 1e6) if len(pixels) else 0.0}
    machine["loadavg_at_end"] = loadavg()
    return BenchReport(machine, settings, data, rows)


def _refuse_single_image_baselines(spec: Any, baselines: Sequence[str]) -> None:
    """A hand-written baseline builds one image per sample: beside a pipeline with views its
    figure would compare one view against all of them."""
    hand_written = [name for name in baselines if name in BASELINE_NAMES]
    if spec.views and hand_written:
        views = sum(group.count for group in spec.views)
        raise BenchError(f"{spec.origin}: the hand-written baselines ({', '.join(hand_written)}) build one image "
                         f"per sample, and this pipeline gives {views} views per sample (views: "
                         f"{', '.join(group.name for group in spec.views)}): use --baselines ceiling or none")


def _measure_all(candidates: list[Candidate], *, base: dict[str, Any], pixels: np.ndarray, rounds: int,
                 total_batches: int | None) -> dict[Candidate, CandidateResult]:
    """Every candidate once per round, rounds interleaved; a progress bar when ``total_batches``."""
    results = {c: CandidateResult(c) for c in candidates}
    from ..util.progress import progress

    bar = progress(total=total_batches, unit="batch", description="bench", enabled=total_batches is not None)
    with tempfile.TemporaryDirectory(prefix="dali-bridge-bench-") as tmp:
        pixels_path = str(Path(tmp, "pixels.npy"))
        np.save(pixels_path, pixels)
        try:
            for _ in range(rounds):
                for candidate in candidates:
                    if results[candidate].error:
                        continue
                    bar.set_description(f"bench {candidate.label} x{candidate.threads}")
                    run_candidate(candidate, {**base, "pixels": pixels_path}, lambda: bar.update(1),
                                  results[candidate])
        finally:
            bar.close()
    return results
