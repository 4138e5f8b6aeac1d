"""Tests for the synthetic sample dataset generator (dali_bridge.data.sources.synthetic)."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, JpegImagePlugin

from dali_bridge.data.sources import synthetic
from dali_bridge.data.sources.synthetic import MANIFEST_NAME, SampleSetInfo, ensure_sample_data, generate_sample_data
from dali_bridge.data.sources.synthetic_images import sample_image, sample_size


def _hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*.jpg"))
    }


def _mtimes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_mtime_ns for p in sorted(root.rglob("*")) if p.is_file()}


def _jpeg_bpp(arr: np.ndarray, quality: int = 90) -> float:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=quality, subsampling=2)
    return len(buf.getvalue()) * 8 / (arr.shape[0] * arr.shape[1])


# --------------------------------------------------------------------------- sizes


def test_sample_size_distribution_is_imagenet_like() -> None:
    sizes = np.array([sample_size(i) for i in range(2000)])
    h, w = sizes[:, 0], sizes[:, 1]
    long_side = np.maximum(h, w)
    assert sizes.min() >= 80
    assert long_side.max() <= 2000
    portrait = np.mean(h > w)
    square = np.mean(h == w)
    assert 0.15 <= portrait <= 0.30
    assert 0.03 <= square <= 0.15
    assert np.mean(w > h) > 0.6
    assert abs(np.median(w) - 500) <= 25 and abs(np.median(h) - 375) <= 25
    assert np.mean((h == 375) & (w == 500)) > 0.25  # the classic ImageNet 500x375
    assert np.mean(long_side > 1000) > 0.02  # a tail of large images
    assert np.mean(long_side <= 260) > 0.02  # and some small ones


def test_sample_size_deterministic_and_seeded() -> None:
    a = [sample_size(i, seed=3) for i in range(200)]
    assert a == [sample_size(i, seed=3) for i in range(200)]
    assert a != [sample_size(i, seed=4) for i in range(200)]
    assert all(isinstance(v, int) for hw in a for v in hw)


# --------------------------------------------------------------------------- images


def test_sample_image_is_pure_function() -> None:
    a = sample_image(7, seed=1, size=(60, 80))
    assert a.shape == (60, 80, 3) and a.dtype == np.uint8
    assert np.array_equal(a, sample_image(7, seed=1, size=(60, 80)))
    assert not np.array_equal(a, sample_image(7, seed=2, size=(60, 80)))
    assert not np.array_equal(a, sample_image(8, seed=1, size=(60, 80)))
    assert sample_image(3).shape[:2] == sample_size(3)


def test_sample_image_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        sample_image(0, size=(0, 10))
    with pytest.raises(ValueError):
        sample_image(-1)
    with pytest.raises(ValueError):
        sample_size(0, seed=-1)


@pytest.mark.slow
def test_images_have_natural_statistics_not_noise() -> None:
    bpps = []
    for i in range(12):
        img = sample_image(i)
        bpps.append(_jpeg_bpp(img))
        luma = img.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
        # strong neighbouring-pixel correlation (noise would be ~0)
        corr_x = np.corrcoef(luma[:, :-1].ravel(), luma[:, 1:].ravel())[0, 1]
        corr_y = np.corrcoef(luma[:-1].ravel(), luma[1:].ravel())[0, 1]
        assert corr_x > 0.9 and corr_y > 0.9, (i, corr_x, corr_y)
        # but real content: not flat, several distinct tones and colours
        assert luma.std() > 8, i
        assert len(np.unique(img.reshape(-1, 3) // 32, axis=0)) >= 4, i
    # photo-like compressibility; pure noise is ~6+ bits/pixel at q90
    assert 0.4 <= float(np.median(bpps)) <= 1.6, bpps
    assert max(bpps) < 3.0, bpps
    noise = np.random.default_rng(0).integers(0, 256, (375, 500, 3), dtype=np.uint8)
    assert _jpeg_bpp(noise) > 5.0


# --------------------------------------------------------------------------- datasets


def test_generate_layout_and_labels(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    calls: list[tuple[int, int]] = []
    info = generate_sample_data(root, images=11, classes=4, seed=0, workers=1,
                                progress=lambda d, t: calls.append((d, t)))
    assert isinstance(info, SampleSetInfo)
    names = ("class_000", "class_001", "class_002", "class_003")
    assert info == SampleSetInfo(root, 11, 4, 0, names, info.bytes_total)
    dirs = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert dirs == list(names)
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.jpg"))
    assert len(files) == 11
    for rel in files:
        cls, name = rel.split("/")
        index = int(name[len("img_") : -len(".jpg")])
        assert cls == names[index % 4]
    assert [len(list((root / n).iterdir())) for n in names] == [3, 3, 3, 2]
    assert info.bytes_total == sum(p.stat().st_size for p in root.rglob("*.jpg"))
    assert calls[-1] == (11, 11) and [d for d, _ in calls] == sorted(d for d, _ in calls)
    manifest = json.loads((root / MANIFEST_NAME).read_text())
    assert manifest["complete"] is True
    assert (manifest["images"], manifest["classes"], manifest["seed"], manifest["quality"]) == (11, 4, 0, 90)
    assert not [p for p in root.rglob("*") if ".tmp-" in p.name]


def test_generated_files_are_baseline_420_jpegs(tmp_path: Path) -> None:
    generate_sample_data(tmp_path, images=3, classes=1, seed=5, workers=1)
    for i, path in enumerate(sorted(tmp_path.rglob("*.jpg"))):
        with Image.open(path) as im:
            assert im.format == "JPEG" and im.mode == "RGB"
            assert im.size == sample_size(i, 5)[::-1]
            assert not im.info.get("progressive") and not im.info.get("progression")
            assert JpegImagePlugin.get_sampling(im) == 2  # 4:2:0
            decoded = np.asarray(im.convert("RGB"), dtype=np.float64)
        mse = np.mean((decoded - sample_image(i, 5)) ** 2)
        assert 10 * np.log10(255**2 / mse) > 30  # PSNR of a quality-90 encode


def test_imagefolder_compatible(tmp_path: Path) -> None:
    datasets = pytest.importorskip("torchvision.datasets")
    generate_sample_data(tmp_path, images=6, classes=3, workers=1)
    ds = datasets.ImageFolder(str(tmp_path))
    assert ds.classes == ["class_000", "class_001", "class_002"]
    for path, label in ds.samples:
        assert int(Path(path).stem.split("_")[1]) % 3 == label


@pytest.mark.slow
def test_generation_is_byte_identical_and_seeded(tmp_path: Path) -> None:
    a = generate_sample_data(tmp_path / "a", images=8, classes=2, seed=11, workers=1)
    b = generate_sample_data(tmp_path / "b", images=8, classes=2, seed=11, workers=2)  # pool == serial
    c = generate_sample_data(tmp_path / "c", images=8, classes=2, seed=12, workers=1)
    ha, hb, hc = _hashes(a.root), _hashes(b.root), _hashes(c.root)
    assert len(ha) == 8 and ha == hb
    assert a.bytes_total == b.bytes_total
    assert ha.keys() == hc.keys() and all(ha[k] != hc[k] for k in ha)
    again = generate_sample_data(tmp_path / "a", images=8, classes=2, seed=11, workers=2)  # regenerate in place
    assert _hashes(again.root) == ha


def test_ensure_is_idempotent_and_repairs(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    first = ensure_sample_data(root, images=6, classes=2, seed=0, workers=1)
    before, hashes = _mtimes(root), _hashes(root)
    second = ensure_sample_data(root, images=6, classes=2, seed=0, workers=1)
    assert second == first
    assert _mtimes(root) == before  # nothing rewritten, manifest included

    victim = root / "class_001" / "img_00003.jpg"
    victim.unlink()
    third = ensure_sample_data(root, images=6, classes=2, seed=0, workers=1)
    assert third == first
    assert _hashes(root) == hashes
    after = _mtimes(root)
    changed = {k for k in after if after[k] != before.get(k)}
    assert changed == {"class_001/img_00003.jpg", MANIFEST_NAME}  # only the missing file was regenerated


def test_ensure_regenerates_on_parameter_change(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    ensure_sample_data(root, images=8, classes=4, seed=0, workers=1)
    old = _hashes(root)
    info = ensure_sample_data(root, images=4, classes=2, seed=1, workers=1)
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["class_000", "class_001"]  # stale classes gone
    new = _hashes(root)
    assert len(new) == 4 and info.bytes_total == sum(p.stat().st_size for p in root.rglob("*.jpg"))
    common = new.keys() & old.keys()
    assert common and all(new[k] != old[k] for k in common)
    assert json.loads((root / MANIFEST_NAME).read_text())["seed"] == 1


def test_refuses_foreign_non_empty_directory(tmp_path: Path) -> None:
    root = tmp_path / "mine"
    root.mkdir()
    (root / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="mine"):
        generate_sample_data(root, images=2, classes=1, workers=1)
    with pytest.raises(FileExistsError, match="mine"):
        ensure_sample_data(root, images=2, classes=1, workers=1)
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt"]  # untouched
    generate_sample_data(root, images=2, classes=1, workers=1, overwrite=True)
    assert (root / "notes.txt").read_text() == "keep me"
    assert len(list(root.rglob("*.jpg"))) == 2


def test_interrupted_run_leaves_no_partial_file_and_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ds"
    real_replace = os.replace

    def failing_replace(src, dst):  # simulate dying after the JPEG bytes hit the tmp file
        if Path(dst).name == "img_00003.jpg":
            raise KeyboardInterrupt
        return real_replace(src, dst)

    monkeypatch.setattr(synthetic.os, "replace", failing_replace)
    with pytest.raises(KeyboardInterrupt):
        generate_sample_data(root, images=6, classes=2, workers=1)
    monkeypatch.setattr(synthetic.os, "replace", real_replace)

    assert not (root / "class_001" / "img_00003.jpg").exists()
    assert not [p for p in root.rglob("*") if ".tmp-" in p.name]
    for p in root.rglob("*.jpg"):  # whatever has a final name is a complete JPEG
        with Image.open(p) as im:
            im.load()
    assert json.loads((root / MANIFEST_NAME).read_text())["complete"] is False

    info = ensure_sample_data(root, images=6, classes=2, workers=1)
    assert len(list(root.rglob("*.jpg"))) == 6
    assert _hashes(root) == _hashes(generate_sample_data(tmp_path / "ref", images=6, classes=2, workers=1).root)
    assert json.loads((root / MANIFEST_NAME).read_text())["bytes_total"] == info.bytes_total


@pytest.mark.parametrize(
    "kwargs",
    [dict(images=2, classes=3), dict(images=2, classes=0), dict(images=2, classes=1, quality=0), dict(seed=-1)],
)
def test_invalid_arguments(tmp_path: Path, kwargs: dict) -> None:
    with pytest.raises(ValueError):
        generate_sample_data(tmp_path / "x", **kwargs)
    assert not (tmp_path / "x").exists()


_GENERATE_AND_HASH = """
import hashlib, sys
from pathlib import Path
from dali_bridge.data.sources.synthetic import generate_sample_data
root = Path(sys.argv[1])
generate_sample_data(root, images=40, classes=3, seed=1, workers=1)
for path in sorted(root.rglob('*.jpg')):
    print(path.relative_to(root).as_posix(), hashlib.sha256(path.read_bytes()).hexdigest())
"""


@pytest.mark.skipif(__import__("platform").machine() not in ("x86_64", "AMD64"),
                    reason="the optional CPU features named here are x86-64's")
@pytest.mark.slow
def test_the_generated_set_is_the_same_bytes_whatever_simd_kernels_numpy_dispatches_to(tmp_path):
    """numpy picks its exp/sin/power kernels by the CPU's features at run time; disabling the
    optional ones (AVX-512, AVX2: what another CPU may lack) must not change one byte of the set."""
    import subprocess
    import sys

    def generate(folder: str, disabled: str | None) -> str:
        env = {k: v for k, v in os.environ.items() if k != "NPY_DISABLE_CPU_FEATURES"}
        if disabled:
            env["NPY_DISABLE_CPU_FEATURES"] = disabled
        done = subprocess.run([sys.executable, "-c", _GENERATE_AND_HASH, str(tmp_path / folder)], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    normal = generate("normal", None)
    assert normal.count("\n") == 40
    assert generate("without-x86-v4-v3", "X86_V4 X86_V3") == normal
