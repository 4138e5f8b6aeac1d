"""The error a recipe conversion raises: every problem found, each naming the transform or
argument it is about, what the bridge has instead and what to do."""
from __future__ import annotations

from typing import Sequence


class RecipeError(ValueError):
    """A transform, a timm argument or a spec that cannot be converted; ``problems`` lists each one."""

    def __init__(self, problems: Sequence[str], source: str = "recipe"):
        self.problems = list(problems)
        self.source = source
        count = len(self.problems)
        lines = [f"{source}: {count} problem{'s' if count != 1 else ''}:"] + [f"  {p}" for p in self.problems]
        super().__init__("\n".join(lines))
