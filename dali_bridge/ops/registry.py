"""The op registry: every op a pipeline file may name.

Built-in ops: one line per op module below; each module lists its ops in ``REGISTERED``. Ops from
other packages: each entry point of the group ``dali_bridge.ops`` names one :class:`Op` instance,
under the op's name (``posterize = my_ops:POSTERIZE`` in the package's ``entry_points.txt``).
Every op, built-in or not, passes the same checks (:func:`op_problems`) before it is registered;
a package whose entry point cannot be loaded, fails them or reuses a registered name raises
:class:`OpRegistrationError` naming the distribution and the entry point.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import import_module
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Iterable

from .after_finish import AfterFinishOp, BatchOp
from .base import ALL_BACKENDS, REQUIRED, Category, Op, Param
from .dali_op import DaliOp
from .facets import Batching, DaliBaseline, Display, Sizing, SpecRules, facet

ENTRY_POINT_GROUP = "dali_bridge.ops"
KINDS = tuple(Category)
SIZE_RULES = (None, "output", "resize", "crop")
_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")

_MODULES = (
    "geometry",          # random_resized_crop, resize, center_crop, horizontal_flip
    "vertical_flip",
    "random_grayscale",
    "solarize",
    "gaussian_blur",
    "color_jitter",
    "auto_augment",      # trivial_augment_wide, rand_augment, auto_augment, augmix
    "timm_auto_augment",
    "timm_augmix",
    "finish",            # normalize, crop_mirror_normalize
    "erasing",           # random_erasing (after the finish)
    "mixing",            # mixup, cutmix, batch_mix (on the batch, last)
)


class OpRegistrationError(RuntimeError):
    """An op cannot be registered: the message names its distribution and entry point, and what to do."""


@dataclass(frozen=True)
class OpOrigin:
    """Where an op from another package came from: its distribution and the entry point naming it."""
    distribution: str
    version: str
    entry_point: str  # as the package declares it: ``posterize = my_ops:POSTERIZE``

    def __str__(self) -> str:
        return f"package {self.distribution} {self.version} (entry point {ENTRY_POINT_GROUP}: {self.entry_point})"


def _overrides(op: Op, method: str, base: type) -> bool:
    return getattr(type(op), method) is not getattr(base, method)


def _param_problems(op: Op) -> list[str]:
    problems = []
    names = [getattr(p, "name", None) for p in op.params]
    if len(set(names)) != len(names):
        problems.append(f"parameter names repeat: {', '.join(sorted({n for n in names if names.count(n) > 1}))}")
    for param in op.params:
        if not isinstance(param, Param):
            problems.append(f"params holds {type(param).__name__} {param!r}, expected dali_bridge.ops.base.Param")
            continue
        if not (isinstance(param.doc, str) and param.doc):
            problems.append(f"parameter '{param.name}' has no doc (what it means, its units and default)")
        if param.default is not REQUIRED and param.default is not None:
            problem = param.check(param.default)[1]
            if problem:
                problems.append(f"parameter '{param.name}': its default {param.default!r} fails its own check: "
                                f"{problem}")
    for attribute, value in (("primary", op.primary), ("size_param", facet(op, Sizing).size_param)):
        if value is not None and value not in names:
            problems.append(f"{attribute} '{value}' is not one of its parameters ({', '.join(map(str, names))})")
    return problems


def _method_problems(op: Op) -> list[str]:
    """The methods its category needs, each overridden (the base class's raise NotImplementedError):
    the required core; facets have defaults."""
    if op.category is Category.AFTER_FINISH:
        base, needed = AfterFinishOp, ["apply", "stage"] + (["sample"] if op.draws else [])
    elif op.category is Category.BATCH:
        base, needed = BatchOp, ["apply_batch", "stage"] + (["sample_batch"] if getattr(op, "batch_draws", 0) else [])
    elif op.category in (Category.GEOMETRY, Category.PIXEL):
        base, needed = Op, ["torchvision_kernel"] + (["sample"] if op.draws else [])
        if isinstance(op, DaliOp):
            base, needed = DaliOp, needed + ["dali_graph"]
    else:
        return []
    if not isinstance(op, base):
        return [f"a '{op.category}' op must be an instance of a {base.__module__}.{base.__name__} subclass"]
    missing = [method for method in needed if not _overrides(op, method, base)]
    return [f"does not implement {', '.join(missing)} (needed by a '{op.category}' op on {', '.join(op.backends)})"] \
        if missing else []


_FACETS = (Sizing, SpecRules, Display, Batching, DaliBaseline)


def _facet_problems(op: Op) -> list[str]:
    """A facet's member an op defines without subclassing the facet: consumers read the facet's
    defaults through :func:`~dali_bridge.ops.facets.facet`, so the op's own would never be asked."""
    problems = []
    own = {name for cls in type(op).__mro__ if cls not in _FACETS for name in vars(cls)}
    for facet_class in _FACETS:
        stray = sorted(name for name in vars(facet_class) if not name.startswith("_") and name in own)
        if stray and not isinstance(op, facet_class):
            problems.append(f"defines {', '.join(stray)} of the {facet_class.__name__} facet without subclassing "
                            f"it: add dali_bridge.ops.facets.{facet_class.__name__} to its bases")
    return problems


def op_problems(op: Any) -> list[str]:
    """Why ``op`` cannot be registered (empty when it can): the checks every op passes, built-in or not."""
    if not isinstance(op, Op):
        what = f"the class {op.__name__}" if isinstance(op, type) else f"{type(op).__name__} {op!r}"
        return [f"expected an instance of a dali_bridge.ops.base.Op subclass, found {what}"
                + (" (point the entry point at an instance of it)" if isinstance(op, type) else "")]
    problems = []
    if not (isinstance(op.name, str) and _NAME.match(op.name)):
        problems.append(f"name {op.name!r}: expected lower-case letters, digits and '_', starting with a letter")
    if op.category not in KINDS:
        problems.append(f"category {op.category!r}: expected one of {', '.join(KINDS)}")
    if not (op.backends and set(op.backends) <= set(ALL_BACKENDS)):
        problems.append(f"backends {op.backends!r}: expected some of {', '.join(ALL_BACKENDS)}")
    if not (isinstance(op.doc, str) and op.doc):
        problems.append("has no doc (one sentence for the pipeline reference)")
    sizing = facet(op, Sizing)
    if sizing.size_rule not in SIZE_RULES or (sizing.size_rule is None) != (sizing.size_param is None):
        problems.append(f"size_rule {sizing.size_rule!r} with size_param {sizing.size_param!r}: expected both None, or "
                        f"a rule of {', '.join(map(str, SIZE_RULES[1:]))} and the parameter it reads")
    if not (isinstance(op.draws, int) and op.draws >= 0):
        problems.append(f"draws {op.draws!r}: expected a whole number of uniforms per sample (>= 0)")
    return (problems + _param_problems(op) + _facet_problems(op)
            + (_method_problems(op) if op.category in KINDS else []))


def _builtin_ops() -> dict[str, Op]:
    ops: dict[str, Op] = {}
    for module in _MODULES:
        for op in import_module(f".{module}", __package__).REGISTERED:
            problems = op_problems(op) + ([f"name '{op.name}' is registered twice"] if op.name in ops else [])
            if problems:
                raise OpRegistrationError(f"built-in op {op.name!r} (dali_bridge.ops.{module}): " + "; ".join(problems))
            ops[op.name] = op
    return ops


def _origin(entry_point: EntryPoint) -> OpOrigin:
    dist = getattr(entry_point, "dist", None)
    return OpOrigin(dist.metadata["Name"] if dist is not None else "(unknown distribution)",
                    dist.version if dist is not None else "?", f"{entry_point.name} = {entry_point.value}")


def entry_point_ops(registered: dict[str, Op],
                    found: Iterable[EntryPoint] | None = None) -> tuple[dict[str, Op], dict[str, OpOrigin]]:
    """The ops other packages register through :data:`ENTRY_POINT_GROUP` (``found``: the entry points,
    default those of the installed distributions), checked like the built-in ones and against the
    names in ``registered``, and where each came from. Raises :class:`OpRegistrationError`."""
    ops: dict[str, Op] = {}
    origins: dict[str, OpOrigin] = {}
    for entry_point in sorted(entry_points(group=ENTRY_POINT_GROUP) if found is None else found,
                              key=lambda e: e.name):
        origin = _origin(entry_point)
        remedy = f"fix the package, or uninstall it (pip uninstall {origin.distribution})"
        try:
            op = entry_point.load()
        except Exception as exc:
            raise OpRegistrationError(f"op from {origin} cannot be loaded: {type(exc).__name__}: {exc}; "
                                      f"{remedy}") from exc
        problems = op_problems(op)
        if not problems and op.name != entry_point.name:
            problems = [f"the entry point is named '{entry_point.name}' but the op '{op.name}'; name the entry "
                        f"point after the op"]
        if not problems and op.name in registered:
            problems = [f"'{op.name}' is the name of a built-in op; give the op another name"]
        if not problems and op.name in ops:
            problems = [f"'{op.name}' is also registered by {origins[op.name]}; only one package may register a name"]
        if problems:
            raise OpRegistrationError(f"op from {origin} cannot be registered: {'; '.join(problems)}; {remedy}")
        ops[op.name], origins[op.name] = op, origin
    return ops, origins


BUILTIN_OPS: dict[str, Op] = _builtin_ops()
_FROM_PACKAGES, ORIGINS = entry_point_ops(BUILTIN_OPS)
OPS: dict[str, Op] = {**BUILTIN_OPS, **_FROM_PACKAGES}


def op_names() -> list[str]:
    return sorted(OPS)


def op_origin(name: str) -> OpOrigin | None:
    """Where op ``name`` came from when another package registered it; None for a built-in op."""
    return ORIGINS.get(name)


def unsupported_options(name: str, params: dict[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
    """Option combinations of op ``name`` that only some backends reproduce: ``(what, those backends)``."""
    return facet(OPS[name], SpecRules).unsupported_options(params)
