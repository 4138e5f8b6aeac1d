"""The one table of equivalence bounds (``dali_bridge.tools.compare_bounds.DECODE_BOUNDS``) and the docs
that quote it."""
from __future__ import annotations

import pytest

from tests.helpers.paths import REPO
from dali_bridge.tools.compare_bounds import CPU_BOUNDS, DECODE_BOUNDS, NVJPEG_BOUNDS, bounds_table, exceeded

MARK = "<!-- quoted from dali_bridge/tools/compare_bounds.py (bounds_table); "


@pytest.mark.parametrize("doc", ["equivalence.md", "gpu.md"])
def test_the_docs_quote_the_one_table_of_bounds_as_it_is(doc):
    text = (REPO / "docs" / doc).read_text()
    assert text.count(MARK) == 1, f"docs/{doc} quotes the bounds table once, after its marker"
    quoted = text.split(MARK, 1)[1].split("\n", 1)[1]
    assert quoted.startswith(bounds_table()), f"docs/{doc}: the quoted table differs from bounds_table():\n" \
                                              f"{bounds_table()}"


def test_the_table_holds_the_bounds_compare_uses_for_each_decoder():
    assert DECODE_BOUNDS == {"cpu": CPU_BOUNDS, "mixed": NVJPEG_BOUNDS}
    for device, bounds in DECODE_BOUNDS.items():
        assert f"| `{device}` |" in bounds_table() and f"| {bounds.max_abs:g} | {bounds.mean_abs:g} |" in bounds_table()


def test_exceeded_names_each_bound_a_difference_goes_past():
    assert exceeded(NVJPEG_BOUNDS, max_levels=4, mean_levels=0.5) == []
    assert exceeded(NVJPEG_BOUNDS, max_levels=5, mean_levels=0.51) == ["max 5 levels > 4", "mean 0.510 levels > 0.5"]
