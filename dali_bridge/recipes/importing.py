"""``module:attribute`` as the command line names a user's transform: a Compose (or an object holding
one in ``.transforms``), or a function of no arguments returning one."""
from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

from ..errors import RecipeError


def _is_compose(value: Any) -> bool:
    return type(value).__name__ == "Compose" or type(getattr(value, "transforms", None)).__name__ == "Compose"


def import_transform(reference: str) -> Any:
    """The transform ``module:attribute`` names (``attribute`` may be dotted); the current folder is
    importable, as with ``python -m``. A callable that is not a Compose is called without arguments."""
    module_name, _, attribute = reference.partition(":")
    if not module_name or not attribute:
        raise RecipeError([f"{reference!r}: expected MODULE:ATTRIBUTE, e.g. my_transforms:train_transform"])
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        value: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise RecipeError([f"{reference}: cannot import module {module_name!r}: {exc}"]) from None
    for part in attribute.split("."):
        if not hasattr(value, part):
            public = sorted(name for name in dir(value) if not name.startswith("_"))
            raise RecipeError([f"{reference}: {type(value).__name__} {module_name!r} has no attribute {part!r} "
                               f"(it has: {', '.join(public[:20])}{', ...' if len(public) > 20 else ''})"])
        value = getattr(value, part)
    if _is_compose(value) or not callable(value):
        return value
    try:
        inspect.signature(value).bind()
    except TypeError:
        raise RecipeError([f"{reference}: {attribute!r} takes arguments {inspect.signature(value)}: name a Compose, "
                           f"or a function of no arguments returning one"]) from None
    except ValueError:  # no signature to read (a builtin): call it and see
        pass
    return value()
