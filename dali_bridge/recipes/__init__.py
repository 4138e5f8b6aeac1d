"""Meeting users where their code is: a ``transforms.v2`` Compose or timm's training arguments as a
pipeline (:func:`from_torchvision`, :func:`from_timm`), and a pipeline as the ``transforms.v2`` code
a user writes (:func:`to_torchvision`, :func:`batch_transform`). docs/from-your-code.md has the tables."""
from __future__ import annotations

from .errors import RecipeError
from .from_timm import from_timm, parse_timm_args
from .from_torchvision import RecipeWarning, from_torchvision
from .to_torchvision import batch_transform, to_torchvision

__all__ = ["RecipeError", "RecipeWarning", "batch_transform", "from_timm", "from_torchvision", "parse_timm_args",
           "to_torchvision"]
