"""A ``transforms.v2`` Compose (or torchvision's v1 classes of the same names) as a pipeline.

Each transform maps to the op whose ``transform`` names its class (the op's ``transforms.v2``
counterpart, :meth:`~dali_bridge.ops.base.Op.torchvision_transforms`); its parameters are read
from the transform's attributes of the op's parameter names (``p`` for ``probability``), and the
op's own checkers validate them. The conversions (``ToDtype``/``ConvertImageDtype``/``ToTensor``,
then ``Normalize``) become the ``normalize`` finish; ``PILToTensor``, ``ToImage``, ``ToPureTensor``
and ``RGB`` change only the container, which the bridge's decoder fixes. Every mapped transform is
checked against the counterpart the op builds back: an attribute that would come back different is
refused rather than dropped. Only torchvision's own classes are mapped: a subclass (whose methods
may do otherwise) or a class that only shares a name is refused by its qualified name.
``RandomApply([t], p)`` of one transform whose op takes a ``probability`` that ``t`` has not
(``ColorJitter``, ``GaussianBlur``: the self-supervised recipes' jitter and blur) is that op with
``probability: p``. A list of transforms, one per view (or a mapping of group name to such a list),
becomes a pipeline with ``views`` (:mod:`dali_bridge.recipes.view_groups`).
"""
from __future__ import annotations

import difflib
import enum
import inspect
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from ..errors import RecipeError
from ..util.urls import Scrubbed
from .importing import foreign_class_problem, library_class
from .spec_data import build_spec
from .view_groups import group_views

from ..pipeline.plan import build_plan

if TYPE_CHECKING:
    from ..spec.pipeline import PipelineSpec

_CONTAINERS = frozenset({"PILToTensor", "ToImage", "ToPureTensor", "RGB"})
_CONVERSIONS = frozenset({"ToDtype", "ConvertImageDtype", "ToTensor"})
_ATTRIBUTE = {"probability": "p"}  # the op's parameter name -> torchvision's attribute name
# Attributes that do not change the output (in-place or not) or restate another one (v1 AutoAugment's table).
_IGNORED = frozenset({"training", "inplace", "policies"})
_DTYPES = {"torch.float32": "float32", "torch.float16": "float16", "torch.uint8": "uint8"}


class RecipeWarning(Scrubbed, UserWarning):
    """A difference the converted pipeline keeps on purpose, said once (the CLI prints it as a note)."""


def _plain(value: Any) -> Any:
    """An attribute as pipeline data: enums by value, tuples and tensors as lists."""
    if isinstance(value, enum.Enum):
        return value.value
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def _square(size: Any) -> Any:
    return size[0] if isinstance(size, list) and len(size) == 2 and size[0] == size[1] else size


def _fix_resize(params: dict) -> dict:
    size = params.get("size")
    return {**params, "size": size[0] if isinstance(size, list) and len(size) == 1 else size}


def _fix_erasing(params: dict) -> dict:
    value = params.get("value")
    if value is None:  # transforms.v2 keeps value="random" as None
        value = "random"
    elif isinstance(value, list) and len(value) == 1:
        value = value[0]
    return {**params, "value": value}


def _fix_blur(params: dict) -> dict:
    return {**params, "kernel_size": _square(params.get("kernel_size"))}


_FIXES = {
    "random_resized_crop": lambda p: {**p, "size": _square(p.get("size"))},
    "center_crop": lambda p: {**p, "size": _square(p.get("size"))},
    "resize": _fix_resize,
    "random_erasing": _fix_erasing,
    "gaussian_blur": _fix_blur,
}


def _ops_by_transform() -> dict[str, Any]:
    from ..ops.registry import OPS

    return {op.transform: op for op in OPS.values() if op.transform and op.category not in ("finish", "compound")}


def read_params(op: Any, transform: Any) -> tuple[dict[str, Any], set[str]]:
    """The op's parameters read from a transform's attributes, and the attribute names read."""
    params, read = {}, set()
    for param in op.params:
        attribute = _ATTRIBUTE.get(param.name, param.name)
        if hasattr(transform, attribute):
            params[param.name] = _plain(getattr(transform, attribute))
            read.add(attribute)
    fix = _FIXES.get(op.name)
    return (fix(params) if fix else params), read


