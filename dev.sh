#!/usr/bin/env bash
# The project's two commands (README "Quick start"):
#   ./dev.sh run    set up .venv, generate the sample images if absent, run the shipped pipelines
#                   on every backend this host can run, print a table
#   ./dev.sh test   set up .venv and run the whole test suite (extra arguments go to pytest)
#   ./dev.sh lint   set up .venv and run the linter (ruff, configured in pyproject.toml)
set -euo pipefail
cd "$(dirname "$0")"
VENV="${DALI_BRIDGE_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV" || {
      echo "dev.sh: cannot create a virtual environment with $PYTHON (Debian/Ubuntu: apt install python3-venv)" >&2
      exit 1
    }
  fi
  local stamp="$VENV/.dali-bridge-installed"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ .ci/constraints.txt -nt "$stamp" ]; then
    "$VENV/bin/python" -m pip install -q --upgrade pip
    # The constraints pin the torch/torchvision pair the project is tested with.
    "$VENV/bin/python" -m pip install -q -c .ci/constraints.txt -e ".[test]"
    touch "$stamp"
  fi
}

case "${1:-}" in
  run)
    setup
    "$VENV/bin/dali-bridge" sample-data data/sample --images 2000 --classes 10 --seed 0 --if-absent
    "$VENV/bin/dali-bridge" run pipelines/*.yaml --backends available
    ;;
  test)
    setup
    shift
    "$VENV/bin/python" -m pytest "$@"   # exit status 5 (no test collected) fails too
    ;;
  lint)
    setup
    "$VENV/bin/ruff" check .
    ;;
  *)
    echo "usage: ./dev.sh run | ./dev.sh test [pytest arguments] | ./dev.sh lint" >&2
    exit 2
    ;;
esac
