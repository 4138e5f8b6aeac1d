"""The error a recipe conversion raises: every problem found, each naming the transform or
argument it is about, what the bridge has instead and what to do.

It sits below the spec layer, beside :mod:`dali_bridge.compose` (``PipelineSpec.to_torchvision``
raises it too); :mod:`dali_bridge.recipes` re-exports it."""
from __future__ import annotations

from typing import Sequence

from .wording import problem_list


class RecipeError(ValueError):
    """A transform, a timm argument or a spec that cannot be converted; ``problems`` lists each one."""

    def __init__(self, problems: Sequence[str], source: str = "recipe"):
        self.problems = list(problems)
        self.source = source
        super().__init__(problem_list(source, self.problems))
