"""Synthetic, photo-like ImageFolder JPEG dataset for tests and benchmarks.

Real datasets cannot be downloaded everywhere, so this module renders a
deterministic stand-in with natural-image statistics: smooth background
gradients with a (wiggly) horizon, overlapping soft-edged ellipses and convex
polygons with consistent lighting and soft shadows, 1/f ("pink") texture at
all scales, fractal foliage/cloud layers, vignetting, white balance and
sensor grain. Image sizes follow an ImageNet-like distribution. JPEGs come out
at ~0.8-1.6 bits/pixel (median ~1.1) at quality 90, like smooth photographs
(pure noise would be ~6+). Rendering is vectorised numpy (~13 ms for 500x375 on one core);
generation runs in a process pool.

Layout written by :func:`generate_sample_data`::

    root/.dali-bridge-samples.json     manifest (parameters, completeness)
    root/class_000/img_00000.jpg
    root/class_001/img_00001.jpg
    ...

Image ``i`` has label ``i % classes`` (round-robin), so sorted class folder
names equal label order and every class gets ``images // classes`` or one
more image. Output is a pure function of ``(images, classes, seed, quality)``:
repeated runs give byte-identical files regardless of the worker count
(same numpy/Pillow versions assumed).
"""

from __future__ import annotations

import colorsys
import json
import math
import multiprocessing as mp
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from . import portable_math
from .sources import SourceError

__all__ = [
    "MANIFEST_NAME",
    "SampleSetInfo",
    "ensure_sample_data",
    "generate_sample_data",
    "sample_image",
    "sample_size",
]

#: Manifest file written into the dataset root.
MANIFEST_NAME = ".dali-bridge-samples.json"
#: Bump whenever rendering or encoding changes, so stale sets are regenerated.
_GENERATOR_VERSION = 2
_FORMAT = "dali-bridge-samples"

_TAG_SIZE = 0x5123
_TAG_IMAGE = 0x1A6E

_CLASS_RE = re.compile(r"class_\d+")
_IMG_RE = re.compile(r"img_\d+\.jpg")
_TMP_RE = re.compile(r"\.img_\d+\.jpg\.tmp-\d+")

_F32 = np.float32


@dataclass(frozen=True)
class SampleSetInfo:
    """Description of a generated sample set.

    ``root``: dataset directory; ``images``: number of JPEG files;
    ``classes``: number of class folders; ``seed``: generator seed;
    ``class_names``: folder names in label order; ``bytes_total``: summed
    JPEG file sizes in bytes.
    """

    root: Path
    images: int
    classes: int
    seed: int
    class_names: tuple[str, ...]
    bytes_total: int


# ---------------------------------------------------------------------------
# Sizes
# ---------------------------------------------------------------------------


def _rng(index: int, seed: int, tag: int) -> np.random.Generator:
    if index < 0 or seed < 0:
        raise ValueError(f"index and seed must be non-negative, got index={index}, seed={seed}")
    return np.random.default_rng(np.random.SeedSequence([int(seed), int(index), tag]))


def sample_size(index: int, seed: int = 0) -> tuple[int, int]:
    """Return the ``(height, width)`` in pixels of sample ``index``.

    Drawn deterministically from ``(index, seed)`` with an ImageNet-like
    spread: ~70% have a 500 px long side (mostly 500x375 landscape), ~15%
    a 300-500 px long side, ~10% a 640-2000 px long side, ~5% are small
    (150-260 px). About 22% are portrait and 8% square; the rest landscape,
    mostly 4:3 with some 3:2, 16:9 and irregular aspect ratios.
    """
    rng = _rng(index, seed, _TAG_SIZE)
    u = rng.random()
    if u < 0.70:
        long_side = 500
    elif u < 0.85:
        long_side = int(rng.integers(300, 500))
    elif u < 0.95:
        long_side = int(round(math.exp(rng.uniform(math.log(640), math.log(2000)))))
    else:
        long_side = int(rng.integers(150, 261))

    o = rng.random()
    if o < 0.08:
        return long_side, long_side
    a = rng.random()
    if a < 0.65:
        aspect = 4 / 3
    elif a < 0.85:
        aspect = 3 / 2
    elif a < 0.90:
        aspect = 16 / 9
    else:
        aspect = float(rng.uniform(1.1, 1.9))
    short_side = max(1, int(round(long_side / aspect)))
    if o < 0.30:  # portrait
        return long_side, short_side
    return short_side, long_side