def flatten(transform: Any) -> list:
    """The transforms of a Compose (nested ones inlined), or of an object holding one in ``.transforms``
    (torchvision's reference presets); one transform stands for itself."""
    inner = getattr(transform, "transforms", None)
    if library_class(transform) == "Compose" or (inner is not None and library_class(inner) == "Compose"):
        items = inner.transforms if library_class(inner) == "Compose" else inner
        return [leaf for item in items for leaf in flatten(item)]
    return [transform]


# Transforms whose nearest op is not the nearest name: what does the same kind of thing.
_NEAREST = {"RandomCrop": "RandomResizedCrop", "Grayscale": "RandomGrayscale", "RandomRotation": "TrivialAugmentWide",
            "RandomAffine": "TrivialAugmentWide", "RandomPosterize": "TrivialAugmentWide",
            "RandomEqualize": "TrivialAugmentWide",
            "RandomAutocontrast": "TrivialAugmentWide", "RandomAdjustSharpness": "TrivialAugmentWide"}


def _closest(name: str, ops: Mapping[str, Any]) -> str:
    hit = [_NEAREST[name]] if name in _NEAREST else difflib.get_close_matches(name, list(ops), n=1, cutoff=0.6)
    if hit:
        return f"the closest op is {ops[hit[0]].name!r} (torchvision's {hit[0]})"
    mappable = sorted(n for n, op in ops.items() if op.category != "batch")
    return f"the transforms with an op are: {', '.join(mappable)}"


def _unmappable(label: str, name: str, ops: Mapping[str, Any]) -> str:
    op = ops.get(name)
    if op is not None and op.category == "batch":
        return (f"{label}: {name} mixes whole batches, not one image: pass it as "
                f"from_torchvision(..., batch_transform=...) (the '{op.name}' op)")
    if name in ("RandomApply", "RandomChoice", "RandomOrder"):
        return f"{label}: {name} has no op (each op draws its own chance); {_closest(name, ops)}"
    return f"{label}: {name} has no op in dali-bridge; {_closest(name, ops)}"


def _applied_inner(transform: Any, ops: Mapping[str, Any]) -> tuple[Any, str | None]:
    """The one transform a ``RandomApply`` wraps, whose op takes its ``p`` as ``probability``, or (None, why not)."""
    inner = list(transform.transforms)
    if len(inner) != 1:
        return None, (f"RandomApply of {len(inner)} transforms has no op (each op draws its own chance): give each "
                      f"transform its own probability")
    name = library_class(inner[0])
    if name is None:
        return None, f"RandomApply of {foreign_class_problem(inner[0])}"
    op = ops.get(name)
    if op is None or op.param("probability") is None:
        wrapped = sorted(n for n, o in ops.items() if o.param("probability") is not None and not _has_own_p(n))
        return None, (f"RandomApply of {name} has no op: RandomApply maps to the probability of the op of one "
                      f"of {', '.join(wrapped)}")
    if hasattr(inner[0], "p"):
        return None, (f"RandomApply of {name}, which draws its own chance p={inner[0].p}: give {name} the chance "
                      f"of both (p={inner[0].p} x {transform.p}) instead")
    return inner[0], None


def _has_own_p(transform_name: str) -> bool:
    """Whether torchvision's transform of this name takes its own ``p``."""
    from torchvision.transforms import v2

    cls = getattr(v2, transform_name, None)
    return cls is not None and "p" in inspect.signature(cls).parameters


def _dtype(transform: Any) -> tuple[str | None, str | None]:
    """The finish's dtype for a conversion transform, or (None, why not)."""
    name = type(transform).__name__
    if name == "ToTensor":
        return "float32", None
    dtype = getattr(transform, "dtype", None)
    if isinstance(dtype, dict):
        return None, "a dtype per input type has no op: give one dtype, e.g. v2.ToDtype(torch.float32, scale=True)"
    found = _DTYPES.get(str(dtype))
    if found is None:
        return None, f"dtype {dtype} has no finish (it gives float32, float16 or uint8)"
    if name == "ToDtype" and found != "uint8" and not getattr(transform, "scale", False):
        return None, ("scale=False keeps values in 0-255, the bridge's finish scales to [0, 1] before "
                      "normalising: use v2.ToDtype(..., scale=True)")
    return found, None


