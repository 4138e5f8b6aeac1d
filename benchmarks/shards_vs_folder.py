"""Folder vs WebDataset shards: listing time, raw sample reads (page cache warm and evicted) and
whole-epoch loader throughput on each CPU backend. Writes benchmarks/results/shards_vs_folder.json.

    .venv/bin/python benchmarks/shards_vs_folder.py [--data data/sample] [--shards /tmp/bench_shards]

"Cold" reads evict only this benchmark's own files from the page cache (posix_fadvise
DONTNEED), so other work on the host is untouched; the device's own cache may still help.
The host load average is recorded with each figure: on a shared machine, compare runs only
at similar load.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from dali_bridge.convert import convert
from dali_bridge.loader import build_loader
from dali_bridge.sources import Listing, list_folder, list_webdataset
from dali_bridge.spec import DEFAULT_EXTENSIONS, DEFAULT_IMAGE_KEYS
from dali_bridge.timing import measure_epoch

REPO = Path(__file__).resolve().parent.parent


def load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def evict(paths: list[str]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_all(listing: Listing, order: np.ndarray) -> float:
    """Seconds to read every sample's bytes in ``order`` through the listing (what both backends do)."""
    start = time.perf_counter()
    for index in order.tolist():
        listing.read(index)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(REPO / "data" / "sample"))
    parser.add_argument("--shards", default="/tmp/bench_shards")
    parser.add_argument("--shard-size", type=int, default=500)
    parser.add_argument("--backends", default="dali-cpu,torchvision")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "shards_vs_folder.json"))
    args = parser.parse_args()

    result = convert(args.data, os.path.join(args.shards, "train-%06d.tar"), shard_size=args.shard_size,
                     overwrite=True)
    rows: dict = {"host": {"cpus": os.cpu_count(), "python": platform.python_version()},
                  "samples": result.samples, "shards": len(result.shards), "shard_size": args.shard_size,
                  "convert_seconds": round(result.seconds, 2), "bytes": result.bytes_written}

    start = time.perf_counter()
    folder = list_folder(args.data, DEFAULT_EXTENSIONS)
    rows["list_folder_seconds"] = round(time.perf_counter() - start, 4)
    start = time.perf_counter()
    shards = list_webdataset(result.pattern, DEFAULT_IMAGE_KEYS)
    rows["list_shards_indexed_seconds"] = round(time.perf_counter() - start, 4)
    index_files = [p[:-4] + ".idx" for p in result.shards]
    moved = [(p, p + ".off") for p in index_files]
    for a, b in moved:
        os.rename(a, b)
    try:
        start = time.perf_counter()
        list_webdataset(result.pattern, DEFAULT_IMAGE_KEYS)
        rows["list_shards_tar_scan_seconds"] = round(time.perf_counter() - start, 4)
    finally:
        for a, b in moved:
            os.rename(b, a)

    shuffled = np.random.default_rng(0).permutation(len(folder))
    sequential = np.arange(len(folder))
    reads = []
    for source, listing, files in (("folder", folder, list(folder.paths)), ("shards", shards, list(result.shards))):
        for order_name, order in (("listing order", sequential), ("shuffled", shuffled)):
            for cache in ("warm", "evicted"):
                if cache == "evicted":
                    evict(files)
                else:
                    read_all(listing, order)  # warm the cache
                seconds = read_all(listing, order)
                reads.append({"source": source, "order": order_name, "cache": cache,
                              "samples_per_second": round(len(order) / seconds), "load": load()})
                print(reads[-1], flush=True)
    rows["reads"] = reads

    epochs = []
    for backend in args.backends.split(","):
        for source_name, source in (("folder", {"type": "folder", "root": str(Path(args.data).resolve())}),
                                    ("shards", {"type": "webdataset", "shards": result.pattern})):
            for pipeline in ("imagenet_val", "imagenet_train"):
                loader = build_loader(REPO / "pipelines" / f"{pipeline}.yaml", backend,
                                      overrides={"source": source, "loader.workers": args.workers})
                try:
                    measure_epoch(loader, max_batches=3)  # start-up and page cache
                    before = load()
                    stats = measure_epoch(loader)
                finally:
                    loader.close()
                epochs.append({"backend": backend, "source": source_name, "pipeline": pipeline,
                               "images_per_second": round(stats.images_per_second, 1), "images": stats.images,
                               "load_before": before, "load_after": load()})
                print(epochs[-1], flush=True)
    rows["epochs"] = epochs
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
