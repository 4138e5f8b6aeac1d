#!/usr/bin/env bash
# The torchvision backend's two executors on the shipped train pipeline: DataLoader worker processes
# (loader.executor: processes, the default) against threads of the loader's process
# (loader.executor: threads), each run beside the decode ceiling, the hand-written torchvision
# DataLoader and the SPDL thread-pool baseline, at 1 and all cores. Recorded under each executor's
# name in benchmarks/results/bench_executors.json.
#   bash benchmarks/bench_executors.sh          (about 4 minutes on 2 cores)
source "$(dirname "${BASH_SOURCE[0]}")/script_env.sh"
BASELINES="ceiling,torchvision"
if "$PY" -c 'import spdl.pipeline' 2> /dev/null; then
  BASELINES="$BASELINES,spdl"   # the [bench] extra: SPDL's thread pool (spdl.io where FFmpeg loads)
fi
"$PY" -m dali_bridge sample-data data/sample --images 2000 --classes 10 --seed 0 --if-absent -q
rm -f "$OUT/bench_executors.json"   # one file, both executors from this run
for executor in processes threads; do
  "$PY" -m dali_bridge bench pipelines/imagenet_train.yaml --data data/sample --backends torchvision \
    --baselines "$BASELINES" --threads "$THREADS" --warmup 3 --batches 8 --repeat 3 --rounds 2 \
    --set loader.executor=$executor --json "$SCRATCH/$executor.json" -q
  "$PY" -m dali_bridge.bench add-run "$OUT/bench_executors.json" "$SCRATCH/$executor.json" \
    --label "loader.executor: $executor" --title "The torchvision backend's executors"
done
