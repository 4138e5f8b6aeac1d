"""The op registry: every op a pipeline file may name, one line each."""
from __future__ import annotations

from typing import Any

from .base import Op
from .finish import CROP_MIRROR_NORMALIZE, NORMALIZE
from .geometry import CENTER_CROP, HORIZONTAL_FLIP, RANDOM_RESIZED_CROP, RESIZE

OPS: dict[str, Op] = {op.name: op for op in (
    RANDOM_RESIZED_CROP,
    RESIZE,
    CENTER_CROP,
    HORIZONTAL_FLIP,
    NORMALIZE,
    CROP_MIRROR_NORMALIZE,
)}


def op_names() -> list[str]:
    return sorted(OPS)


def unsupported_options(name: str, params: dict[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
    """Option combinations of op ``name`` that only some backends reproduce: ``(what, those backends)``."""
    return OPS[name].unsupported_options(params)
