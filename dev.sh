#!/usr/bin/env bash
# The project's two commands (README "Quick start"):
#   ./dev.sh run    set up .venv, generate the sample images if absent, run the shipped pipelines
#                   on every backend this host can run, print a table (500 images; --full: 2,000)
#   ./dev.sh test   set up .venv and run the whole test suite (extra arguments go to pytest)
#   ./dev.sh lint   set up .venv and run the linter (ruff, configured in pyproject.toml)
# `run` installs what running needs (dali-bridge with DALI's CUDA 12 build, [cuda12]); `test` and
# `lint` add the test extras ([test]). Both at the versions .ci/constraints.txt pins, so pip
# resolves at once; pip's whole log goes to $VENV/pip-install.log, a summary to the terminal.
set -euo pipefail
cd "$(dirname "$0")"
VENV="${DALI_BRIDGE_VENV:-.venv}"
PYTHON="${PYTHON:-python3}"
LOG="$VENV/pip-install.log"

say() { echo "dev.sh: $*" >&2; }

# install EXTRAS: dali-bridge (editable) with EXTRAS, unless a stamp newer than pyproject.toml and the
# constraints says an install with them (or with more) is done.
install() {
  local extras=$1 stamp="$VENV/.dali-bridge-installed-${1//,/-}"
  local fuller="$VENV/.dali-bridge-installed-test-cuda12"
  for done in "$stamp" "$fuller"; do
    if [ -f "$done" ] && [ "$done" -nt pyproject.toml ] && [ "$done" -nt .ci/constraints.txt ]; then
      return 0
    fi
  done
  local start=$SECONDS
  if [ -f "$VENV/.dali-bridge-installed-cuda12" ] || [ -f "$fuller" ]; then
    say "installing dali-bridge[$extras] into $VENV, pinned by .ci/constraints.txt"
  else
    say "installing dali-bridge[$extras] into $VENV, pinned by .ci/constraints.txt (first time: a few minutes, ~6.7 GB)"
  fi
  say "pip's log: $LOG (tail -f it to follow)"
  {
    echo "==== $(date -u '+%Y-%m-%d %H:%M:%S UTC') pip install -c .ci/constraints.txt -e .[$extras]"
    "$VENV/bin/python" -m pip install --progress-bar off -c .ci/constraints.txt -e ".[$extras]"
  } >>"$LOG" 2>&1 || {
    tail -n 15 "$LOG" >&2
    say "the install failed (above: the end of pip's log; all of it: $LOG)"
    exit 1
  }
  # pip's last line names what it installed: "Successfully installed a-1.0 b-2.0 ..."
  local installed
  installed=$(tail -n 5 "$LOG" | sed -n 's/^Successfully installed //p' | tail -n 1)
  local count=0 main=""
  if [ -n "$installed" ]; then
    count=$(wc -w <<<"$installed")
    main=$(tr ' ' '\n' <<<"$installed" | grep -E '^(torch|torchvision|nvidia-dali-cuda[0-9]+|timm|lightning)-[0-9]' \
           | tr '\n' ' ' || true)
  fi
  say "installed $count package(s) in $((SECONDS - start)) s${main:+: ${main% }}"
  touch "$stamp"
}

setup() {
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    "$PYTHON" -m venv "$VENV" || {
      echo "dev.sh: cannot create a virtual environment with $PYTHON (Debian/Ubuntu: apt install python3-venv)" >&2
      exit 1
    }
  fi
  install "$1"
}

case "${1:-}" in
  run)
    # 500 images keep the first run to a few minutes on 2 cores; --full runs the 2,000-image set.
    images=500
    if [ "${2:-}" = "--full" ]; then images=2000; elif [ -n "${2:-}" ]; then
      echo "usage: ./dev.sh run [--full]" >&2; exit 2
    fi
    setup cuda12
    say "generating $images sample images in data/sample (if absent)"
    "$VENV/bin/dali-bridge" sample-data data/sample --images "$images" --classes 10 --seed 0 --if-absent
    say "running every shipped pipeline on every backend this host can run"
    "$VENV/bin/dali-bridge" run pipelines/*.yaml --backends available
    ;;
  test)
    setup test,cuda12
    shift
    "$VENV/bin/python" -m pytest "$@"   # exit status 5 (no test collected) fails too
    ;;
  lint)
    setup test,cuda12
    "$VENV/bin/ruff" check .
    ;;
  *)
    echo "usage: ./dev.sh run [--full] | ./dev.sh test [pytest arguments] | ./dev.sh lint" >&2
    exit 2
    ;;
esac
