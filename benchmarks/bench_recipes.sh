#!/usr/bin/env bash
# The recipe pipelines (torchvision's ResNet-50 recipe with TrivialAugmentWide, random erasing and
# MixUp/CutMix; timm's RandAugment defaults): each backend against the decode ceiling and, where
# transforms.v2 has the same transforms, a hand-written DataLoader doing them. Recorded under each
# pipeline's name in benchmarks/results/bench_recipes.json.
#   bash benchmarks/bench_recipes.sh          (about 12 minutes on 2 cores: at 1 thread and at all cores)
# 30 warm-up batches: a fresh dali-cpu loader takes 20-30 batches of 128 to reach its pace here (memory
# first touched: its shared input buffers grow to the largest batch), torchvision about 10.
# Each dali-cpu row records its images/s over the torchvision backend's at the same thread count
# (vs_torchvision; the table's "× torchvision" column).
# A quick check that the script runs, its figures not worth recording, into another folder:
#   THREADS=2 WINDOWS="--warmup 3 --batches 2 --repeat 1 --rounds 1" RESULTS=/tmp/recipes bash benchmarks/bench_recipes.sh
source "$(dirname "${BASH_SOURCE[0]}")/script_env.sh"
WINDOWS="${WINDOWS:---warmup 30 --batches 8 --repeat 3 --rounds 2}"
RESULTS="${RESULTS:-$OUT}"
mkdir -p "$RESULTS"
"$PY" -m dali_bridge sample-data data/sample --images 2000 --classes 10 --seed 0 --if-absent -q
# timm's RandAugment variant has no transforms.v2 counterpart: no hand-written baseline (the ceiling only).
for spec in "torchvision_recipe_train:ceiling,torchvision" "timm_train:ceiling"; do
  name=${spec%%:*}
  "$PY" -m dali_bridge bench "pipelines/$name.yaml" --backends available --baselines "${spec##*:}" \
    --threads "$THREADS" $WINDOWS --json "$SCRATCH/$name.json" -q
  "$PY" -m dali_bridge.bench add-run "$RESULTS/bench_recipes.json" "$SCRATCH/$name.json" --label "$name" \
    --title "The recipe pipelines"
done
