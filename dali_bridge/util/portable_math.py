"""Elementwise exp, log, power, sin and cos built only from IEEE-exact operations.

numpy sends ``np.exp``, ``np.sin``, ``np.power`` and friends to SIMD kernels chosen at run time by
the CPU's features (AVX2 on one machine, AVX-512 on another), and those kernels differ in the last
bit. A last bit is enough to move a pixel across a rounding boundary, so a generated image rendered
with them is not the same bytes on every CPU, and neither is any digest of it. The functions here
use only operations IEEE 754 rounds exactly, whatever the vector width — ``+ - * /``, ``rint``,
``frexp``, ``ldexp`` and comparisons, each its own ufunc call so nothing can be fused into an FMA —
and evaluate fixed polynomials in float64, so their results are one fixed function of the input.
They are accurate to a few float64 ulps over the ranges the sample generator uses (tested against
numpy's own functions), which is far more than an 8-bit image needs.
"""
from __future__ import annotations

import math

import numpy as np

__all__ = ["cos", "exp", "log", "power", "sin"]

# ln 2 and π/2 split into a head with trailing zero bits and a tail (fdlibm's constants): ``n *
# head`` is then exact for the multiples used here, so the reduced argument keeps its accuracy.
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e00
_PIO2_1 = 1.57079632673412561417e00
_PIO2_2 = 6.07710050630396597660e-11
_PIO2_3 = 2.02226624871116645580e-21
_TWO_OVER_PI = 6.36619772367581382433e-01
_SQRT_HALF = 0.7071067811865476

# Taylor coefficients, each a correctly rounded Python division (the same on every machine).
_EXP = [1.0 / math.factorial(k) for k in range(14)]  # |r| <= ln2/2: the r**14 term is < 4e-18
_SIN = [(-1.0) ** k / math.factorial(2 * k + 1) for k in range(9)]  # |r| <= π/4
_COS = [(-1.0) ** k / math.factorial(2 * k) for k in range(10)]
_ATANH = [1.0 / (2 * k + 1) for k in range(13)]  # log m = 2 atanh(s), |s| <= 0.1716


def _horner(coefficients: list[float], x: np.ndarray) -> np.ndarray:
    """sum(c[k] * x**k), highest power first, one multiply and one add per step."""
    result = np.full_like(x, coefficients[-1])
    for c in reversed(coefficients[:-1]):
        result = np.multiply(result, x)
        result = np.add(result, c)
    return result


def _float64(x: np.ndarray | float) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def exp(x: np.ndarray | float) -> np.ndarray:
    """e**x, float64 (inputs in about ±700; beyond that the result under- or overflows)."""
    x = _float64(x)
    n = np.rint(x * _INV_LN2)
    r = (x - n * _LN2_HI) - n * _LN2_LO
    return np.ldexp(_horner(_EXP, r), n.astype(np.int32))


def log(x: np.ndarray | float) -> np.ndarray:
    """Natural logarithm of positive finite ``x``, float64."""
    x = _float64(x)
    mantissa, exponent = np.frexp(x)  # x = mantissa * 2**exponent, mantissa in [0.5, 1)
    low = mantissa < _SQRT_HALF
    mantissa = np.where(low, mantissa * 2.0, mantissa)  # now in [√½, √2): |s| below stays small
    exponent = np.where(low, exponent - 1, exponent).astype(np.float64)
    s = (mantissa - 1.0) / (mantissa + 1.0)
    series = _horner(_ATANH, s * s) * s
    return (series * 2.0 + exponent * _LN2_LO) + exponent * _LN2_HI


def power(x: np.ndarray | float, y: float) -> np.ndarray:
    """x**y for positive finite ``x``, float64."""
    return exp(log(x) * float(y))


def _reduce(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x = r + q·π/2 with |r| <= π/4 and q in 0..3 (exact for |x| below about 2**20)."""
    n = np.rint(x * _TWO_OVER_PI)
    r = ((x - n * _PIO2_1) - n * _PIO2_2) - n * _PIO2_3
    return r, np.mod(n, 4.0).astype(np.int8)


def _sin_cos_of_reduced(r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r2 = r * r
    return _horner(_SIN, r2) * r, _horner(_COS, r2)


def sin(x: np.ndarray | float) -> np.ndarray:
    """sin(x), float64."""
    r, quadrant = _reduce(_float64(x))
    s, c = _sin_cos_of_reduced(r)
    return np.select([quadrant == 0, quadrant == 1, quadrant == 2], [s, c, -s], -c)


def cos(x: np.ndarray | float) -> np.ndarray:
    """cos(x), float64."""
    r, quadrant = _reduce(_float64(x))
    s, c = _sin_cos_of_reduced(r)
    return np.select([quadrant == 0, quadrant == 1, quadrant == 2], [c, -s, -c], s)
