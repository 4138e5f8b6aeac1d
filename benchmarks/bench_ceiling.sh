#!/usr/bin/env bash
# The torchvision backend against the decode-only ceiling on the shipped train pipeline, with where its
# CPU goes stage by stage over the timed windows (loader.stats()["stages"]) and the share of the
# ceiling that split leaves reachable: recorded in benchmarks/results/bench_ceiling.json.
#   bash benchmarks/bench_ceiling.sh          (about 5 minutes on 2 cores: at 1 thread and at all cores)
# A quick check that the script runs, its figures not worth recording, into another folder:
#   THREADS=2 WINDOWS="--warmup 3 --batches 2 --repeat 1 --rounds 1" RESULTS=/tmp/ceiling bash benchmarks/bench_ceiling.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_env.sh"
WINDOWS="${WINDOWS:---warmup 10 --batches 8 --repeat 3 --rounds 3}"
RESULTS="${RESULTS:-$OUT}"
mkdir -p "$RESULTS"
"$PY" -m dali_bridge sample-data data/sample --images 2000 --classes 10 --seed 0 --if-absent -q
"$PY" -m dali_bridge bench pipelines/imagenet_train.yaml --data data/sample --backends torchvision \
  --baselines ceiling --threads "$THREADS" $WINDOWS --json "$SCRATCH/ceiling.json" -q
"$PY" -m dali_bridge.bench add-run "$RESULTS/bench_ceiling.json" "$SCRATCH/ceiling.json" --label imagenet_train \
  --title "The torchvision backend against the decode-only ceiling, by stage"
