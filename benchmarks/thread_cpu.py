"""Images/s and CPU per image of each thread of a loader (its process and its children), over
timed batches after a warm-up: where a backend's CPU goes, thread by thread, from /proc.
  python benchmarks/thread_cpu.py pipelines/timm_train.yaml dali-cpu [--workers 2 --warmup 30 --batches 16]
Linux only. To compare two versions of the code, alternate fresh runs of each (PYTHONPATH=<checkout>)."""
from __future__ import annotations

import argparse
import glob
import os
import threading
import time
from typing import Iterator

from dali_bridge import build_loader

TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[tuple[int, int, str], tuple[float, int]]:
    """(pid, tid, name) → (CPU seconds, minor faults) of this process's threads and its children's."""
    pids = [os.getpid()]
    try:
        with open(f"/proc/{os.getpid()}/task/{os.getpid()}/children") as children:
            pids += [int(pid) for pid in children.read().split()]
    except OSError:
        pass
    found = {}
    for pid in pids:
        for task in glob.glob(f"/proc/{pid}/task/*"):
            try:
                with open(f"{task}/stat") as stat:
                    text = stat.read()
            except OSError:  # a thread that ended meanwhile
                continue
            name, fields = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
            cpu = (int(fields[11]) + int(fields[12])) / TICK  # utime + stime
            found[(pid, int(task.rsplit("/", 1)[1]), name)] = (cpu, int(fields[7]))  # minflt
    return found


def batches(loader) -> Iterator:
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pipeline")
    parser.add_argument("backend")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=30, help="batches before timing")
    parser.add_argument("--batches", type=int, default=16, help="timed batches")
    args = parser.parse_args()
    loader = build_loader(args.pipeline, args.backend, overrides={"loader.workers": args.workers})
    stream = batches(loader)
    for _ in range(args.warmup):
        next(stream)
    before, start, images = thread_cpu(), time.perf_counter(), 0
    for _ in range(args.batches):
        images += len(next(stream)[0])
    wall, after = time.perf_counter() - start, thread_cpu()
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    print(f"{args.backend} {args.pipeline}: {images / wall:.0f} img/s")
    rows = [(cpu - before.get(key, (0.0, 0))[0], key, (faults - before.get(key, (0.0, 0))[1]) / args.batches)
            for key, (cpu, faults) in after.items()]
    for cpu, (pid, tid, name), faults in sorted(rows, reverse=True):
        if cpu > 0.02:
            print(f"  {pid:>7} {tid:>7} {name:<16} {names.get(tid, ''):<28} {cpu / images * 1000:.3f} ms/img"
                  f"  {faults:.0f} faults/batch")
    total = sum(cpu for cpu, _, _ in rows)
    print(f"  total {total / images * 1000:.3f} ms/img, cores busy {total / wall:.2f}")
    loader.close()


if __name__ == "__main__":
    main()
