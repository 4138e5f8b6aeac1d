#!/usr/bin/env bash
# The project's two commands (README "Quick start"):
#   ./dev.sh run    set up .venv, generate the sample images if absent, run the shipped pipelines
#                   on every backend this host can run, print a table (500 images; --full: 2,000)
#   ./dev.sh test   set up .venv and run the whole test suite (extra arguments go to pytest)
#   ./dev.sh lint   set up .venv and run the linter (ruff, configured in pyproject.toml)
set -euo pipefail
cd "$(dirname "$0")"
VENV="${DALI_BRIDGE_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"

say() { echo "dev.sh: $*" >&2; }

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    "$PYTHON" -m venv "$VENV" || {
      echo "dev.sh: cannot create a virtual environment with $PYTHON (Debian/Ubuntu: apt install python3-venv)" >&2
      exit 1
    }
  fi
  local stamp="$VENV/.dali-bridge-installed"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ .ci/constraints.txt -nt "$stamp" ]; then
    # The first install takes a few minutes and about 6.7 GB (torch's CUDA build and DALI); pip's own
    # lines show its progress, in a log as on a terminal.
    say "installing dali-bridge and its dependencies into $VENV (first time: a few minutes, ~6.7 GB)"
    local start=$SECONDS
    "$VENV/bin/python" -m pip install -q --upgrade pip
    # The constraints pin the torch/torchvision pair the project is tested with.
    "$VENV/bin/python" -m pip install --progress-bar off -c .ci/constraints.txt -e ".[test]"
    touch "$stamp"
    say "installed in $((SECONDS - start)) s"
  fi
}

case "${1:-}" in
  run)
    # 500 images keep the first run to a few minutes on 2 cores; --full runs the 2,000-image set.
    images=500
    if [ "${2:-}" = "--full" ]; then images=2000; elif [ -n "${2:-}" ]; then
      echo "usage: ./dev.sh run [--full]" >&2; exit 2
    fi
    setup
    say "generating $images sample images in data/sample (if absent)"
    "$VENV/bin/dali-bridge" sample-data data/sample --images "$images" --classes 10 --seed 0 --if-absent
    say "running every shipped pipeline on every backend this host can run"
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
    echo "usage: ./dev.sh run [--full] | ./dev.sh test [pytest arguments] | ./dev.sh lint" >&2
    exit 2
    ;;
esac
