#!/usr/bin/env bash
# The system libraries the benchmarks' peers and servers use, from the distribution's packages:
# FFmpeg's shared libraries for spdl.io's decode (the `spdl` baselines) and nginx with its echo
# module for the object-storage benchmark's HTTP rows. Installed with apt-get where this runs as
# root on a Debian-like system and they are missing; otherwise it says what is missing and the
# benchmarks skip those rows with the reason.
#   bash benchmarks/system_packages.sh
set -uo pipefail
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
# FFmpeg 5.1 (Debian 12's): spdl's wheels carry bindings for FFmpeg 4 to 9 and load the one present.
ffmpeg="libavutil57 libavcodec59 libavformat59 libavfilter8 libavdevice59 libswscale6 libswresample4"
web="nginx libnginx-mod-http-echo"
missing=""
for package in $ffmpeg $web; do
  dpkg-query -W -f='${Status}' "$package" 2> /dev/null | grep -q "install ok installed" || missing="$missing $package"
done
if [ -z "$missing" ]; then
  echo "system packages: all present"
elif [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
  echo "system packages: installing$missing"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing > /dev/null \
    || echo "system packages: apt-get could not install$missing; the rows that need them are skipped"
else
  echo "system packages: missing$missing (needs root and apt-get); the rows that need them are skipped"
fi
"$PY" -c 'from dali_bridge.bench.spdl_baseline import spdl_io_problem as p; print("spdl.io:", p() or "decodes")' \
  2> /dev/null || true
