"""Comparing two backends in tests: a pipeline dict over a folder, a compare run, and the bounds check."""
from __future__ import annotations
from pathlib import Path
from typing import Any
from dali_bridge.tools.compare import CompareResult, compare
from dali_bridge.tools.compare_bounds import CPU_BOUNDS


def pipeline(root: Path, ops: list, *, batch_size: int = 13, shuffle: bool = True, seed: int = 3) -> dict[str, Any]:
    return {"version": 1, "name": "equivalence", "source": {"type": "folder", "root": str(root)},
            "batch_size": batch_size, "seed": seed, "ops": ops, "outputs": ["image", "label", "index"],
            "loader": {"workers": 1, "shuffle": shuffle}}


def assert_within_bounds(result: CompareResult, samples: int, float16: bool = False) -> None:
    """The issue's bounds, checked on the numbers (not only the verdict): order and labels exact;
    max |Δ| <= 1 level (plus one float16 step for float16 outputs), mean |Δ| <= 0.25 level."""
    image = result.output("image")
    assert result.problems == [], result.format()
    assert result.samples == samples, result.format()
    assert result.output("index").mismatches == 0 and result.output("label").mismatches == 0
    assert (image.max_limit > CPU_BOUNDS.max_abs) == float16 and image.max_limit < CPU_BOUNDS.max_abs + 0.2
    assert image.max_abs <= image.max_limit + 1e-3, result.format()
    assert image.mean_abs <= CPU_BOUNDS.mean_abs, result.format()
    assert result.passed, result.format()


def run_compare(data: dict[str, Any] | Path, overrides: dict[str, Any] | None = None) -> CompareResult:
    """dali-cpu vs torchvision over the whole first epoch."""
    return compare(data, ("dali-cpu", "torchvision"), overrides=overrides, batches=None)


# After DALI's plain resize (parity: fast) an op's input differs from torchvision's by a level here
# and there, and by more in the outermost rows and columns (DALI's border handling). A continuous op
# keeps that: within 1 level inside the border. An op flagged ``discontinuous`` (posterize, solarize,
# equalize) turns a level into a jump at a threshold, so its bound counts the pixels that jump: at
# most 5% off by more than a level, mean within half a level (measured up to 3.9% and 0.30 on the
# sample set; a wrong threshold, bit count or drawn operation moves most pixels).
CONTINUOUS_MAX_INTERIOR = 1
DISCONTINUOUS_JUMP_FRACTION = 0.05
DISCONTINUOUS_MEAN = 0.5


def parity_after_resize_problems(op: Any, delta: Any) -> list[str]:
    """Why ``delta`` (|dali-cpu - torchvision| of uint8 NCHW batches after a DALI resize and ``op``)
    exceeds the bound ``op.discontinuous`` chooses; empty when it is within."""
    if not op.discontinuous:
        interior = delta[:, :, 1:-1, 1:-1]
        if interior.max() > CONTINUOUS_MAX_INTERIOR or interior.float().mean() > 0.25:
            return [f"{op.name}: inside the border max |Δ| {int(interior.max())}, mean "
                    f"{float(interior.float().mean()):.3f} (a continuous op keeps a level)"]
        return []
    jumps, mean = float((delta > 1).float().mean()), float(delta.float().mean())
    if jumps > DISCONTINUOUS_JUMP_FRACTION or mean > DISCONTINUOUS_MEAN:
        return [f"{op.name}: {jumps:.2%} of values off by more than a level, mean |Δ| {mean:.3f}"]
    return []
