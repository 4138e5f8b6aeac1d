"""The ``transforms.v2`` code of the hand-written torchvision baseline: what the ``torchvision``
references (:mod:`dali_bridge.bench.baselines`) and SPDL's torchvision configuration
(:mod:`dali_bridge.bench.spdl_baseline`) both run, so it sits below them."""
from __future__ import annotations

from ..recipes.to_torchvision import batch_transform, to_torchvision
from ..errors import RecipeError
from .results import BenchError

__all__ = ["torchvision_baseline_transform", "torchvision_batch_transform"]


def torchvision_baseline_transform(plan, pil: bool = False):
    """The ``transforms.v2`` pipeline a user writes for ``plan`` (on PIL images when ``pil``): each
    step's own ``transforms.v2`` counterpart, then the finish's (:func:`dali_bridge.recipes.to_torchvision`)."""
    try:
        return to_torchvision(plan, pil=pil, skip_batch_ops=True)
    except RecipeError as exc:
        raise BenchError(f"no hand-written torchvision equivalent: {exc.problems[0]}") from exc


def torchvision_batch_transform(plan, num_classes: int):
    """The ``transforms.v2`` batch transform (MixUp, CutMix) a user applies to each batch, or None."""
    return batch_transform(plan, num_classes=num_classes)
