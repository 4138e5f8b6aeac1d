#!/usr/bin/env bash
# What glibc's fixed mmap threshold (the dali-cpu soak's flat-memory setting) costs in throughput:
# the shipped train pipeline on dali-cpu, 2 threads, with the default allocator and with
# MALLOC_MMAP_THRESHOLD_=131072, alternating, each candidate in fresh processes (about 4 minutes).
#   bash benchmarks/malloc_mmap.sh
# Records the four runs in benchmarks/results/malloc_mmap.json (replacing those of the same label).
source "$(dirname "${BASH_SOURCE[0]}")/script_env.sh"
RUNS=benchmarks/results/malloc_mmap.json
bench() {
  "$PY" -m dali_bridge bench pipelines/imagenet_train.yaml --data data/sample --backends dali-cpu \
    --baselines none --threads 2 --warmup 3 --batches 8 --repeat 3 --rounds 2 --json "$SCRATCH/run.json" -q
}
for round in 1 2; do
  bench
  "$PY" -m dali_bridge.bench add-run "$RUNS" "$SCRATCH/run.json" --label "default allocator, round $round"
  MALLOC_MMAP_THRESHOLD_=131072 bench
  "$PY" -m dali_bridge.bench add-run "$RUNS" "$SCRATCH/run.json" --label "MALLOC_MMAP_THRESHOLD_=131072, round $round" \
    --env MALLOC_MMAP_THRESHOLD_=131072
done
"$PY" -m dali_bridge.bench readme "$RUNS"