class _Reader:
    """One pass over the flattened transforms: the ops in order (the finish where the conversion to
    float is), each with the label of its transform; every problem at once."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix  # "view 1: " before each label of a view's transforms
        self.by_transform = _ops_by_transform()
        self.entries: list[tuple[str, dict, str, Any, set]] = []  # op, params, label, transform, attributes read
        self.problems: list[str] = []
        self.finish: dict[str, Any] | None = None
        self.ops_on_pil = 0  # ops before a PIL-to-tensor conversion: they ran on PIL images

    def read(self, transforms: list) -> None:
        tensor_seen = False
        for position, transform in enumerate(transforms):
            name = library_class(transform)
            if name is None:   # not torchvision's own class: what it does is not known
                self.problems.append(f"{self.prefix}transform {position} ({type(transform).__name__}): "
                                     f"{foreign_class_problem(transform)}")
                continue
            label = f"{self.prefix}transform {position} ({name})"
            if name in ("PILToTensor", "ToImage", "ToTensor") and not tensor_seen:
                tensor_seen, self.ops_on_pil = True, len(self.entries)
            if name in _CONVERSIONS:
                self._conversion(label, transform)
            elif name == "Normalize":
                self._normalize(label, transform)
            elif name == "RandomApply":
                self._random_apply(label, transform)
            elif name not in _CONTAINERS:
                self._op(label, name, transform)

    def _random_apply(self, label: str, transform: Any) -> None:
        inner, why = _applied_inner(transform, self.by_transform)
        if why is not None:
            self.problems.append(f"{label}: {why}")
        else:
            self._op(label, library_class(inner), inner, applied_by=transform)

    def _op(self, label: str, name: str, transform: Any, applied_by: Any = None) -> None:
        """``applied_by``: the RandomApply around ``transform``, whose ``p`` is the op's probability."""
        op = self.by_transform.get(name)
        if op is None or op.category == "batch":
            self.problems.append(_unmappable(label, name, self.by_transform))
            return
        after = op.category == "after_finish"
        if after and self.finish is None:
            self.problems.append(f"{label}: the bridge erases the normalised float image ('{op.name}' runs after "
                                 f"normalize, its value in normalised units): move it after ToDtype/Normalize")
            return
        if not after and self.finish is not None:
            self.problems.append(f"{label}: comes after the conversion to float; the bridge runs '{op.name}' on "
                                 f"uint8 images before the finish: move it before ToDtype/Normalize")
            return
        params, read = read_params(op, transform)
        if applied_by is not None:
            params["probability"] = float(applied_by.p)
        self.entries.append((op.name, params, label, applied_by or transform, read))

    def _conversion(self, label: str, transform: Any) -> None:
        dtype, why = _dtype(transform)
        if why is not None:
            self.problems.append(f"{label}: {why}")
        elif self.finish is not None:
            self.problems.append(f"{label}: a second conversion; the bridge converts once, in the finish")
        elif dtype != "uint8":  # to uint8 on uint8 images changes nothing
            self.finish = {"dtype": dtype}
            self.entries.append(("normalize", self.finish, label, None, set()))

    def _normalize(self, label: str, transform: Any) -> None:
        if self.finish is None:
            self.problems.append(f"{label}: Normalize before a conversion to float: put "
                                 f"v2.ToDtype(torch.float32, scale=True) before it")
        elif "mean" in self.finish:
            self.problems.append(f"{label}: a second Normalize; the finish normalises once")
        else:
            mean, std = _plain(transform.mean), _plain(transform.std)
            self.finish.update(mean=mean * 3 if len(mean) == 1 else mean, std=std * 3 if len(std) == 1 else std)


def _checked(op: Any, transform: Any) -> dict[str, Any]:
    """The parameters read from a transform as the op's checkers normalise them."""
    return {key: op.param(key).check(value)[0] for key, value in read_params(op, transform)[0].items()}


def _unwrapped(transform: Any) -> tuple[Any, float]:
    """A RandomApply's one transform and its ``p``; any other transform and 1 (it always runs)."""
    if library_class(transform) == "RandomApply":
        return transform.transforms[0], float(transform.p)
    return transform, 1.0


