"""The output dtypes a pipeline may declare, and what each is in torch, in DALI and in bytes: the
one table the finish, both backends and the host checks read. A leaf: no project imports, and
torch or DALI only when asked for one of theirs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class OutputDtype:
    """One declarable output dtype: its name (also torch's attribute), bytes per element and
    the name of its ``nvidia.dali.types`` constant."""
    name: str
    item_bytes: int
    dali_name: str


OUTPUT_DTYPES: dict[str, OutputDtype] = {dtype.name: dtype for dtype in (
    OutputDtype("float32", 4, "FLOAT"),
    OutputDtype("float16", 2, "FLOAT16"),
    OutputDtype("uint8", 1, "UINT8"),
)}


def item_bytes(name: str) -> int:
    """Bytes per element of output dtype ``name``."""
    return OUTPUT_DTYPES[name].item_bytes


def torch_dtype(name: str) -> Any:
    """Output dtype ``name`` as a ``torch.dtype``."""
    import torch

    return getattr(torch, OUTPUT_DTYPES[name].name)


def dali_type(name: str) -> Any:
    """Output dtype ``name`` as a ``nvidia.dali.types.DALIDataType``."""
    from nvidia.dali import types

    return getattr(types, OUTPUT_DTYPES[name].dali_name)
