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
