"""The error a recipe conversion raises (:class:`~dali_bridge.recipe_error.RecipeError`, defined below
the spec layer, where ``PipelineSpec.to_torchvision`` raises it too)."""
from __future__ import annotations

from ..recipe_error import RecipeError

__all__ = ["RecipeError"]
