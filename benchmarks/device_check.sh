#!/usr/bin/env bash
# The whole GPU check in one short script, for a lent CUDA machine (also runs, GPU tests skipped,
# on a CPU-only host). Nothing is installed or downloaded: the repo goes on PYTHONPATH.
#
#   bash benchmarks/device_check.sh            run the check (repo root or anywhere; results in $OUT or ./out)
#   bash benchmarks/device_check.sh --stage    HERE, before lending: copy the pure-Python test dependencies
#                                              (pytest & co., PyYAML, tqdm) into .dali/pysite to carry along
#
# Steps, each with its own time limit inside an overall budget (CHECK_BUDGET_S, default 280 s):
#   env      Python/GPU/driver facts and which modules import           -> $OUT/env.txt
#   data     a small generated ImageFolder set (CHECK_IMAGES, 512)      -> $CHECK_DATA (default /tmp)
#   doctor   dali-bridge doctor (text and JSON)                         -> $OUT/doctor.txt, doctor.json
#   pytest   tests/test_gpu.py tests/test_contract.py                   -> $OUT/pytest.txt, pytest.xml
#   run      shipped pipelines on every available backend, one epoch    -> $OUT/run.txt, run.json
#   bench    dali-bridge bench, short windows (when dali_bridge/bench.py exists) -> $OUT/bench.txt, bench.json
# $OUT/summary.txt lists each step's exit status and seconds; the script exits 1 if any step failed.
#
# DALI on the lent machine: follow ../shared/device/DALI-ON-DEVICE.md; a DALI installed into
# .dali/site is picked up automatically. Python packages the machine lacks are taken from
# .dali/pysite (made by --stage) after the machine's own.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

if [ "${1:-}" = "--stage" ]; then
  SRC_PY="${STAGE_PYTHON:-$REPO/.venv/bin/python}"
  DEST="$REPO/.dali/pysite"
  rm -rf "$DEST" && mkdir -p "$DEST"
  # Pure-Python packages only (PyYAML's C speedup, if copied, fails to load on another Python and
  # PyYAML falls back to its pure-Python parser).
  "$SRC_PY" - "$DEST" <<'EOF'
import importlib.util, shutil, sys, pathlib
dest = pathlib.Path(sys.argv[1])
for name in ("pytest", "_pytest", "pluggy", "iniconfig", "packaging", "py", "yaml", "tqdm"):
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        print(f"stage: {name} not found in {sys.executable}, skipped")
        continue
    origin = pathlib.Path(spec.origin)
    if origin.name == "__init__.py":
        shutil.copytree(origin.parent, dest / origin.parent.name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    else:
        shutil.copy2(origin, dest / origin.name)
    print(f"stage: {name}")
EOF
  du -sh "$DEST"
  echo "carry \".dali/pysite\" with the device call"
  exit 0
fi

OUT="${OUT:-$REPO/out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
BUDGET="${CHECK_BUDGET_S:-280}"
DATA="${CHECK_DATA:-${TMPDIR:-/tmp}/dali-bridge-check-data}"
IMAGES="${CHECK_IMAGES:-512}"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
[ -d "$REPO/.dali/site" ] && export PYTHONPATH="$REPO/.dali/site:$PYTHONPATH"
[ -d "$REPO/.dali/pysite" ] && export PYTHONPATH="$PYTHONPATH:$REPO/.dali/pysite"   # the machine's own win
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
START=$(date +%s)
FAILED=0
: > "$OUT/summary.txt"

# step NAME MAX_SECONDS LOGFILE command...: run with a limit inside the remaining budget; record rc and time.
step() {
  local name="$1" limit="$2" log="$3"; shift 3
  local left=$(( BUDGET - ($(date +%s) - START) ))
  if [ "$left" -lt 15 ]; then
    echo "$name: skipped (budget of ${BUDGET}s spent)" | tee -a "$OUT/summary.txt"
    FAILED=1
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$(date +%s)
  echo "== $name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" > "$log" 2>&1
  local rc=$?
  local took=$(( $(date +%s) - t0 ))
  tail -n 25 "$log"
  [ "$rc" -eq 124 ] && echo "$name: TIMED OUT after ${limit}s" >> "$log"
  echo "$name: rc=$rc ${took}s log=$(basename "$log")" | tee -a "$OUT/summary.txt"
  [ "$rc" -ne 0 ] && FAILED=1
}

env_report() {
  echo "date: $(date -u +%FT%TZ)  host: $(hostname)  cores: $(nproc)"
  echo "python: $($PY -c 'import sys; print(sys.version.split()[0], sys.executable)')"
  echo "PYTHONPATH: $PYTHONPATH"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
    || echo "nvidia-smi: not found"
  $PY - <<'EOF'
import importlib
for name in ("torch", "torchvision", "numpy", "PIL", "yaml", "tqdm", "pytest", "scipy", "nvidia.dali"):
    try:
        module = importlib.import_module(name)
        print(f"import {name:<12} ok  {getattr(module, '__version__', '')}  {getattr(module, '__file__', '')}")
    except Exception as exc:
        print(f"import {name:<12} MISSING  {type(exc).__name__}: {exc}")
import torch
print("torch.cuda.is_available:", torch.cuda.is_available(), "devices:", torch.cuda.device_count(),
      "torch CUDA build:", torch.version.cuda)
# dali_bridge must import (and build a loader) without the optional extras, e.g. tqdm.
import dali_bridge
from dali_bridge import build_loader  # noqa: F401
print("dali_bridge", dali_bridge.__version__, "from", dali_bridge.__file__)
EOF
}

export PY
export -f env_report
step env 60 "$OUT/env.txt" bash -c env_report
step data 60 "$OUT/data.txt" $PY -m dali_bridge.cli sample-data "$DATA" --images "$IMAGES" --classes 8 --seed 0 --if-absent -q
step doctor 60 "$OUT/doctor.txt" $PY -m dali_bridge.cli doctor
$PY -m dali_bridge.cli doctor --json > "$OUT/doctor.json" 2> /dev/null || true

if $PY -c "import pytest" 2> /dev/null; then
  step pytest 170 "$OUT/pytest.txt" $PY -m pytest tests/test_gpu.py tests/test_contract.py -q -rs \
    -p no:cacheprovider --junitxml="$OUT/pytest.xml"
else
  echo "pytest: NOT RUN (pytest is not importable here; run 'bash benchmarks/device_check.sh --stage' before lending and carry .dali/pysite)" \
    | tee -a "$OUT/summary.txt"
  FAILED=1
fi

step run 90 "$OUT/run.txt" $PY -m dali_bridge.cli run pipelines/imagenet_train.yaml pipelines/imagenet_val.yaml \
  --backends available --data "$DATA" --json "$OUT/run.json" -q

if [ -f "$REPO/dali_bridge/bench.py" ]; then
  step bench 150 "$OUT/bench.txt" $PY -m dali_bridge.cli bench pipelines/imagenet_train.yaml --data "$DATA" \
    --backends available --batches 6 --warmup 2 --repeat 3 --json "$OUT/bench.json" -q
else
  echo "bench: not run (dali_bridge/bench.py is absent in this tree)" | tee -a "$OUT/summary.txt"
fi

echo "total: $(( $(date +%s) - START ))s, results in $OUT" | tee -a "$OUT/summary.txt"
exit $FAILED