# ---------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------


_BETA = 1.4  # pink-noise slope: amplitude ~ 1/f**_BETA (natural images ~1-1.4; steeper = smoother)
_BYTE_VAR = (256.0**2 - 1.0) / 12.0  # variance of a uniform random int8


def _fft_size(n: int) -> int:
    """Round up to a multiple of 32: FFT-friendly, and few distinct sizes (filter cache hits)."""
    return -(-n // 32) * 32


@lru_cache(maxsize=16)
def _pink_filter(h: int, w: int) -> np.ndarray:
    """Amplitude filter ~1/f**_BETA for (h, w) fields, scaled for unit output variance."""
    fy = np.fft.fftfreq(h).astype(_F32)[:, None]
    fx = np.fft.fftfreq(w).astype(_F32)[None, :]
    f2 = np.maximum(fx * fx + fy * fy, _F32(1.0 / max(h, w) ** 2))
    filt = portable_math.power(f2, -_BETA / 2).astype(_F32)
    filt[0, 0] = 0.0
    # Re(ifft2(X * filt)) for complex white X (variance v per component) has
    # variance v * sum(filt^2) / N^2: normalise that to one.
    filt *= _F32(h * w / math.sqrt(_BYTE_VAR * float(np.sum(filt.astype(np.float64) ** 2))))
    filt.setflags(write=False)
    return filt


def _noise(rng: np.random.Generator, h: int, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return two independent unit-variance pink fields and one white field (std ~1), (h, w) float32.

    Uniform random bytes are used as the white source (several times cheaper
    than Gaussian draws); after 1/f filtering the fields are Gaussian anyway.
    The pink fields are synthesised on an FFT-friendly padded grid and cropped.
    """
    fh, fw = _fft_size(h), _fft_size(w)
    white = np.frombuffer(rng.bytes(2 * fh * fw), np.int8).reshape(2, fh, fw)
    spec = np.empty((fh, fw), np.complex64)
    spec.real = white[0]
    spec.imag = white[1]
    spec *= _pink_filter(fh, fw)
    field = np.fft.ifft2(spec)[:h, :w]
    grain = white[0, :h, :w].astype(_F32)
    grain += _F32(0.5)
    grain *= _F32(1.0 / math.sqrt(_BYTE_VAR))
    return np.ascontiguousarray(field.real), np.ascontiguousarray(field.imag), grain


def _smoothstep(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, 0.0, 1.0)
    return x * x * (3.0 - 2.0 * x)


def _hsv(h: float, s: float, v: float) -> np.ndarray:
    return np.array(colorsys.hsv_to_rgb(h % 1.0, min(max(s, 0.0), 1.0), min(max(v, 0.0), 1.0)), _F32)


def _palette(rng: np.random.Generator, n: int = 7) -> np.ndarray:
    """Scene palette (n, 3) in [0, 1]: muted, related hues as in photographs."""
    base = rng.random()
    scheme = rng.integers(3)
    if scheme == 0:  # analogous
        offsets = rng.normal(0.0, 0.06, n)
    elif scheme == 1:  # complementary
        offsets = rng.normal(0.0, 0.04, n) + 0.5 * rng.integers(0, 2, n)
    else:  # triad
        offsets = rng.normal(0.0, 0.04, n) + rng.integers(0, 3, n) / 3.0
    sats = rng.beta(2.0, 3.5, n) * 0.85
    vals = rng.uniform(0.2, 0.95, n)
    return np.stack([_hsv(base + o, s, v) for o, s, v in zip(offsets, sats, vals)])


def _color(rng: np.random.Generator, pal: np.ndarray, amount: float = 0.08) -> np.ndarray:
    """Random palette entry, jittered, as a (3, 1, 1) float32 array for planar broadcasting."""
    c = pal[rng.integers(len(pal))]
    return np.clip(c * (1.0 + rng.normal(0.0, amount, 3)), 0.0, 1.0).astype(_F32).reshape(3, 1, 1)


def _ellipse_sdf(a: float, b: float, ca: float, sa: float) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """Approximate signed distance (pixels, negative inside) to a rotated ellipse."""
    ia2, ib2 = _F32(1.0 / (a * a)), _F32(1.0 / (b * b))
    ca, sa = _F32(ca), _F32(sa)

    def sdf(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        u = x * ca + y * sa
        v = y * ca - x * sa
        f = u * u * ia2 + v * v * ib2 - _F32(1.0)
        g = _F32(2.0) * np.sqrt((u * ia2) ** 2 + (v * ib2) ** 2) + _F32(1e-6)
        return f / g

    return sdf


def _polygon_sdf(
    rng: np.random.Generator, a: float, b: float, ca: float, sa: float
) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """Signed distance (pixels) to a random convex polygon inscribed in a rotated ellipse."""
    k = int(rng.integers(3, 9))
    # jittered, evenly spread angles: convex (on an ellipse) and not a sliver
    ang = np.sort((np.linspace(0.0, 2.0 * np.pi, k, endpoint=False) + rng.uniform(-0.4, 0.4, k) * np.pi / k))
    pu, pv = a * portable_math.cos(ang), b * portable_math.sin(ang)
    px, py = pu * ca - pv * sa, pu * sa + pv * ca
    edges = []
    for i in range(k):
        x0, y0, x1, y1 = px[i], py[i], px[(i + 1) % k], py[(i + 1) % k]
        ex, ey = x1 - x0, y1 - y0
        ln = math.hypot(ex, ey) or 1.0
        nx, ny = ey / ln, -ex / ln  # outward normal for counter-clockwise order
        edges.append((_F32(nx), _F32(ny), _F32(nx * x0 + ny * y0)))

    def sdf(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        d = None
        for nx, ny, c in edges:
            e = x * nx + y * ny - c
            d = e if d is None else np.maximum(d, e, out=d)
        return d

    return sdf


def _render(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Render one photo-like image as planar float32 (3, h, w), scaled to 0..255."""
    s = float(min(h, w))
    ys = (np.arange(h, dtype=_F32) + _F32(0.5))[:, None]
    xs = (np.arange(w, dtype=_F32) + _F32(0.5))[None, :]
    pal = _palette(rng)
    la = rng.normal(-np.pi / 2, 0.7)  # direction towards the light, mostly from above
    lx, ly = _F32(math.cos(la)), _F32(math.sin(la))
    tex, tex2, grain = _noise(rng, h, w)

    # Background: two gradients split by a soft, noise-warped horizon.
    th = rng.normal(np.pi / 2, 0.25) if rng.random() < 0.75 else rng.uniform(0, 2 * np.pi)
    dx, dy = _F32(math.cos(th)), _F32(math.sin(th))
    extent = _F32(abs(dx) * w + abs(dy) * h)
    t = (xs - _F32(w / 2)) * (dx / extent) + (ys - _F32(h / 2)) * (dy / extent) + _F32(0.5)
    t += _F32(rng.uniform(0.005, 0.03)) * tex2
    horizon = rng.uniform(0.3, 0.75)
    width = math.exp(rng.uniform(math.log(0.004), math.log(0.4)))
    m = _smoothstep((t - _F32(horizon - width / 2)) * _F32(1.0 / width))
    c0, c1, c2, c3 = (_color(rng, pal, 0.15) for _ in range(4))
    img = (c1 - c0) * t  # top gradient c0 -> c1, bottom gradient c2 -> c3, mixed by m
    img += c0
    img += ((c2 - c0) + ((c3 - c2) - (c1 - c0)) * t) * m
    img *= _F32(1.0) + _F32(rng.uniform(0.02, 0.07)) * tex

    # Fractal foliage / cloud layer from thresholded pink noise.
    if rng.random() < 0.5:
        sharp = math.exp(rng.uniform(math.log(0.1), math.log(1.5)))
        bias = rng.uniform(1.0, 4.0) * (1 if rng.random() < 0.5 else -1)
        val = tex2 + _F32(bias / h) * ys - _F32(bias * rng.uniform(0.3, 0.7) + rng.uniform(0.0, 1.0))
        alpha = np.clip(val * _F32(1.0 / sharp) + _F32(0.5), 0.0, 1.0)
        alpha *= _F32(rng.uniform(0.6, 1.0))
        col = _color(rng, pal, 0.1)
        fill = col * (_F32(1.0) + _F32(rng.uniform(0.05, 0.2)) * tex)
        fill -= img
        fill *= alpha
        img += fill

    # Overlapping shapes, larger ones first (further back).
    n_shapes = int(rng.integers(3, 10))
    radii = np.sort(portable_math.exp(rng.uniform(math.log(0.05), math.log(0.5), n_shapes)))[::-1] * s
    for r in radii:
        _paint_shape(rng, img, xs, ys, tex, tex2, pal, float(r), s, lx, ly)

    # Global lighting (directional falloff, vignetting, exposure), white balance, grain.
    gx = ((xs - _F32(w / 2)) * _F32(2.0 / w)) ** 2
    gy = ((ys - _F32(h / 2)) * _F32(2.0 / h)) ** 2
    exposure = 255.0 * rng.uniform(0.85, 1.12)
    vig = _F32(-0.5 * exposure * rng.uniform(0.05, 0.45))
    slope = _F32(exposure * rng.uniform(0.0, 0.25) / max(h, w))
    light = (gx + gy) * vig
    light += ((xs - _F32(w / 2)) * (lx * slope) + _F32(exposure)) + (ys - _F32(h / 2)) * (ly * slope)
    img *= light
    img *= (1.0 + rng.normal(0.0, 0.04, 3)).astype(_F32).reshape(3, 1, 1)
    grain *= _F32(rng.uniform(0.4, 1.5))  # sensor noise, a few 8-bit levels; also dithers rounding
    grain += _F32(0.5)  # round to nearest in the final truncating cast
    img += grain
    return img


def _paint_shape(
    rng: np.random.Generator,
    img: np.ndarray,
    xs: np.ndarray,
    ys: np.ndarray,
    tex: np.ndarray,
    tex2: np.ndarray,
    pal: np.ndarray,
    r: float,
    s: float,
    lx: np.float32,
    ly: np.float32,
) -> None:
    """Composite one soft-edged, lit, textured shape (with optional soft shadow) into planar ``img``."""
    h, w = img.shape[1:]
    cx = rng.uniform(-0.1, 1.1) * w
    cy = rng.uniform(-0.1, 1.1) * h
    elong = math.exp(rng.uniform(0.0, math.log(3.0)))
    a, b = r * math.sqrt(elong), r / math.sqrt(elong)
    rot = rng.uniform(0.0, np.pi)
    ca, sa = math.cos(rot), math.sin(rot)
    is_ellipse = rng.random() < 0.55
    sdf = _ellipse_sdf(a, b, ca, sa) if is_ellipse else _polygon_sdf(rng, a, b, ca, sa)

    defocus = rng.random() < 0.25
    soft = max(0.7, s * (rng.uniform(0.008, 0.04) if defocus else rng.uniform(0.0008, 0.003)))
    has_shadow = rng.random() < 0.5
    sh_off = r * rng.uniform(0.03, 0.15) if has_shadow else 0.0
    sh_soft = max(soft, r * rng.uniform(0.05, 0.25)) if has_shadow else 0.0
    sh_x, sh_y = -float(lx) * sh_off, -float(ly) * sh_off
    color = _color(rng, pal, 0.1)
    shade_k = rng.uniform(0.1, 0.5)
    rim_k = _F32(rng.uniform(0.1, 0.4))
    tex_gain = _F32(rng.uniform(0.02, 0.12) * (0.4 if defocus else 1.0))
    opacity = _F32(1.0 if rng.random() < 0.8 else rng.uniform(0.5, 0.95))
    sh_strength = _F32(rng.uniform(0.2, 0.5))
    stripes = rng.random() < 0.3 and not defocus
    period = rng.uniform(4.0, 30.0)
    s_ang = rng.uniform(0.0, np.pi)
    s_amp = _F32(rng.uniform(0.03, 0.12))
    s_warp = _F32(rng.uniform(0.0, 3.0))

    reach = max(a, b) + 2.0 * soft + (sh_off + 2.0 * sh_soft if has_shadow else 0.0)
    x0, x1 = max(0, int(cx - reach)), min(w, int(cx + reach) + 1)
    y0, y1 = max(0, int(cy - reach)), min(h, int(cy + reach) + 1)
    if x0 >= x1 or y0 >= y1:
        return

    X = xs[:, x0:x1] - _F32(cx)
    Y = ys[y0:y1] - _F32(cy)
    region = img[:, y0:y1, x0:x1]
    if has_shadow:
        d_sh = sdf(X - _F32(sh_x), Y - _F32(sh_y))
        a_sh = np.clip(_F32(0.5) - d_sh * _F32(1.0 / sh_soft), 0.0, 1.0)
        a_sh *= -sh_strength
        a_sh += _F32(1.0)
        region *= a_sh

    alpha = np.clip(_F32(0.5) - sdf(X, Y) * _F32(1.0 / soft), 0.0, 1.0)
    if opacity < 1.0:
        alpha *= opacity
    # Lighting: brighter towards the light; ellipses darken towards the rim (3-D look).
    shade = X * _F32(shade_k * lx / r) + (Y * _F32(shade_k * ly / r) + _F32(1.0))
    if is_ellipse:
        u = X * _F32(ca) + Y * _F32(sa)
        v = Y * _F32(ca) - X * _F32(sa)
        q = u * u * _F32(1.0 / (a * a)) + v * v * _F32(1.0 / (b * b))
        shade -= rim_k * np.minimum(q, _F32(1.0), out=q)
    shade += tex_gain * tex[y0:y1, x0:x1]
    if stripes:
        k = 2.0 * np.pi / period
        phase = X * _F32(k * math.cos(s_ang)) + Y * _F32(k * math.sin(s_ang)) + s_warp * tex2[y0:y1, x0:x1]
        shade *= _F32(1.0) - s_amp * (_F32(0.5) + _F32(0.5) * portable_math.sin(phase).astype(_F32))
    fill = color * shade
    fill -= region
    fill *= alpha
    region += fill


def sample_image(index: int, seed: int = 0, size: tuple[int, int] | None = None) -> np.ndarray:
    """Render sample ``index`` as an ``(H, W, 3)`` uint8 RGB array.

    A pure function of ``(index, seed, size)``. ``size`` is ``(height, width)``
    in pixels; default :func:`sample_size` ``(index, seed)``. The scene layout is
    drawn in relative coordinates, so other sizes show a similar scene.
    """
    if size is None:
        size = sample_size(index, seed)
    h, w = int(size[0]), int(size[1])
    if h < 1 or w < 1:
        raise ValueError(f"size must be positive (height, width), got {size!r}")
    img = _render(_rng(index, seed, _TAG_IMAGE), h, w)
    np.clip(img, 0.0, 255.0, out=img)
    out = np.empty((h, w, 3), np.uint8)
    np.copyto(out, img.transpose(1, 2, 0), casting="unsafe")
    return out


# ---------------------------------------------------------------------------
# Dataset generation
# ---------------------------------------------------------------------------


def _digits(n: int, minimum: int) -> int:
    return max(minimum, len(str(max(n - 1, 0))))


def _class_names(classes: int) -> tuple[str, ...]:
    width = _digits(classes, 3)
    return tuple(f"class_{c:0{width}d}" for c in range(classes))


def _relpaths(images: int, classes: int) -> list[str]:
    names = _class_names(classes)
    width = _digits(images, 5)
    return [f"{names[i % classes]}/img_{i:0{width}d}.jpg" for i in range(images)]


def _write_jpeg(task: tuple[str, str, int, int, int]) -> int:
    """Render and atomically write one JPEG; return its size in bytes."""
    root, rel, index, seed, quality = task
    final = os.path.join(root, rel)
    head, name = os.path.split(final)
    tmp = os.path.join(head, f".{name}.tmp-{os.getpid()}")
    arr = sample_image(index, seed)
    try:
        # Baseline (non-progressive), 4:2:0 chroma subsampling, no metadata.
        Image.fromarray(arr, "RGB").save(tmp, "JPEG", quality=quality, subsampling=2, optimize=False)
        os.replace(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return os.path.getsize(final)


def _params(images: int, classes: int, seed: int, quality: int) -> dict:
    return {
        "format": _FORMAT,
        "version": _GENERATOR_VERSION,
        "images": images,
        "classes": classes,
        "seed": seed,
        "quality": quality,
    }


def _read_manifest(root: Path) -> dict | None:
    try:
        with open(root / MANIFEST_NAME, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_manifest(root: Path, data: dict) -> None:
    path = root / MANIFEST_NAME
    tmp = root / f".{MANIFEST_NAME}.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class SampleDataError(SourceError):
    """The sample set cannot be made as asked: its settings or its destination (exit 2 from the CLI)."""


class SampleDataExists(SampleDataError, FileExistsError):
    """The destination holds files that are not a previous sample set."""


class SampleDataNotAFolder(SampleDataError, NotADirectoryError):
    """The destination exists and is not a folder."""


#: The most images one set may hold: ImageNet-1k's 1.28 M training images several times over. The
#: generator renders about 13 ms a core per image, so this is already days of work; a larger count is
#: a typo (and its list of names alone would not fit in memory).
MAX_IMAGES = 10_000_000
#: Mean bytes per generated JPEG (ImageNet-like sizes at quality 90), for the disk-space check.
MEAN_IMAGE_BYTES = 42_000


def _validate(images: int, classes: int, seed: int, quality: int) -> None:
    if images > MAX_IMAGES:
        raise SampleDataError(f"images ({images:,}, --images) must be at most {MAX_IMAGES:,} (about "
                              f"{MAX_IMAGES * MEAN_IMAGE_BYTES / 1e9:,.0f} GB of JPEGs)")
    if classes < 1:
        raise SampleDataError(f"classes (--classes) must be >= 1, got {classes}")
    if images < classes:
        raise SampleDataError(f"images ({images}, --images) must be >= classes ({classes}) so every class "
                              f"gets images")
    if seed < 0:
        raise SampleDataError(f"seed (--seed) must be non-negative, got {seed}")
    if not 1 <= quality <= 100:
        raise SampleDataError(f"quality must be in 1..100, got {quality}")


def _check_disk_space(root: Path, images: int) -> None:
    """Refuse a set that cannot fit on the disk before writing the first of its files."""
    import shutil

    needed = images * MEAN_IMAGE_BYTES
    free = shutil.disk_usage(root).free
    if needed > free:
        raise SampleDataError(f"{images:,} images need about {needed / 2**20:,.0f} MiB; {str(root)!r} has "
                              f"{free / 2**20:,.0f} MiB free: use fewer --images or another folder")


def _remove_stale(root: Path, keep: set[str]) -> None:
    """Delete sample files/tmp files and empty class folders not in ``keep``; leave anything else."""
    for d in root.iterdir():
        if not (d.is_dir() and not d.is_symlink() and _CLASS_RE.fullmatch(d.name)):
            continue
        for f in d.iterdir():
            rel = f"{d.name}/{f.name}"
            if _TMP_RE.fullmatch(f.name) or (_IMG_RE.fullmatch(f.name) and rel not in keep):
                if f.is_file() or f.is_symlink():
                    f.unlink()
        try:
            next(d.iterdir())
        except StopIteration:
            if d.name not in {k.split("/", 1)[0] for k in keep}:
                d.rmdir()
    for f in root.iterdir():
        if f.name.startswith(f".{MANIFEST_NAME}.tmp-") and f.is_file():
            f.unlink()


def _run_tasks(tasks: list[tuple[str, str, int, int, int]], workers: int, on_done: Callable[[int], None]) -> None:
    if workers <= 1 or len(tasks) <= 1:
        for t in tasks:
            on_done(_write_jpeg(t))
        return
    # fork keeps start-up cheap and works without an ``if __name__ == "__main__"`` guard.
    methods = mp.get_all_start_methods()
    ctx = mp.get_context("fork") if "fork" in methods else mp.get_context()
    n = min(workers, len(tasks))
    chunk = max(1, min(16, len(tasks) // (n * 8)))
    with ctx.Pool(n) as pool:
        for nbytes in pool.imap_unordered(_write_jpeg, tasks, chunksize=chunk):
            on_done(nbytes)


def _generate(
    root: Path,
    images: int,
    classes: int,
    seed: int,
    quality: int,
    workers: int | None,
    progress: Callable[[int, int], None] | None,
    overwrite: bool,
    resume: bool,
) -> SampleSetInfo:
    _validate(images, classes, seed, quality)
    if root.exists() and not root.is_dir():
        raise SampleDataNotAFolder(f"sample data root {str(root)!r} exists and is not a directory")
    root.mkdir(parents=True, exist_ok=True)
    _check_disk_space(root, images)
    ours = (root / MANIFEST_NAME).is_file()
    if not ours and not overwrite and any(root.iterdir()):
        raise SampleDataExists(
            f"refusing to write sample data into non-empty directory {str(root)!r}: it is not a "
            f"previous sample set (no {MANIFEST_NAME}); pass overwrite=True or use an empty directory"
        )
    params = _params(images, classes, seed, quality)
    old = _read_manifest(root) if ours else None
    resume = resume and old is not None and all(old.get(k) == v for k, v in params.items())

    rels = _relpaths(images, classes)
    names = _class_names(classes)
    # Mark incomplete first: an interrupted run is then detected (and resumable).
    _write_manifest(root, {**params, "complete": False, "class_names": list(names)})
    _remove_stale(root, set(rels))
    for name in names:
        (root / name).mkdir(exist_ok=True)

    total = 0
    done = 0
    tasks = []
    for i, rel in enumerate(rels):
        p = root / rel
        if resume and p.is_file():
            total += p.stat().st_size
            done += 1
        else:
            tasks.append((str(root), rel, i, seed, quality))
    if progress is not None:
        progress(done, images)

    def on_done(nbytes: int) -> None:
        nonlocal total, done
        total += nbytes
        done += 1
        if progress is not None:
            progress(done, images)

    _run_tasks(tasks, (os.cpu_count() or 1) if workers is None else workers, on_done)
    _write_manifest(root, {**params, "complete": True, "class_names": list(names), "bytes_total": total})
    return SampleSetInfo(root, images, classes, seed, names, total)


def generate_sample_data(
    root: str | Path,
    images: int = 1000,
    classes: int = 10,
    seed: int = 0,
    *,
    quality: int = 90,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    overwrite: bool = False,
) -> SampleSetInfo:
    """Write a synthetic ImageFolder JPEG dataset to ``root`` and describe it.

    ``images`` (default 1000) JPEGs are spread round-robin over ``classes``
    (default 10) folders ``class_000``...; needs ``images >= classes``.
    ``seed`` (default 0) selects the content; ``quality`` (default 90) is the
    JPEG quality (baseline, 4:2:0). ``workers`` is the process count (default
    ``os.cpu_count()``; ``<= 1`` renders in-process). ``progress(done, total)``
    is called in the calling process as images complete.

    Always (re)writes every image; files are written to a temporary name and
    renamed, so no partial JPEG ever has a final name. ``root`` may be missing,
    empty, or a previous sample set (stale sample files are removed). Any other
    non-empty directory raises :class:`FileExistsError` unless ``overwrite=True``,
    in which case sample files are written alongside its other content, which
    is left untouched.
    """
    return _generate(Path(root), images, classes, seed, quality, workers, progress, overwrite, resume=False)


def _existing_info(root: Path, images: int, classes: int, seed: int, quality: int) -> SampleSetInfo | None:
    data = _read_manifest(root)
    if data is None or not data.get("complete"):
        return None
    if any(data.get(k) != v for k, v in _params(images, classes, seed, quality).items()):
        return None
    total = 0
    try:
        for rel in _relpaths(images, classes):
            total += (root / rel).stat().st_size
    except OSError:
        return None
    if total != data.get("bytes_total"):
        return None
    return SampleSetInfo(root, images, classes, seed, _class_names(classes), total)


def ensure_sample_data(
    root: str | Path,
    images: int = 1000,
    classes: int = 10,
    seed: int = 0,
    *,
    quality: int = 90,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> SampleSetInfo:
    """Return the sample set at ``root``, generating it only if absent or incomplete.

    If ``root/.dali-bridge-samples.json`` records a complete set with the same
    ``images``/``classes``/``seed``/``quality`` (defaults 1000/10/0/90) and all
    files are present with the recorded total size, nothing is written. An
    interrupted run with the same parameters is resumed (existing images kept);
    otherwise the set is regenerated as by :func:`generate_sample_data`
    (which refuses a foreign non-empty directory).
    """
    root = Path(root)
    _validate(images, classes, seed, quality)
    info = _existing_info(root, images, classes, seed, quality)
    if info is not None:
        return info
    return _generate(root, images, classes, seed, quality, workers, progress, overwrite=False, resume=True)
