"""Soak: many epochs with each backend, recording memory, file descriptors and threads per epoch.

Each backend runs in its own fresh process (so one backend's allocations never show in the
other's numbers). After every epoch the child records:

* ``rss_mb``: resident memory of the process plus every descendant (DataLoader workers), MiB,
  summed — shared pages of forked workers count once per process, so this over-states the
  machine's use; ``pss_mb`` (proportional set size, from ``/proc/<pid>/smaps_rollup``) splits
  shared pages and is the fairer total;
* ``fds``: open file descriptors of the process and its descendants; ``threads``: OS threads of
  the main process; ``children``: live descendant processes;
* ``seconds`` and ``images_per_s`` of the epoch.

The summary gives the least-squares slope of ``rss_mb`` and ``pss_mb`` over the epochs after the
warm-up and over the last half of the run (MiB per epoch; a plateau is a slope near 0 — memory
pools grow in steps to a high-water mark, so the last-half slope is the one to judge), and
whether fds/threads stayed constant.

    .venv/bin/python benchmarks/soak.py --epochs 50                      # the whole sample set
    .venv/bin/python benchmarks/soak.py --epochs 8 --samples 512         # a quick check

Records the run in ``benchmarks/results/soak.json`` (``--out``, ``--label``), next to the runs
already there. Linux only (reads ``/proc``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dali_bridge.bench.procstats import process_tree, tree_memory_mib
from dali_bridge.bench.report import add_run

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------
# /proc readings

def _proc_kib(path: str, key: str) -> int:
    """The ``key:`` value (KiB) of a /proc status-style file, 0 when the process is gone."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def reading() -> dict[str, Any]:
    """Memory, fds, threads and processes of this process and its workers, now."""
    me = os.getpid()
    processes = process_tree(me)  # the same /proc walk bench uses: this process first, then workers
    rss_mib, pss_mib = tree_memory_mib(me)
    return {"rss_mb": round(rss_mib, 1), "pss_mb": round(pss_mib, 1),
            "main_rss_mb": round(_proc_kib(f"/proc/{me}/status", "VmRSS") / 1024, 1),
            "fds": sum(_fds(p) for p in processes), "threads": len(os.listdir("/proc/self/task")),
            "children": len(processes) - 1}


# ---------------------------------------------------------------------------------------------
# One backend (child process)

def soak_backend(backend: str, pipeline: str, overrides: dict[str, Any], epochs: int) -> dict[str, Any]:
    import torch

    from dali_bridge import build_loader

    loader = build_loader(pipeline, backend, overrides=overrides)
    per_epoch = [{"epoch": -1, **reading()}]  # after building, before the first batch
    checksum = 0.0
    for epoch in range(epochs):
        start, images = time.perf_counter(), 0
        for image, *_ in loader:
            images += image.shape[0]
            checksum += float(image[:, :, :2, :2].float().sum())  # touch the batch, as training would
        seconds = time.perf_counter() - start
        per_epoch.append({"epoch": epoch, "seconds": round(seconds, 2), "images": images,
                          "images_per_s": round(images / seconds, 1), **reading()})
        print(f"{backend} epoch {epoch}: {per_epoch[-1]}", file=sys.stderr, flush=True)
    loader.close()
    return {"backend": backend, "samples": loader.num_samples, "batch_size": loader.batch_size,
            "skipped": len(loader.skipped), "epochs": per_epoch, "checksum": checksum,
            "torch_threads": torch.get_num_threads()}


