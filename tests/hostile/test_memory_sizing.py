"""Images the plan makes on the way to a small output are sized against the memory cap before the first
decode, on every backend: a shorter-side resize for the wide images it may meet, a pixel op with the
float32 copies torchvision's kernels work on. Each child process runs under an address-space cap
(``ulimit -v``): without the check it would die allocating, or be killed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from tests.helpers.backends import HOST_BACKENDS
from tests.helpers.paths import REPO

_ENV = {**os.environ, "PYTHONPATH": str(REPO)}

_CHILD = """
import json, resource, sys
import dali_bridge.backends.base  # torch: imported before the cap, as a training script would have
from dali_bridge import build_loader

spec, backend = json.loads(sys.argv[1]), sys.argv[2]
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
used = int(status["VmSize"].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (used + (1 << 30), resource.RLIM_INFINITY))
try:
    loader = build_loader(spec, backend)
    for batch in loader:
        print("batch", tuple(batch[0].shape))
        break
except Exception as exc:
    print(type(exc).__name__, str(exc).replace(chr(10), " "))
"""


def _wide_images(root: Path) -> Path:
    """Four 1:3 images (30 x 90 pixels), two classes."""
    for label in range(2):
        (root / f"c{label}").mkdir(parents=True)
        for number in range(2):
            Image.new("RGB", (90, 30), (40 * number, 90, 200)).save(root / f"c{label}" / f"{number}.jpg")
    return root


def _run(spec: dict, backend: str) -> str:
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(spec), backend], capture_output=True, text=True,
                          timeout=300, env=_ENV)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def _spec(root: Path, ops: list) -> dict:
    return {"version": 1, "batch_size": 2, "ops": ops, "source": {"type": "folder", "root": str(root)},
            "loader": {"workers": 0}}


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["torchvision", "dali-cpu"])
def test_a_shorter_side_resize_up_then_a_crop_is_refused_for_wide_images_before_decoding(tmp_path, backend):
    if backend not in HOST_BACKENDS:
        pytest.skip(f"{backend} is not available here")
    # 30 x 90 images resized to a shorter side of 10,000: 10,000 x 30,000 (900 MB) each, a 16 x 16 output.
    out = _run(_spec(_wide_images(tmp_path / "data"), [{"resize": 10000}, {"center_crop": 16}]), backend)
    assert out.startswith("SpecError "), out
    assert "ops[0].resize: makes images of 1.1 GiB each (uint8 RGB, 10000x40000 pixels)" in out
    assert "RLIMIT_AS (ulimit -v) headroom" in out


@pytest.mark.slow
def test_a_pixel_op_on_a_large_intermediate_is_sized_with_torchvisions_float_copies(tmp_path):
    # 4000 x 4000 uint8 is 48 MB; the blur's float32 copies in its kernel's layout take over 1 GB.
    ops = [{"resize": [4000, 4000]}, {"gaussian_blur": {"kernel_size": 5, "sigma": [1.0, 1.0]}}, {"center_crop": 16}]
    out = _run(_spec(_wide_images(tmp_path / "data"), ops), "torchvision")
    assert out.startswith("SpecError "), out
    assert "ops[1].gaussian_blur: needs 3.8 GiB per image (4000x4000 pixels, with the float32 copies" in out


@pytest.mark.slow
def test_a_small_pipeline_still_runs_under_the_cap(tmp_path):
    ops = [{"resize": 64}, {"gaussian_blur": {"kernel_size": 5, "sigma": [1.0, 1.0]}}, {"center_crop": 16}]
    assert _run(_spec(_wide_images(tmp_path / "data"), ops), "torchvision") == "batch (2, 3, 16, 16)"