def _round_trip_problems(plan: Any, entries: list) -> list[str]:
    """Each mapped transform against the counterpart its op builds back: every attribute equal."""
    problems = []
    for step in plan.ops:
        if step.op_index >= len(entries):  # the batch transform's op, read from its own attributes
            continue
        name, _, label, transform, read = entries[step.op_index]
        if transform is None:
            continue
        (transform, chance), (counterpart, back) = (_unwrapped(t) for t in (
            transform, step.op.torchvision_transforms(step.params)[0]))
        if chance != back:
            problems.append(f"{label}: RandomApply's p={chance} has no equal in '{name}' (it gives {back})")
        ours, theirs = _checked(step.op, transform), _checked(step.op, counterpart)
        problems += [f"{label}: {key} {ours[key]!r} has no equal in '{name}' (it gives {theirs.get(key)!r})"
                     for key in ours if ours[key] != theirs.get(key)]
        for attribute, value in vars(transform).items():
            if attribute.startswith("_") or attribute in read or attribute in _IGNORED:
                continue
            if _plain(value) != _plain(getattr(counterpart, attribute, None)):
                problems.append(f"{label}: its {attribute}={value!r} has no parameter in '{name}'")
    return problems


def _mix_alphas(transforms: list) -> dict[str, float] | None:
    """{"mixup": α, "cutmix": α} of a list holding MixUp and/or CutMix (each once), or None."""
    alphas = {type(t).__name__.lower(): float(t.alpha) for t in transforms}
    return alphas if len(alphas) == len(transforms) and set(alphas) <= {"mixup", "cutmix"} else None


