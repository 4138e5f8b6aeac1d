# Sourced by the benchmark scripts: stop at the first failure, run from the repository root with
# the project's Python (PYTHON, else .venv/bin/python, else python3); OUT is the results folder,
# SCRATCH a folder removed on exit, CORES the cores this process may use and THREADS the thread
# counts to measure (default "1,<cores>").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
OUT=benchmarks/results
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
CORES=$("$PY" -c 'import os; print(len(os.sched_getaffinity(0)))')
THREADS="${THREADS:-$( [ "$CORES" -gt 1 ] && echo "1,$CORES" || echo 1 )}"
