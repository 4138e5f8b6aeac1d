"""``loader.executor: ray`` against local workers: img/s and what the trainer's process spends per image.

Starts a local multi-node Ray cluster (``ray.cluster_utils.Cluster``: a head with no CPUs for tasks
and ``--nodes`` raylets of ``--node-cpus`` CPUs each, all on this machine, on 127.0.0.1), then runs
the same pipeline, in a fresh process each, on:

* **local workers**: ``loader.executor: processes`` with ``--workers`` DataLoader workers;
* **ray**: ``loader.executor: ray`` on the cluster, ``loader.ray.cpus`` = the cluster's CPUs.

For each, after ``--warmup`` batches (the workers' start), ``--batches`` batches are timed:

* **img/s** over those batches;
* **trainer CPU ms/img**: user + system CPU of the trainer's process and its threads — with local
  workers also its DataLoader worker processes (they run on the trainer's host); with ``ray``
  the trainer's process alone, which is what stays on the GPU host (the Ray workers run on the
  cluster's nodes: here on this machine, elsewhere on other machines);
* **cluster CPU ms/img** (``ray``): the CPU of the raylets' worker processes over the same batches.

The figure that decides how far ``ray`` scales is the trainer's CPU per image: the trainer feeds
its GPUs at most ``cores ÷ CPU per image`` images a second. Every node here shares this machine's
cores, so img/s says what a small cluster does on one host, not what a cluster of many does.

    .venv/bin/python benchmarks/ray_executor.py --data data/sample
    .venv/bin/python benchmarks/ray_executor.py --quick --data DIR --out /tmp/ray.json   # smoke run

It writes ``--out`` (default ``benchmarks/results/ray_executor.json``) with the machine and the
command; ``python -m dali_bridge.bench readme benchmarks/results/*.json --out benchmarks/README.md``
renders it. Needs the ``[ray]`` extra.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
# Ray names this host's outward address for 127.0.0.1 unless told, before it is imported, that the
# cluster is this host alone: every raylet here listens on loopback.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

from dali_bridge.bench.procstats import tree_cpu_seconds  # noqa: E402
from dali_bridge.bench.ray_report import RAY_EXECUTOR_FORMAT  # noqa: E402
from dali_bridge.bench.results import loadavg, machine_description  # noqa: E402

PIPELINE = REPO / "pipelines" / "imagenet_train.yaml"


def _self_cpu() -> float:
    """User + system CPU seconds of this process and its threads (not its children)."""
    times = os.times()
    return times.user + times.system


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """In a fresh process: one run of the pipeline, as ``--executor`` says; its figures as JSON."""
    import torch  # noqa: F401  (imported before timing)

    from dali_bridge import build_loader

    overrides: dict[str, Any] = {"source": {"type": "folder", "root": str(Path(args.data).resolve())},
                                 "batch_size": args.batch_size, "loader.executor": args.executor}
    if args.executor == "ray":
        overrides["loader.ray"] = {"address": args.address, "cpus": args.cluster_cpus}
    else:
        overrides["loader.workers"] = args.workers
    loader = build_loader(PIPELINE, "torchvision", overrides=overrides)
    iterator = iter(loader)
    for _ in range(args.warmup):
        next(iterator)
    me = os.getpid()
    cluster_pids = [int(p) for p in args.cluster_pids.split(",") if p]
    start_wall, start_self, start_tree = time.perf_counter(), _self_cpu(), tree_cpu_seconds(me)
    start_cluster = sum(tree_cpu_seconds(pid) for pid in cluster_pids)
    images = 0
    for _ in range(args.batches):
        images += len(next(iterator)[0])
    wall = time.perf_counter() - start_wall
    trainer = (_self_cpu() - start_self) if args.executor == "ray" else (tree_cpu_seconds(me) - start_tree)
    cluster = sum(tree_cpu_seconds(pid) for pid in cluster_pids) - start_cluster
    stats = loader.stats()
    loader.close()
    row = {"executor": args.executor, "images": images, "seconds": wall, "images_per_s": images / wall,
           "trainer_cpu_ms_per_image": 1000 * trainer / images,
           "trainer_process_cpu_ms_per_image": 1000 * (_self_cpu() - start_self) / images}
    if args.executor == "ray":
        row["cluster_cpu_ms_per_image"] = 1000 * cluster / images
        row["stalls"] = stats.get("executor", {})
    else:
        row["workers"] = args.workers
    return row


def _child(args: argparse.Namespace, executor: str, *, address: str = "", cluster_pids: list[int] = ()) -> dict:
    command = [sys.executable, __file__, "--child", "--executor", executor, "--data", args.data,
               "--batch-size", str(args.batch_size), "--warmup", str(args.warmup), "--batches", str(args.batches),
               "--workers", str(args.workers), "--cluster-cpus", str(args.nodes * args.node_cpus),
               "--address", address, "--cluster-pids", ",".join(map(str, cluster_pids))]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    if done.returncode != 0:
        raise SystemExit(f"{executor} run failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    # The raylets' workers import this checkout's dali_bridge, as the measuring processes do.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    started, loads = time.monotonic(), [loadavg()[:1]]
    rows = []
    for _ in range(args.rounds):
        rows.append(_child(args, "processes"))
        loads.append(loadavg()[:1])
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False,
                                                            "node_ip_address": "127.0.0.1"})
    try:
        nodes = [cluster.add_node(num_cpus=args.node_cpus, node_ip_address="127.0.0.1") for _ in range(args.nodes)]
        cluster.wait_for_nodes()
        raylets = [node.all_processes["raylet"][0].process.pid for node in nodes]
        for _ in range(args.rounds):
            rows.append(_child(args, "ray", address=cluster.address, cluster_pids=raylets))
            loads.append(loadavg()[:1])
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
    machine = machine_description()
    flat = [value for load in loads for value in load]
    return {"format": RAY_EXECUTOR_FORMAT, "command": " ".join(["python", "benchmarks/ray_executor.py",
                                                                 *sys.argv[1:]]),
            "machine": {"cpu": machine.get("cpu_model"), "cpus": machine.get("cpu_cores_available"),
                        "platform": machine.get("platform"), "ram_gib": machine.get("ram_gib"),
                        "versions": {**machine.get("versions", {}), "ray": ray.__version__},
                        "load_average_1min_range": [min(flat), max(flat)] if flat else None},
            "pipeline": PIPELINE.name, "batch_size": args.batch_size, "warmup": args.warmup, "batches": args.batches,
            "workers": args.workers, "nodes": args.nodes, "node_cpus": args.node_cpus, "rounds": args.rounds,
            "quick": args.quick, "run_s": time.monotonic() - started, "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(REPO / "data" / "sample"), help="an image folder (class subfolders)")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "ray_executor.json"))
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3, help="batches before the timing (the workers' start)")
    parser.add_argument("--batches", type=int, default=40, help="batches timed")
    parser.add_argument("--workers", type=int, default=2, help="local DataLoader workers")
    parser.add_argument("--nodes", type=int, default=2, help="Ray worker nodes (raylets) on this machine")
    parser.add_argument("--node-cpus", type=int, default=1, help="CPUs of each worker node")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each executor, alternating")
    parser.add_argument("--timeout", type=int, default=240, help="seconds one run may take")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 + 3 batches of 8, one round")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--executor", help=argparse.SUPPRESS)
    parser.add_argument("--address", default="", help=argparse.SUPPRESS)
    parser.add_argument("--cluster-cpus", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--cluster-pids", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args)))
        return 0
    if args.quick:
        args.batch_size, args.warmup, args.batches, args.rounds = 8, 2, 3, 1
    report = run(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    for row in report["rows"]:
        print(f"{row['executor']:>9}: {row['images_per_s']:7.1f} img/s, trainer {row['trainer_cpu_ms_per_image']:.2f} "
              f"CPU ms/img" + (f", cluster {row['cluster_cpu_ms_per_image']:.2f}" if "cluster_cpu_ms_per_image" in row
                               else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