def read_batch_transform(transform: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The batch-mixing op of torchvision's MixUp, CutMix, ``RandomChoice`` of them (the reference
    train.py's collate) and ``RandomApply`` of either: ``({op: params}, None)``, or ``(None, why not)``."""
    probability = 1.0
    if library_class(transform) == "RandomApply" and len(transform.transforms) == 1:
        probability, transform = float(transform.p), transform.transforms[0]
    name = library_class(transform)
    choice = list(transform.transforms) if name == "RandomChoice" else [transform]
    foreign = [t for t in [transform, *choice] if library_class(t) is None]
    if foreign:
        return None, f"batch_transform: {foreign_class_problem(foreign[0])}"
    alphas = _mix_alphas(choice)
    if alphas is None:
        return None, (f"batch_transform: {name} has no op: give v2.MixUp, v2.CutMix, a v2.RandomChoice of them, "
                      f"or a v2.RandomApply of one of those")
    weights = [float(w) for w in transform.p] if name == "RandomChoice" else [1.0]
    chance = dict(zip([type(t).__name__.lower() for t in choice], [w / sum(weights) for w in weights]))
    if len(alphas) == 1 and probability == 1.0:
        kind = next(iter(alphas))
        return {kind: {"alpha": alphas[kind]}}, None
    params = {"cutmix_probability": chance.get("cutmix", 0.0), "probability": probability}
    params.update({f"{kind}_alpha": alpha for kind, alpha in alphas.items()})
    return {"batch_mix": params}, None


def _pil_note(ops_on_pil: int) -> None:
    if ops_on_pil:
        warnings.warn(RecipeWarning(
            f"the first {ops_on_pil} op(s) run on PIL images in this Compose (its conversion to a tensor comes "
            f"after them); the pipeline runs torchvision's tensor kernels, whose resampling and colour arithmetic "
            f"differ from PIL's by a few levels: put v2.PILToTensor() first to compare pixel for pixel"),
            stacklevel=3)


def _parameter_problems(ops: list, labels: list) -> list[str]:
    """What the op checkers say about each mapped transform's parameters."""
    from ..ops.registry import OPS

    problems = []
    for op, label in zip(ops, labels):
        name, params = next(iter(op.items()))
        for param in OPS[name].params:
            message = param.check(params[param.name])[1] if param.name in params else None
            if message:
                problems.append(f"{label}: {param.name}: {message}")
    return problems


def from_torchvision(transform: Any, *, source: str | Path | Mapping[str, Any], batch_size: int = 32,
                     name: str = "from-torchvision", batch_transform: Any = None, label_smoothing: float = 0.0,
                     overrides: Mapping[str, Any] | None = None) -> "PipelineSpec":
    """The :class:`~dali_bridge.spec.pipeline.PipelineSpec` of a ``transforms.v2.Compose`` (v1 classes of the same
    names too; an object holding its Compose in ``.transforms``, as torchvision's reference presets).

    ``source``: a folder path or a source mapping; ``batch_size`` (default 32, torchvision's reference
    train.py's). ``batch_transform``: the MixUp/CutMix applied to batches (train.py's collate),
    ``label_smoothing``: the loss's; either makes the pipeline output soft ``target``\\ s.
    ``overrides``: dotted keys as :func:`~dali_bridge.load_spec` takes them (``{"loader.shuffle": False}``).
    Raises :class:`RecipeError` listing every transform it cannot map, each with the closest op.
    ``spec.to_yaml()`` is the pipeline file.

    Views: ``transform`` a list of transforms, one per view (lightly's and DINO's ``transforms``
    lists), or a mapping of group name → such a list, gives a pipeline with ``views`` whose batches
    give every view (:mod:`dali_bridge.recipes.view_groups` groups them); it takes no
    ``batch_transform`` or ``label_smoothing`` (its batches have labels, not soft targets)."""
    if isinstance(transform, (list, tuple, Mapping)):
        if batch_transform is not None or label_smoothing:
            raise RecipeError(["batch_transform/label_smoothing: a pipeline with views gives labels, not soft "
                               "targets: mix and smooth in the training step"], "from_torchvision(views)")
        return _views_from_torchvision(transform, source=source, batch_size=batch_size, name=name,
                                       overrides=overrides)
    reader = _Reader()
    reader.read(flatten(transform))
    ops = [{op: params} for op, params, *_ in reader.entries]
    labels = [label for _, _, label, *_ in reader.entries]
    if batch_transform is not None:
        mix, why = read_batch_transform(batch_transform)
        if why is not None:
            reader.problems.append(why)
        else:
            ops.append(mix)
            labels.append(f"batch_transform ({type(batch_transform).__name__})")
    origin = f"from_torchvision({type(transform).__name__})"
    if reader.problems:  # with the mapped transforms' own parameter problems, all at once
        raise RecipeError(reader.problems + _parameter_problems(ops, labels), origin)
    spec = build_spec(ops, labels, source=source, batch_size=batch_size, name=name, origin=origin,
                      label_smoothing=label_smoothing, overrides=overrides)
    problems = _round_trip_problems(build_plan(spec), reader.entries)
    if problems:
        raise RecipeError(problems, origin)
    _pil_note(reader.ops_on_pil)
    return spec


def _views_from_torchvision(views: Any, *, source: Any, batch_size: int, name: str,
                            overrides: Mapping[str, Any] | None) -> "PipelineSpec":
    """:func:`from_torchvision` of a list of transforms, one per view, or of a mapping of group name →
    such a list: each view read as a Compose is, then grouped into the ``views`` section."""
    from ..ops.facets import Sizing, facet
    from ..ops.registry import OPS

    named = dict(views) if isinstance(views, Mapping) else {None: list(views)}
    origin = f"from_torchvision({len(named) if isinstance(views, Mapping) else len(named[None])} views)"
    readers: dict[Any, list[_Reader]] = {}
    problems: list[str] = []
    for group, transforms in named.items():
        readers[group] = []
        for v, transform in enumerate(transforms):
            number = sum(len(r) for r in readers.values())
            reader = _Reader(f"view {number}: " if group is None else f"views group '{group}', view {v}: ")
            reader.read(flatten(transform))
            ops, labels = [{op: params} for op, params, *_ in reader.entries], [e[2] for e in reader.entries]
            problems += reader.problems + (_parameter_problems(ops, labels) if reader.problems else [])
            readers[group].append(reader)
    if problems or not all(readers.values()):
        raise RecipeError(problems or ["views: expected at least one transform per group"], origin)
    chains = {group: [[{op: params} for op, params, *_ in r.entries] for r in found]
              for group, found in readers.items()}
    sections = group_views(chains if isinstance(views, Mapping) else chains[None], origin=origin,
                           size_params={op_name: facet(op, Sizing).size_param for op_name, op in OPS.items()})
    every = [reader for found in readers.values() for reader in found]
    first = {group: every[sum(g["count"] for g in list(sections.values())[:n])]
             for n, group in enumerate(sections)}
    spec = build_spec([], [], source=source, batch_size=batch_size, name=name, origin=origin, overrides=overrides,
                      views=sections, view_labels={group: [e[2] for e in r.entries] for group, r in first.items()})
    problems = [problem for plan, reader in zip(build_plan(spec).view_plans, every)
                for problem in _round_trip_problems(plan, reader.entries)]
    if problems:
        raise RecipeError(problems, origin)
    _pil_note(max(reader.ops_on_pil for reader in every))
    return spec