def slope(values: list[float]) -> float:
    """Least-squares slope per step; 0.0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    n = len(values)
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    num = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(values))
    den = sum((x - mean_x) ** 2 for x in range(n))
    return num / den


def summarize(result: dict[str, Any], warmup: int) -> dict[str, Any]:
    epochs = [e for e in result["epochs"] if e["epoch"] >= 0]
    steady = epochs[warmup:] if len(epochs) - warmup >= 2 else epochs
    return {"warmup_epochs": len(epochs) - len(steady),
            "rss_slope_mb_per_epoch": round(slope([e["rss_mb"] for e in steady]), 2),
            "pss_slope_mb_per_epoch": round(slope([e["pss_mb"] for e in steady]), 2),
            # allocators grow in steps to a high-water mark: the last half shows whether it was reached
            "rss_slope_last_half_mb_per_epoch": round(slope([e["rss_mb"] for e in epochs[len(epochs) // 2:]]), 2),
            "pss_slope_last_half_mb_per_epoch": round(slope([e["pss_mb"] for e in epochs[len(epochs) // 2:]]), 2),
            "rss_first_last_mb": [epochs[0]["rss_mb"], epochs[-1]["rss_mb"]],
            "rss_steady_min_max_mb": [min(e["rss_mb"] for e in steady), max(e["rss_mb"] for e in steady)],
            "pss_steady_min_max_mb": [min(e["pss_mb"] for e in steady), max(e["pss_mb"] for e in steady)],
            "fds_constant": len({e["fds"] for e in steady}) == 1, "fds": sorted({e["fds"] for e in epochs}),
            "threads_constant": len({e["threads"] for e in steady}) == 1,
            "threads": sorted({e["threads"] for e in epochs}),
            "children": sorted({e["children"] for e in epochs}),
            "images_per_s_median": sorted(e["images_per_s"] for e in epochs)[len(epochs) // 2]}


def subset_file_list(pipeline: str, root: Path, samples: int, folder: Path) -> Path:
    """A file list of ``samples`` images spread evenly over the listing of ``root`` (labels kept)."""
    from dali_bridge import build_loader

    source = {"type": "folder", "root": str(root.resolve())}
    with build_loader(pipeline, "torchvision", overrides={"source": source, "loader.workers": 0}) as loader:
        listing = loader.listing
    step = max(1, len(listing) // samples)
    chosen = list(range(0, len(listing), step))[:samples]
    path = folder / "soak_subset.txt"
    path.write_text("".join(f"{listing.paths[i]} {int(listing.labels[i])}\n" for i in chosen), encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", nargs="+", default=["dali-cpu", "torchvision"])
    parser.add_argument("--pipeline", default=str(REPO / "pipelines" / "imagenet_train.yaml"))
    parser.add_argument("--root", default=str(REPO / "data" / "sample"), help="ImageFolder to read")
    parser.add_argument("--samples", type=int, default=0, help="use this many images of --root (0: all)")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2, help="epochs left out of the slope")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2, help="DALI threads / DataLoader worker processes")
    parser.add_argument("--malloc-mmap-threshold", type=int, default=None, metavar="BYTES",
                        help="run the backends with glibc's MALLOC_MMAP_THRESHOLD_ fixed at BYTES (e.g. 131072): "
                             "buffers above it are mapped and unmapped, never kept in the heap")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "soak.json"),
                        help="the runs file to record this run in (default benchmarks/results/soak.json)")
    parser.add_argument("--label", help="this run's label in --out (default: the backends and epochs); "
                                        "a run of the same label is replaced")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # internal: run one backend, print JSON
    args = parser.parse_args(argv)

    if args.child:
        overrides = json.loads(args.child)
        result = soak_backend(overrides.pop("__backend"), args.pipeline, overrides, args.epochs)
        print(json.dumps(result))
        return 0

    with tempfile.TemporaryDirectory() as scratch:
        if args.samples:
            source = {"type": "file_list", "file_list": str(subset_file_list(args.pipeline, Path(args.root),
                                                                             args.samples, Path(scratch)))}
        else:
            source = {"type": "folder", "root": str(Path(args.root).resolve())}
        results = []
        for backend in args.backends:
            overrides = {"__backend": backend, "source": source, "batch_size": args.batch_size,
                         "loader.workers": args.workers}
            command = [sys.executable, __file__, "--child", json.dumps(overrides), "--pipeline", args.pipeline,
                       "--epochs", str(args.epochs)]
            env = dict(os.environ)
            if args.malloc_mmap_threshold is not None:
                env["MALLOC_MMAP_THRESHOLD_"] = str(args.malloc_mmap_threshold)
            done = subprocess.run(command, stdout=subprocess.PIPE, text=True, env=env)
            if done.returncode != 0:
                print(f"soak: {backend} failed with exit status {done.returncode}", file=sys.stderr)
                return done.returncode
            result = json.loads(done.stdout.strip().splitlines()[-1])
            result["summary"] = summarize(result, args.warmup)
            results.append(result)
            print(f"{backend}: {json.dumps(result['summary'])}", file=sys.stderr)
    report = {"command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]), "pipeline": args.pipeline,
              "root": args.root, "samples": args.samples or "all", "epochs": args.epochs,
              "batch_size": args.batch_size, "workers": args.workers, "host": platform.node(),
              "malloc_mmap_threshold": args.malloc_mmap_threshold,
              "cpus": os.cpu_count(), "python": platform.python_version(), "results": results}
    label = args.label or f"{', '.join(args.backends)}, {args.epochs} epochs"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    add_run(args.out, label=label, report=report, command=report["command"])
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
