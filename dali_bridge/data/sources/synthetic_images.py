"""Synthetic, photo-like images: what :mod:`dali_bridge.data.sources.synthetic` writes as a dataset.

Real datasets cannot be downloaded everywhere, so this module renders a
deterministic stand-in with natural-image statistics: smooth background
gradients with a (wiggly) horizon, overlapping soft-edged ellipses and convex
polygons with consistent lighting and soft shadows, 1/f ("pink") texture at
all scales, fractal foliage/cloud layers, vignetting, white balance and
sensor grain. Image sizes follow an ImageNet-like distribution. Rendering is
vectorised numpy (~13 ms for 500x375 on one core). Every image is a pure
function of ``(index, seed, size)``.
"""

from __future__ import annotations

import colorsys
import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

from ...util import portable_math

__all__ = ["sample_image", "sample_size"]

_TAG_SIZE = 0x5123
_TAG_IMAGE = 0x1A6E

_F32 = np.float32


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


@dataclass(frozen=True)
class _Shape:
    """One shape's draws: where it sits, its outline, edge, shadow, colour, lighting and stripes."""
    cx: float
    cy: float
    a: float
    b: float
    ca: float
    sa: float
    is_ellipse: bool
    sdf: Callable
    defocus: bool
    soft: float
    has_shadow: bool
    sh_off: float
    sh_soft: float
    sh_x: float
    sh_y: float
    color: np.ndarray
    shade_k: float
    rim_k: np.float32
    tex_gain: np.float32
    opacity: np.float32
    sh_strength: np.float32
    stripes: bool
    period: float
    s_ang: float
    s_amp: np.float32
    s_warp: np.float32


def _draw_shape(rng: np.random.Generator, h: int, w: int, pal: np.ndarray, r: float, s: float,
                lx: np.float32, ly: np.float32) -> _Shape:
    """Every draw of one shape, in the order the generator makes them (the output bytes depend on it)."""
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
    return _Shape(cx, cy, a, b, ca, sa, is_ellipse, sdf, defocus, soft, has_shadow, sh_off, sh_soft, sh_x, sh_y,
                  color, shade_k, rim_k, tex_gain, opacity, sh_strength, stripes, period, s_ang, s_amp, s_warp)


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
    sh = _draw_shape(rng, h, w, pal, r, s, lx, ly)
    reach = max(sh.a, sh.b) + 2.0 * sh.soft + (sh.sh_off + 2.0 * sh.sh_soft if sh.has_shadow else 0.0)
    x0, x1 = max(0, int(sh.cx - reach)), min(w, int(sh.cx + reach) + 1)
    y0, y1 = max(0, int(sh.cy - reach)), min(h, int(sh.cy + reach) + 1)
    if x0 >= x1 or y0 >= y1:
        return

    X = xs[:, x0:x1] - _F32(sh.cx)
    Y = ys[y0:y1] - _F32(sh.cy)
    region = img[:, y0:y1, x0:x1]
    if sh.has_shadow:
        d_sh = sh.sdf(X - _F32(sh.sh_x), Y - _F32(sh.sh_y))
        a_sh = np.clip(_F32(0.5) - d_sh * _F32(1.0 / sh.sh_soft), 0.0, 1.0)
        a_sh *= -sh.sh_strength
        a_sh += _F32(1.0)
        region *= a_sh
    _fill_shape(sh, region, X, Y, tex[y0:y1, x0:x1], tex2[y0:y1, x0:x1], r, lx, ly)


def _fill_shape(sh: _Shape, region: np.ndarray, X: np.ndarray, Y: np.ndarray, tex: np.ndarray, tex2: np.ndarray,
                r: float, lx: np.float32, ly: np.float32) -> None:
    """Blends the shape's lit, textured fill into ``region`` (its box of the image) by its soft edge."""
    a, b, ca, sa = sh.a, sh.b, sh.ca, sh.sa
    alpha = np.clip(_F32(0.5) - sh.sdf(X, Y) * _F32(1.0 / sh.soft), 0.0, 1.0)
    if sh.opacity < 1.0:
        alpha *= sh.opacity
    # Lighting: brighter towards the light; ellipses darken towards the rim (3-D look).
    shade = X * _F32(sh.shade_k * lx / r) + (Y * _F32(sh.shade_k * ly / r) + _F32(1.0))
    if sh.is_ellipse:
        u = X * _F32(ca) + Y * _F32(sa)
        v = Y * _F32(ca) - X * _F32(sa)
        q = u * u * _F32(1.0 / (a * a)) + v * v * _F32(1.0 / (b * b))
        shade -= sh.rim_k * np.minimum(q, _F32(1.0), out=q)
    shade += sh.tex_gain * tex
    if sh.stripes:
        k = 2.0 * np.pi / sh.period
        phase = X * _F32(k * math.cos(sh.s_ang)) + Y * _F32(k * math.sin(sh.s_ang)) + sh.s_warp * tex2
        shade *= _F32(1.0) - sh.s_amp * (_F32(0.5) + _F32(0.5) * portable_math.sin(phase).astype(_F32))
    fill = sh.color * shade
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
