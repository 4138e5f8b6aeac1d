"""dali-bridge: a YAML-declared image pipeline, iterated as a PyTorch loader on DALI or torchvision.

The public face: each name below is looked up in its home on first use, so ``import dali_bridge``
(and spec validation) stays free of torch, DALI and torchvision."""
from __future__ import annotations

from importlib import import_module

from .errors import ImageError, RecipeError, SampleError, SourceError
from .spec.pipeline import PipelineSpec, load_spec
from .spec.problems import SpecError
from .util.urls import StorageError

__version__ = "0.1.0"

# Names whose homes import torch or torchvision: imported when first asked for.
_LAZY = {"build_loader": "dali_bridge.loader.loader", "Loader": "dali_bridge.loader.loader",
         "BackendUnavailable": "dali_bridge.loader.select",
         "from_torchvision": "dali_bridge.recipes.from_torchvision", "from_timm": "dali_bridge.recipes.from_timm",
         "to_torchvision": "dali_bridge.recipes.to_torchvision",
         "batch_transform": "dali_bridge.recipes.to_torchvision"}

__all__ = ["PipelineSpec", "SpecError", "load_spec", "build_loader", "Loader", "from_timm", "from_torchvision",
           "to_torchvision", "batch_transform", "BackendUnavailable", "ImageError", "RecipeError", "SampleError",
           "SourceError", "StorageError", "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dali_bridge' has no attribute {name!r}")
