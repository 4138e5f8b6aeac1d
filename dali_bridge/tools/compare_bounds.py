"""What a comparison of two backends tolerates (:mod:`dali_bridge.tools.compare`): the bounds in uint8
levels of 255 for each pair of decoders, the float slack, one float16 step, and the reason a
``parity: fast`` pipeline may exceed them. :mod:`dali_bridge.tools.compare` re-exports every name.

:data:`DECODE_BOUNDS` is the one table of equivalence bounds: ``dali-bridge compare``, the GPU tests
(tests/backends/dali/test_gpu.py, tests/backends/test_equivalence.py) and the device check
(benchmarks/device_check.py) read it, and docs/equivalence.md and docs/gpu.md quote
:func:`bounds_table`'s rendering of it (tests/tools/test_compare_bounds.py keeps them equal)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..ops.finish import Finish
from ..pipeline.plan import build_plan
from ..spec.pipeline import PipelineSpec

__all__ = ["CPU_BOUNDS", "DECODE_BOUNDS", "FAST_PARITY_REASON", "FLOAT32_SLACK", "NVJPEG_BOUNDS", "Bounds",
           "bounds_table", "default_bounds", "exceeded", "fast_parity_changes_pixels", "float16_step"]


@dataclass(frozen=True)
class Bounds:
    """Pass limits for image outputs, in uint8 levels of 255 (before normalisation)."""
    max_abs: float = 1.0
    mean_abs: float = 0.25
    reason: str = "CPU decoders are both libjpeg-turbo; resampling differs only in rounding"


CPU_BOUNDS = Bounds()

# nvJPEG (GPU `dali`, decode.device mixed) vs libjpeg-turbo, with jpeg_fancy_upsampling on so the
# chroma upsampling filter is the same as libjpeg-turbo's. What remains is arithmetic:
#   * IDCT: libjpeg-turbo's accurate integer IDCT and nvJPEG's are both held to IEEE 1180
#     accuracy, which allows a peak error of 1 per decoded sample: ±1 on Y, Cb and Cr.
#   * YCbCr → RGB: R = Y + 1.402 Cr', G = Y - 0.344 Cb' - 0.714 Cr', B = Y + 1.772 Cb'. A ±1 on
#     every component moves B by up to 1 + 1.772 = 2.8 and R by 2.4, plus 0.5 for the two
#     implementations rounding the result differently: up to 3 levels per decoded pixel.
#   * Resampling on the GPU rounds like the CPU kernels: ±1 more, so at most 4 levels per pixel.
#   * IDCT errors are rare (a few pixels per block at most) and resampling averages them, so the
#     mean stays below 0.5 level; PNG and other non-JPEG files decode on the CPU either way.
# Not measured here (no CUDA on the build machine); tests/backends/test_equivalence.py checks it on GPU hosts.
NVJPEG_BOUNDS = Bounds(max_abs=4.0, mean_abs=0.5,
                       reason="nvJPEG vs libjpeg-turbo: IEEE 1180 IDCT (±1 per component) through YCbCr→RGB "
                              "(up to 2.8) and rounding, ±1 resampling")

# The one table: the bounds of an image output decoded by ``dali`` with each ``decode.device`` against a
# backend that decodes with libjpeg-turbo (``dali-cpu``, ``torchvision``), under ``parity: exact``.
# ``cpu``: libjpeg-turbo on both sides, only the resampling's rounding differs (also dali-cpu vs torchvision).
DECODE_BOUNDS: dict[str, Bounds] = {"cpu": CPU_BOUNDS, "mixed": NVJPEG_BOUNDS}


def exceeded(bounds: Bounds, *, max_levels: float, mean_levels: float) -> list[str]:
    """What of ``bounds`` a measured difference exceeds, said ([] when within both)."""
    found = []
    if max_levels > bounds.max_abs:
        found.append(f"max {max_levels:g} levels > {bounds.max_abs:g}")
    if mean_levels > bounds.mean_abs:
        found.append(f"mean {mean_levels:.3f} levels > {bounds.mean_abs:g}")
    return found


def bounds_table() -> str:
    """:data:`DECODE_BOUNDS` as the Markdown table the docs quote."""
    decoders = {"cpu": "libjpeg-turbo on both sides",
                "mixed": "nvJPEG (CUDA or hardware decoder) against libjpeg-turbo"}
    rows = ["| `decode.device` on `dali` | Decoders | max \\|Δ\\| | mean \\|Δ\\| |", "|---|---|---|---|"]
    rows += [f"| `{device}` | {decoders[device]} | {bounds.max_abs:g} | {bounds.mean_abs:g} |"
             for device, bounds in DECODE_BOUNDS.items()]
    return "\n".join(rows) + "\n"


# Float32 arithmetic differs between the backends by ~1e-6 relative; the level check allows this much.
FLOAT32_SLACK = 1e-3  # uint8 levels


# Under `parity: fast` the DALI backends resize with DALI's own border handling, and the ops after
# the resize see DALI's rounding; how far the outermost rows and columns land from torchvision's
# depends on how much the image changes at its edge, and a policy can turn a level into many, so
# no bound holds for every image (measured in docs/equivalence.md: up to 9 levels on the generated
# sample set and 15 on real photos at the border, 200 after a policy).
FAST_PARITY_REASON = ("parity: fast: the DALI backends resize with DALI's own border handling (the outermost rows "
                      "and columns) and feed its rounding to the ops after it, so these parity: exact bounds can be "
                      "exceeded (measured: up to 15 levels at the border on real photos, 200 after a policy); a FAIL "
                      "there is what the mode trades for speed")


def default_bounds(spec: PipelineSpec, backends: Sequence[str]) -> Bounds:
    """:data:`NVJPEG_BOUNDS` when GPU ``dali`` decodes with nvJPEG, else :data:`CPU_BOUNDS`; the
    reason says so when ``parity: fast`` makes a DALI backend resample otherwise than exact."""
    bounds = DECODE_BOUNDS["mixed" if "dali" in backends and spec.decode_device == "mixed" else "cpu"]
    if {"dali", "dali-cpu"} & set(backends) and fast_parity_changes_pixels(spec):
        reason = FAST_PARITY_REASON if bounds is CPU_BOUNDS else f"{bounds.reason}; {FAST_PARITY_REASON}"
        return Bounds(bounds.max_abs, bounds.mean_abs, reason)
    return bounds


def fast_parity_changes_pixels(spec: PipelineSpec) -> bool:
    """Whether ``parity: fast`` makes the DALI backends run ``spec`` otherwise than ``parity: exact``
    would (a resize method, or where the torch tail starts); False under ``parity: exact``."""
    from ..backends.dali.plan import dali_plan

    if spec.parity != "fast":
        return False
    fast, exact = dali_plan(build_plan(spec)), dali_plan(build_plan(spec.replace(parity="exact")))
    return fast.resize_methods != exact.resize_methods or fast.steps != exact.steps


def float16_step(finish: Finish) -> float:
    """One float16 rounding step at the largest output magnitude, in uint8 levels (0 for other dtypes).

    Each backend rounds its float32 result to float16 once; values a hair apart can round to
    neighbouring float16 numbers, one step apart.
    """
    if finish.dtype != "float16":
        return 0.0
    step = 0.0
    for mean, std in zip(finish.mean, finish.std):
        largest = max(abs((0.0 - mean) / std), abs((1.0 - mean) / std))
        # float16 has 10 fraction bits: spacing 2^(e-10) in [2^e, 2^(e+1)); values lie below `largest`
        spacing = 2.0 ** (math.ceil(math.log2(largest)) - 11) if largest > 0 else 2.0 ** -24
        step = max(step, spacing * std * 255.0)
    return step
