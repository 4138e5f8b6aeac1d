#!/usr/bin/env bash
# Re-measure the main benchmark figures from a clean clone and rewrite benchmarks/README.md:
#   bash benchmarks/run_all.sh            (about 30 minutes on 2 cores; more cores, more candidates)
# Writes benchmarks/results/bench_train.{json,png} and bench_val.{json,png}, records its run in
# bench_train_fast.json (next to the longer runs benchmarks/parity_rounds.sh records there) and
# every shipped pipeline's whole-epoch compare in compare_epochs.json, the torchvision backend against
# the ceiling with its CPU by stage in bench_ceiling.json, the recipe pipelines in
# bench_recipes.json, the torchvision backend's two executors in bench_executors.json and, with
# moto and s3fs installed, shards in object storage in object_storage.json, then
# generates benchmarks/README.md from every file in results/. Measure on a quiet machine: every
# JSON records the 1-minute load average before and after each candidate.
#
# Environment: PYTHON (default .venv/bin/python, else python3), THREADS (default "1,<cores>"),
# MODEL_MS (simulated model step per 64-image batch for the starvation column, default 25 ms,
# i.e. a GPU training at ~2,560 images/s), ROUNDS (fresh processes per candidate, default 2).
source "$(dirname "${BASH_SOURCE[0]}")/script_env.sh"
mkdir -p "$OUT"
MODEL_MS="${MODEL_MS:-25}"
ROUNDS="${ROUNDS:-2}"
BASELINES="ceiling,torchvision,torchvision-pil,dali-cpu"
if "$PY" -c 'import sys; from dali_bridge.loader.select import unavailable_reason; sys.exit(unavailable_reason("dali") is not None)'; then
  BASELINES="$BASELINES,dali"   # a usable GPU: the hand-written mixed-decode DALI pipeline too
fi
if "$PY" -c 'import spdl.pipeline' 2> /dev/null; then
  BASELINES="$BASELINES,spdl,spdl-torchvision"   # the [bench] extra: SPDL's thread-pool loader
fi

bash benchmarks/system_packages.sh   # FFmpeg for spdl.io, nginx for the HTTP rows (where it can install)
echo "load average before: $(cat /proc/loadavg 2> /dev/null || echo n/a)"
"$PY" -m dali_bridge sample-data data/sample --images 2000 --classes 10 --seed 0 --if-absent -q

# The shipped train pipeline at 1 and all cores, every reference.
"$PY" -m dali_bridge bench pipelines/imagenet_train.yaml --data data/sample --backends available \
  --baselines "$BASELINES" --threads "$THREADS" --warmup 3 --batches 8 --repeat 3 --rounds "$ROUNDS" \
  --model-ms "$MODEL_MS" --json "$OUT/bench_train.json" --plot "$OUT/bench_train.png" -q

# The shipped validation pipeline (resize shorter side + centre crop), all cores.
"$PY" -m dali_bridge bench pipelines/imagenet_val.yaml --data data/sample --backends available \
  --threads "$CORES" --warmup 3 --batches 8 --repeat 3 --rounds "$ROUNDS" \
  --json "$OUT/bench_val.json" --plot "$OUT/bench_val.png" -q

# The train pipeline with `parity: fast` (plain DALI resize borders): the bridge's dali-cpu against
# the hand-written DALI pipeline doing the same operations.
"$PY" -m dali_bridge bench pipelines/imagenet_train.yaml --data data/sample --backends dali-cpu \
  --baselines ceiling,dali-cpu --threads "$CORES" --warmup 3 --batches 8 --repeat 3 --rounds "$ROUNDS" \
  --set parity=fast --set name=imagenet-train-fast --json "$SCRATCH/fast.json" -q
"$PY" -m dali_bridge.bench add-run "$OUT/bench_train_fast.json" "$SCRATCH/fast.json" --label run_all.sh

# The torchvision backend against the decode-only ceiling, with its CPU split by stage.
bash benchmarks/bench_ceiling.sh

# The recipe pipelines (augmentation policies, random erasing, batch mixing).
bash benchmarks/bench_recipes.sh

# The torchvision backend's worker processes against its threads.
bash benchmarks/bench_executors.sh

# Shards in object storage (moto's S3 server on loopback) against the same shards on disk.
if "$PY" -c 'import moto.server, s3fs' 2> /dev/null; then
  "$PY" benchmarks/object_storage.py --data data/sample
fi

# Equivalence over whole epochs of every shipped pipeline (stops the script on a FAIL).
bash benchmarks/compare_epochs.sh

"$PY" -m dali_bridge.bench readme "$OUT"/*.json --out benchmarks/README.md
echo "wrote benchmarks/README.md"
echo "load average after: $(cat /proc/loadavg 2> /dev/null || echo n/a)"
