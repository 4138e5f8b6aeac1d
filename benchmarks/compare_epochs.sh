#!/usr/bin/env bash
# Equivalence over whole epochs: every shipped pipeline, dali-cpu against torchvision, over the
# 2,000-image sample set; each run recorded under its pipeline's name in
# benchmarks/results/compare_epochs.json (the test suite's small samples cannot see a 1-in-640
# pixel off by 2 levels; a whole epoch can). Exits non-zero on the first FAIL.
#   bash benchmarks/compare_epochs.sh          (about 3 minutes on 2 cores)
source "$(dirname "${BASH_SOURCE[0]}")/script_env.sh"
"$PY" -m dali_bridge sample-data data/sample --images 2000 --classes 10 --seed 0 --if-absent -q
for pipeline in pipelines/*.yaml; do
  name=$(basename "$pipeline" .yaml)
  COMPARE="compare $pipeline --data data/sample --backends dali-cpu,torchvision --batches 0"
  "$PY" -m dali_bridge $COMPARE --json "$SCRATCH/$name.json"
  "$PY" -m dali_bridge.bench add-run "$OUT/compare_epochs.json" "$SCRATCH/$name.json" --label "$name" \
    --title "Equivalence over whole epochs (dali-cpu vs torchvision)" --command "dali-bridge $COMPARE"
done
