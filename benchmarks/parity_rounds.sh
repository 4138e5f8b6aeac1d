#!/usr/bin/env bash
# The bridge's dali-cpu against the hand-written DALI pipeline doing the same operations, over more
# fresh processes than run_all.sh gives it (5 and 10 rounds, 2 threads), with each resampling
# parity: `parity: exact` (the default, torchvision's resize) and `parity: fast` (DALI's plain resize).
#   bash benchmarks/parity_rounds.sh          (about 25 minutes on 2 cores)
# Records the runs "5 rounds" and "10 rounds" in benchmarks/results/bench_train_exact.json and
# bench_train_fast.json (replacing those of the same label; run_all.sh's own run in the fast file
# stays), then rewrites benchmarks/README.md. Measure on a quiet machine.
source "$(dirname "${BASH_SOURCE[0]}")/script_env.sh"
"$PY" -m dali_bridge sample-data data/sample --images 2000 --classes 10 --seed 0 --if-absent -q
for parity in exact fast; do
  title="dali-cpu against the hand-written DALI pipeline, \`parity: $parity\`"
  [ "$parity" = exact ] && title="$title (default)"
  for rounds in 5 10; do
    "$PY" -m dali_bridge bench pipelines/imagenet_train.yaml --data data/sample --backends dali-cpu \
      --baselines dali-cpu --threads 2 --warmup 3 --batches 8 --repeat 3 --rounds "$rounds" \
      --set parity="$parity" --set name="imagenet-train-$parity" --json "$SCRATCH/run.json" -q
    "$PY" -m dali_bridge.bench add-run "$OUT/bench_train_$parity.json" "$SCRATCH/run.json" \
      --label "$rounds rounds" --title "$title"
  done
done
"$PY" -m dali_bridge.bench readme "$OUT"/*.json --out benchmarks/README.md
echo "wrote benchmarks/README.md"
