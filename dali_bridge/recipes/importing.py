"""``module:attribute`` as the command line names a user's transform: a Compose (or an object holding
one in ``.transforms``), or a function of no arguments returning one; and which transform objects
are the libraries' own classes (:func:`library_class`), the only ones a recipe maps."""
from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

from ..errors import RecipeError


_TORCHVISION = "torchvision.transforms"


def _torchvision_modules() -> tuple[Any, ...]:
    import torchvision.transforms
    import torchvision.transforms.v2

    return torchvision.transforms.v2, torchvision.transforms


def qualified_name(cls: type) -> str:
    """``module.QualifiedName`` of a class, as a message names it; torchvision's own classes by their
    public home (``torchvision.transforms.v2.CenterCrop``)."""
    if library_class_of(cls):
        v2, _ = _torchvision_modules()
        return f"{_TORCHVISION}{'.v2' if getattr(v2, cls.__name__, None) is cls else ''}.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def library_class(value: Any) -> str | None:
    """The class name of ``value`` when its class is exactly one of torchvision's transform classes
    (``transforms.v2`` or the v1 ``transforms``), else None. A subclass is not: its own methods
    (``forward``, ``__call__``, ``_transform``, ``make_params`` ...) may compute or draw otherwise,
    and a class that only shares a name does something else."""
    return type(value).__name__ if library_class_of(type(value)) else None


def foreign_class_problem(value: Any) -> str:
    """Why ``value``, whose class is not one of torchvision's own (:func:`library_class` is None), is not
    mapped, naming its class by its qualified name."""
    cls = type(value)
    named = qualified_name(cls)
    base = next((b for b in cls.__mro__[1:] if library_class_of(b)), None)
    if base is not None:
        return (f"{named} is a subclass of {qualified_name(base)}: its own methods may compute or draw otherwise, "
                f"and the bridge reproduces torchvision's classes exactly, not subclasses: use "
                f"{base.__name__} itself")
    if (cls.__module__ or "").split(".")[0] == "timm":
        return (f"{named} is timm's, not torchvision's: give timm's training arguments to from_timm "
                f"(dali-bridge from-timm) instead")
    if any(getattr(module, cls.__name__, None) is not None for module in _torchvision_modules()):
        return (f"{named} is not torchvision's {cls.__name__}, only a class of the same name: the bridge maps "
                f"torchvision's own classes only")
    return f"{named} is not a torchvision transform"


def library_class_of(cls: type) -> bool:
    """Whether ``cls`` is exactly one of torchvision's transform classes."""
    return (cls.__module__ or "").startswith(_TORCHVISION) and any(
        getattr(module, cls.__name__, None) is cls for module in _torchvision_modules())


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
