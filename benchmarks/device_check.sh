#!/usr/bin/env bash
# The whole GPU check in one short run, for a CUDA machine with no internet access: nothing is
# installed or downloaded, the repo goes on PYTHONPATH. Results: device_check.json (plus pytest.xml,
# bench.json, bench_threads.json) directly in OUTDIR; scratch data in a temporary folder outside it
# (CHECK_WORK to choose it). The last lines printed are a one-screen summary.
#
#   bash benchmarks/device_check.sh [OUTDIR]            run every check (OUTDIR, else $OUT, else ./out)
#   bash benchmarks/device_check.sh --dry-run [OUTDIR]  the same control flow on a CPU host: GPU parts
#                                                       reported skipped, the rest run with CPU stand-ins
#   bash benchmarks/device_check.sh --stage             on the build host: copy the pure-Python test
#                                                       dependencies (pytest & co., PyYAML, tqdm) into
#                                                       .dali/pysite to carry to the GPU machine
#
# CHECK_BUDGET_S (default 360) bounds the checks. Each check's expected seconds on one H100 with 16 cores
# (estimates: benchmarks/device_check.py says what each does; the run prints them first):
#   env 15, data 10, device 25, equivalence 50, errors 30, sync 25, pytest 90, memory_bench 80 (325 in all)
# With the DALI install before it (about 90 s of device time: the parts' calls and install-dali.sh), 415 s
# of the 15 device minutes: room for one rerun on the warm machine. A check whose expected time no longer
# fits what is left is skipped and said so. CHECK_IMAGES (default 256) sizes the generated set;
# CHECK_DATA names an ImageFolder to use instead. Exit status 0 only when every check that ran passed
# (a check's process that hangs at exit after writing its result is reported as such, not failed).
#
# DALI on a machine without internet access: bring its wheels along and install them into
# .dali/site, which is picked up automatically. Python packages the machine lacks are taken from
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

DRY=()
if [ "${1:-}" = "--dry-run" ]; then
  DRY=(--dry-run)
  shift
fi
OUTDIR="${1:-${OUT:-$REPO/out}}"
mkdir -p "$OUTDIR"
PY="${PYTHON:-python3}"
[ -x "$REPO/.venv/bin/python" ] && [ -z "${PYTHON:-}" ] && PY="$REPO/.venv/bin/python"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
[ -d "$REPO/.dali/site" ] && export PYTHONPATH="$REPO/.dali/site:$PYTHONPATH"
[ -d "$REPO/.dali/pysite" ] && export PYTHONPATH="$PYTHONPATH:$REPO/.dali/pysite"   # the machine's own win
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

ARGS=(--out "$OUTDIR" --budget "${CHECK_BUDGET_S:-360}")
[ -n "${CHECK_IMAGES:-}" ] && ARGS+=(--images "$CHECK_IMAGES")
[ -n "${CHECK_DATA:-}" ] && ARGS+=(--data "$CHECK_DATA")
[ -n "${CHECK_WORK:-}" ] && ARGS+=(--work "$CHECK_WORK")
# A hard stop a little past the budget, should the orchestrator itself hang.
timeout --kill-after=10 $(( ${CHECK_BUDGET_S:-360} + 30 )) "$PY" benchmarks/device_check.py "${ARGS[@]}" ${DRY[@]+"${DRY[@]}"}
