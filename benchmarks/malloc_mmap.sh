#!/usr/bin/env bash
# What glibc's fixed mmap threshold (the dali-cpu soak's flat-memory setting) costs in throughput:
# the shipped train pipeline on dali-cpu, 2 threads, with the default allocator and with
# MALLOC_MMAP_THRESHOLD_=131072, alternating, each candidate in fresh processes (about 4 minutes).
#   bash benchmarks/malloc_mmap.sh
# Writes benchmarks/results/malloc_mmap_{default,fixed}_{1,2}.json.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-.venv/bin/python}"
OUT=benchmarks/results
bench() {
  "$PY" -m dali_bridge.cli bench pipelines/imagenet_train.yaml --data data/sample --backends dali-cpu \
    --baselines none --threads 2 --warmup 3 --batches 8 --repeat 3 --rounds 2 --json "$1" -q
}
for round in 1 2; do
  bench "$OUT/malloc_mmap_default_$round.json"
  MALLOC_MMAP_THRESHOLD_=131072 bench "$OUT/malloc_mmap_fixed_$round.json"
done
"$PY" - "$OUT" <<'PY'
import json, sys
from pathlib import Path
for kind in ("default", "fixed"):
    rows = [json.loads(p.read_text())["results"][0] for p in sorted(Path(sys.argv[1]).glob(f"malloc_mmap_{kind}_*.json"))]
    speeds = " ".join("%.0f" % r["images_per_s"] for r in rows)
    cpu = " ".join("%.2f" % r["cpu_ms_per_image"] for r in rows)
    print(f"{kind:8s} img/s {speeds}  CPU ms/img {cpu}")
PY
