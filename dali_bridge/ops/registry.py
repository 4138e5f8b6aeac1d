"""The op registry: every op a pipeline file may name.

One line per op module below; each module lists its ops in ``REGISTERED``.
"""
from __future__ import annotations

from importlib import import_module
from typing import Any

from .base import Op

_MODULES = (
    "geometry",          # random_resized_crop, resize, center_crop, horizontal_flip
    "vertical_flip",
    "random_grayscale",
    "gaussian_blur",
    "color_jitter",
    "auto_augment",      # trivial_augment_wide, rand_augment, auto_augment, augmix
    "finish",            # normalize, crop_mirror_normalize
    "erasing",           # random_erasing (after the finish)
    "mixing",            # mixup, cutmix, batch_mix (on the batch, last)
)

OPS: dict[str, Op] = {op.name: op for module in _MODULES
                      for op in import_module(f".{module}", __package__).REGISTERED}


def op_names() -> list[str]:
    return sorted(OPS)


def unsupported_options(name: str, params: dict[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
    """Option combinations of op ``name`` that only some backends reproduce: ``(what, those backends)``."""
    return OPS[name].unsupported_options(params)
