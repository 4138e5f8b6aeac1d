"""A pipeline as the ``transforms.v2`` code a user writes: each op's own counterpart
(``Op.torchvision_transforms``, ``BatchOp.torchvision_batch_transform``), in plan order.

The per-sample Compose takes what the bridge's decoder gives (a uint8 CHW tensor, as
``torchvision.io.decode_image``); put ``v2.PILToTensor()`` first to feed it PIL images (``pil=True``
places it after the last op that runs on uint8 images). Batch-level ops (MixUp, CutMix) are not
per-sample transforms: :func:`batch_transform` gives theirs, applied as ``transform(images, labels)``.
The bench's hand-written torchvision baseline is built from these two functions. A pipeline with
views gives one Compose per view, in the order of its batches' views (what ``from_torchvision`` takes back).

Public as ``dali_bridge.to_torchvision(spec)`` and ``dali_bridge.batch_transform(spec, num_classes=N)``.
"""
from __future__ import annotations

from typing import Any

from ..pipeline.plan import LoweredSpec, Plan, build_plan
from ..errors import RecipeError


def _plan(spec_or_plan: LoweredSpec | Plan) -> Plan:
    return spec_or_plan if isinstance(spec_or_plan, Plan) else build_plan(spec_or_plan)


def _counterpart(step: Any) -> list:
    try:
        return step.op.torchvision_transforms(step.params)
    except NotImplementedError as exc:
        raise RecipeError([f"op {step.name!r} has no transforms.v2 counterpart: {exc}"]) from exc


def to_torchvision(spec_or_plan: LoweredSpec | Plan, *, pil: bool = False, skip_batch_ops: bool = False) -> Any:
    """The ``transforms.v2.Compose`` equivalent to a spec's (or plan's) per-sample ops: each step's
    counterpart, the finish's (``ToDtype`` + ``Normalize``), then ops on the normalised image
    (``RandomErasing``). A batch-level op (mixup, cutmix, batch_mix) is refused unless
    ``skip_batch_ops``: it belongs in :func:`batch_transform`, not in a per-sample Compose.
    Raises :class:`RecipeError` naming an op without a counterpart (timm's RandAugment variant).
    With views: a list of such Composes, one per view in output order."""
    plan = _plan(spec_or_plan)
    if plan.views:
        return [_compose(view, pil=pil, skip_batch_ops=skip_batch_ops) for view in plan.views]
    return _compose(plan, pil=pil, skip_batch_ops=skip_batch_ops)


def _compose(plan: Plan, *, pil: bool, skip_batch_ops: bool) -> Any:
    from torchvision.transforms import v2

    batch = [step.name for _, step in plan.post_finish if step.op.category == "batch"]
    if batch and not skip_batch_ops:
        raise RecipeError([f"op {batch[0]!r} runs on whole batches, not in a per-sample Compose: call "
                           f"to_torchvision(..., skip_batch_ops=True) for the Compose and "
                           f"dali_bridge.batch_transform(spec, num_classes=...) for its MixUp/CutMix"])
    transforms: list = []
    for step in plan.steps:
        transforms += _counterpart(step)
    if pil:
        transforms.append(v2.PILToTensor())
    transforms += _counterpart(plan.finish_step)
    for _, step in plan.post_finish:  # per-sample ops on the normalised image (random_erasing)
        if step.op.category != "batch":
            transforms += _counterpart(step)
    return v2.Compose(transforms)


def batch_transform(spec_or_plan: LoweredSpec | Plan, *, num_classes: int) -> Any:
    """The ``transforms.v2`` batch transform (MixUp, CutMix, or a RandomChoice of both) of a spec's
    batch-level op, called as ``transform(images, labels)``; None when the spec has none."""
    plan = _plan(spec_or_plan)
    batch = [step for _, step in plan.post_finish if step.op.category == "batch"]
    return batch[0].op.torchvision_batch_transform(batch[0].params, num_classes) if batch else None
