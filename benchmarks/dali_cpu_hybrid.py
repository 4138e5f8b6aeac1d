"""Experiment: where the `dali-cpu` backend's time goes, and what a DALI-decode + torch-geometry split gives.

The shipped `dali-cpu` graph reproduces torchvision's antialiased resize inside DALI (zero-pad
slice, float resize, two renormalising divisions, cast: see ``backends/dali.py``), which costs
about twice the CPU of a plain ``fn.resize``. This script measures, side by side in fresh processes:

* ``dali-cpu``: the bridge's loader as shipped;
* ``hybrid``: the same feeder and the same DALI ROI decode (``fn.decoders.image_slice`` of the
  bridge's crop window), then the remaining geometry with the torchvision backend's own
  ``apply_steps`` (``F.resize`` on uint8, antialias, flip) on a thread pool of the same size,
  and the torchvision backend's ``finish_batch`` — i.e. DALI for what it does fastest on a CPU
  (reading + ROI decode), torch for the exact torchvision geometry;
* ``torchvision``: the bridge's torchvision backend;
* ``stages``: CPU ms per image of plain DALI graphs on the same feeder, stage by stage (feed,
  ROI decode, plain ``fn.resize``, ``crop_mirror_normalize``): the shipped graph's cost minus
  the last is what its torchvision-exact resize costs.

and checks that ``hybrid`` batches are bit-identical to the ``torchvision`` backend's. It does not
change the library: it is the evidence for the design note in the README's performance section.

    .venv/bin/python benchmarks/dali_cpu_hybrid.py                 # ~2 min on 2 cores
    .venv/bin/python benchmarks/dali_cpu_hybrid.py --threads 1,2 --rounds 3

Writes benchmarks/results/dali_cpu_hybrid.json (``--out``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PIPELINE = REPO / "pipelines" / "imagenet_train.yaml"


def _loader_stream(backend: str, threads: int):
    from dali_bridge import build_loader

    loader = build_loader(PIPELINE, backend, overrides={"loader.workers": threads})

    def stream():
        while True:
            for batch in loader:
                yield batch[0]
    return stream(), loader.close


def _column_types(feeder, listing, spec, types) -> list:
    """DALI dtypes of the feeder's columns, read off one prepared batch (the column layout is the
    backend's internal business; only columns 0-2 — bytes, crop anchor, crop shape — and the last
    one — the flip — are used here)."""
    from dali_bridge.sampling import rank_batches

    columns, _ = feeder.prepare(rank_batches(len(listing), spec.batch_size, spec.seed, 0)[0])
    kinds = {"f": types.FLOAT, "u": types.UINT8, "i": types.INT32}
    return [kinds[column[0].dtype.kind] for column in columns]


def _hybrid_stream(threads: int):
    """DALI: external source (the bridge's feeder) + ROI decode; torch: resize/flip + finish."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import torch
    from nvidia.dali import fn, pipeline_def, types

    from dali_bridge.backends import dali as bridge_dali
    from dali_bridge.backends.torchvision import apply_steps, finish_batch
    from dali_bridge.images import probe
    from dali_bridge.plan import build_plan
    from dali_bridge.ops.geometry import Crop
    from dali_bridge.sampling import draws, rank_batches, sample_steps
    from dali_bridge.sources import list_source
    from dali_bridge.spec import load_spec

    spec = load_spec(PIPELINE, {"loader.workers": threads})
    listing = list_source(spec.source)
    plan = build_plan(spec)
    if not (plan.steps and plan.steps[0].kind == "random_resized_crop"):
        raise SystemExit("the hybrid experiment needs a pipeline starting with random_resized_crop")
    feeder = bridge_dali._Feeder(spec, listing, plan)
    column_types = _column_types(feeder, listing, spec, types)

    @pipeline_def(batch_size=spec.batch_size, num_threads=threads, device_id=None,
                  prefetch_queue_depth=spec.loader.prefetch, exec_dynamic=True)
    def decode_only():
        columns = fn.external_source(source=feeder, num_outputs=len(column_types), dtype=column_types, batch=True)
        return fn.decoders.image_slice(columns[0], columns[1], columns[2], axis_names="HW", normalized_anchor=False,
                                       normalized_shape=False, output_type=types.RGB)

    pipe = decode_only()
    pipe.build()
    sizes: dict[int, tuple[int, int]] = {}

    def source_size(index: int) -> tuple[int, int]:
        if index not in sizes:
            sizes[index] = probe(listing.read(index))
        return sizes[index]

    pool = ThreadPoolExecutor(threads)
    torch.set_num_threads(1)  # parallel over samples on the pool instead (OpenMP spinning costs CPU)
    height, width = plan.output_size

    def batches():
        epoch = 0
        while True:
            tasks = rank_batches(len(listing), spec.batch_size, spec.seed, epoch)
            feeder.start(tasks)
            for _ in tasks:
                (decoded,) = pipe.run()
                meta = feeder.pending.popleft()
                task = meta["task"]
                sample_draws = draws(plan, spec.seed, task.epoch, task.indices)
                out = torch.empty((len(decoded), 3, height, width), dtype=torch.uint8)

                def one(row: int) -> None:
                    image = torch.from_numpy(np.asarray(decoded[row])).permute(2, 0, 1)
                    # The feeder probed every source size already; a real implementation would pass
                    # them along in the batch's metadata, so here they come from a cache.
                    per_step = sample_steps(plan, *source_size(int(task.indices[row])),
                                            {k: v[row] for k, v in sample_draws.items()})
                    (crop, resize), size = per_step[0]  # the crop was the ROI decode: keep the whole of it
                    per_step[0] = ((Crop(0, 0, crop.height, crop.width), resize), size)
                    out[row].copy_(apply_steps(image, plan, per_step))

                list(pool.map(one, range(len(decoded))))
                # finish (elementwise, so per-chunk results are the whole batch's) on the pool too
                step = -(-len(decoded) // threads)
                chunks = list(pool.map(lambda s: finish_batch(out[s:s + step], plan.finish, torch.device("cpu")),
                                       range(0, len(decoded), step)))
                yield torch.cat(chunks) if len(chunks) > 1 else chunks[0]
            feeder.stop()
            try:
                while True:
                    pipe.run()
            except StopIteration:
                pass
            pipe.reset()
            epoch += 1

    return batches(), lambda: pool.shutdown(wait=False)


def _stage_costs(threads: int, batches: int) -> dict[str, float]:
    """CPU ms per image of DALI graphs on the bridge's feeder, growing stage by stage with plain DALI
    ops: feed only, + ROI decode, + ``fn.resize`` (uint8, antialias), + ``crop_mirror_normalize``.
    The shipped graph's cost minus the last one is the price of its torchvision-exact resize."""
    from nvidia.dali import fn, pipeline_def, types

    from dali_bridge.backends import dali as bridge_dali
    from dali_bridge.bench import tree_cpu_seconds
    from dali_bridge.plan import build_plan
    from dali_bridge.sampling import rank_batches
    from dali_bridge.sources import list_source
    from dali_bridge.spec import load_spec

    spec = load_spec(PIPELINE, {"loader.workers": threads})
    listing = list_source(spec.source)
    plan = build_plan(spec)
    height, width = plan.output_size
    costs = {}
    for stop in ("feed", "roi_decode", "plain_resize", "crop_mirror_normalize"):
        feeder = bridge_dali._Feeder(spec, listing, plan)
        column_types = _column_types(feeder, listing, spec, types)

        @pipeline_def(batch_size=spec.batch_size, num_threads=threads, device_id=None, prefetch_queue_depth=2,
                      exec_dynamic=True)
        def cut():
            # column 0: encoded bytes; 1, 2: the crop window (anchor, shape); last: the flip
            columns = list(fn.external_source(source=feeder, num_outputs=len(column_types), dtype=column_types,
                                              batch=True))
            if stop == "feed":
                return columns[0]
            images = fn.decoders.image_slice(columns[0], columns[1], columns[2], axis_names="HW",
                                             normalized_anchor=False, normalized_shape=False, output_type=types.RGB)
            if stop == "roi_decode":
                return images
            images = fn.resize(images, resize_x=width, resize_y=height, antialias=True,
                               interp_type=types.INTERP_LINEAR)
            if stop == "plain_resize":
                return images
            finish = plan.finish
            return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout=finish.layout,
                                            mean=[m * 255 for m in finish.mean], std=[s * 255 for s in finish.std],
                                            mirror=columns[-1])

        pipe = cut()
        pipe.build()
        feeder.start(rank_batches(len(listing), spec.batch_size, spec.seed, 0))
        for _ in range(2):
            pipe.run()
        cpu0 = tree_cpu_seconds()
        for _ in range(batches):
            pipe.run()
        costs[stop] = 1000.0 * (tree_cpu_seconds() - cpu0) / (batches * spec.batch_size)
        feeder.stop()
        del pipe
    return costs


def _one(name: str, threads: int, warmup: int, batches: int) -> dict:
    from dali_bridge.bench import tree_cpu_seconds

    if name == "stages":
        return {"stages_cpu_ms_per_image": _stage_costs(threads, batches)}
    start = time.perf_counter()
    stream, close = _hybrid_stream(threads) if name == "hybrid" else _loader_stream(name, threads)
    try:
        first = next(stream)
        first_s = time.perf_counter() - start
        for _ in range(warmup - 1):
            next(stream)
        cpu0, t0, images = tree_cpu_seconds(), time.perf_counter(), 0
        for _ in range(batches):
            images += len(next(stream))
        seconds, cpu = time.perf_counter() - t0, tree_cpu_seconds() - cpu0
    finally:
        stream.close()
        close()
    return {"images": images, "images_per_s": images / seconds, "cpu_ms_per_image": 1000 * cpu / images,
            "first_batch_s": first_s, "shape": list(first.shape)}


def _identical(threads: int, batches: int = 3) -> dict:
    import torch

    hybrid, close_h = _hybrid_stream(threads)
    reference, close_t = _loader_stream("torchvision", threads)
    try:
        diffs = []
        for _ in range(batches):
            a, b = next(hybrid), next(reference)
            diffs.append(float((a - b).abs().max()) if a.shape == b.shape else float("inf"))
            if not torch.equal(a, b):
                break
    finally:
        hybrid.close(), reference.close()
        close_h(), close_t()
    return {"batches_compared": len(diffs), "bit_identical": all(d == 0 for d in diffs), "max_abs_diff": max(diffs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", default=str(len(os.sched_getaffinity(0))))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "dali_cpu_hybrid.json"))
    parser.add_argument("--one", nargs=2, metavar=("NAME", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        name, threads = args.one[0], int(args.one[1])
        result = _identical(threads) if name == "identical" else _one(name, threads, args.warmup, args.batches)
        print("RESULT " + json.dumps(result))
        sys.stdout.flush()
        os._exit(0)

    def run(name: str, threads: int) -> dict:
        load = open("/proc/loadavg").read().split()[0]
        proc = subprocess.run([sys.executable, __file__, "--one", name, str(threads), "--warmup", str(args.warmup),
                               "--batches", str(args.batches)], capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if not lines:
            raise SystemExit(f"{name} x{threads} failed:\n{proc.stderr[-3000:]}")
        return {**json.loads(lines[-1][7:]), "load_before": float(load)}

    threads_list = [int(t) for t in args.threads.split(",")]
    results: dict = {"identical_to_torchvision": run("identical", threads_list[-1]),
                     "stages": run("stages", threads_list[-1]), "candidates": []}
    print("hybrid vs torchvision backend:", results["identical_to_torchvision"])
    print("shipped graph, CPU ms/img after each stage:", results["stages"].get("stages_cpu_ms_per_image"))
    for threads in threads_list:
        measured: dict[str, list] = {"dali-cpu": [], "hybrid": [], "torchvision": []}
        for _ in range(args.rounds):
            for name in measured:  # interleaved rounds: drifting load hits every candidate alike
                measured[name].append(run(name, threads))
        for name, runs in measured.items():
            row = {"name": name, "threads": threads,
                   "images_per_s": statistics.median(r["images_per_s"] for r in runs),
                   "images_per_s_all": [round(r["images_per_s"], 1) for r in runs],
                   "cpu_ms_per_image": statistics.median(r["cpu_ms_per_image"] for r in runs),
                   "load_before": [r["load_before"] for r in runs]}
            results["candidates"].append(row)
            print(f"{name:12s} x{threads}: {row['images_per_s']:7.1f} img/s {row['images_per_s_all']}  "
                  f"CPU {row['cpu_ms_per_image']:.2f} ms/img  load {row['load_before']}")
    from dali_bridge.bench import machine_description
    results["machine"] = machine_description()
    results["settings"] = {"pipeline": str(PIPELINE.relative_to(REPO)), "warmup": args.warmup,
                           "batches": args.batches, "rounds": args.rounds}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
