"""The output dtype table is the one every layer reads: it names every dtype a pipeline may declare,
and each entry agrees with torch and DALI."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from dali_bridge.util.dtypes import OUTPUT_DTYPES, item_bytes, torch_dtype
from dali_bridge.ops.base import DTYPES


def test_table_holds_exactly_the_declarable_dtypes():
    assert tuple(OUTPUT_DTYPES) == DTYPES


@pytest.mark.parametrize("name", DTYPES)
def test_torch_dtype_and_item_bytes_agree_with_torch(name):
    dtype = torch_dtype(name)
    assert isinstance(dtype, torch.dtype) and str(dtype) == f"torch.{name}"
    assert item_bytes(name) == torch.empty(0, dtype=dtype).element_size()


@pytest.mark.parametrize("name", DTYPES)
def test_dali_type_names_a_dali_type(name):
    types = pytest.importorskip("nvidia.dali.types", reason="DALI is not installed: no type constants to check")
    from dali_bridge.util.dtypes import dali_type

    assert np.dtype(types.to_numpy_type(dali_type(name))) == np.dtype(name)
