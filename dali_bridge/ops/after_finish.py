"""The interface of ops that run after the finish: per-sample ops on float tensors (kind
``after_finish``: ``random_erasing``) and batch-level ops (kind ``batch``: ``mixup``, ``cutmix``,
``batch_mix``).

Neither kind reaches a backend executor: ``Plan.steps`` stops at the finish, and the loader's
post-finish stage (:mod:`dali_bridge.loader.post_finish`) applies these ops, in plan order, to each
finished batch on the loader's device — the same torch code for every backend, so the backends
differ after the finish by nothing but what they handed over.

* An ``after_finish`` op draws ``draws`` uniforms per sample, keyed like any per-sample op by
  (seed, epoch, sample index, position), turns them into concrete parameters with ``sample`` and
  applies them in place to one CHW float image with :meth:`AfterFinishOp.apply`.
* A ``batch`` op draws ``batch_draws`` uniforms per batch, keyed by (seed, epoch, the batch's
  position in the rank's epoch, rank, position), turns them into concrete parameters with
  :meth:`BatchOp.sample_batch` and applies them to the NCHW batch and its soft targets with
  :meth:`BatchOp.apply_batch`.
"""
from __future__ import annotations

from typing import Any, ClassVar, Mapping

import numpy as np

from .base import Category, Op

AFTER_FINISH = Category.AFTER_FINISH
BATCH = Category.BATCH
POST_FINISH_KINDS = (AFTER_FINISH, BATCH)


class AfterFinishOp(Op):
    """A per-sample op on the finished float image (kind ``after_finish``)."""

    def apply(self, params: Mapping[str, Any], image: Any, concrete: tuple) -> None:
        """Apply one sample's concrete parameters to its CHW float tensor, in place (a view into the batch)."""
        raise NotImplementedError(f"op {self.name!r} has no post-finish kernel")

    def apply_samples(self, params: Mapping[str, Any], images: Any, concretes: list[tuple]) -> None:
        """Apply each sample's concrete parameters to its row of the NCHW batch, in place (an op whose
        per-sample values live on the host overrides this to move them to the batch's device at once)."""
        for row, concrete in enumerate(concretes):
            self.apply(params, images[row], concrete)

    def stage(self, params: Mapping[str, Any]) -> str:
        """What ``dali-bridge show`` lists for this op (the same on every backend)."""
        raise NotImplementedError(f"op {self.name!r} has no post-finish stage")


class BatchOp(Op):
    """An op on the whole finished batch and its soft targets (kind ``batch``)."""
    batch_draws: ClassVar[int] = 0  # uniforms drawn per batch
    mixes_targets: ClassVar[bool] = False  # blends samples' labels: the pipeline must output `target`

    @property
    def random(self) -> bool:
        return self.batch_draws > 0

    def sample_batch(self, params: Mapping[str, Any], u: np.ndarray, height: int, width: int) -> Any:
        """Concrete parameters for one batch of (height, width) images from its ``batch_draws`` uniforms."""
        raise NotImplementedError(f"op {self.name!r} has no batch draws")

    def apply_batch(self, params: Mapping[str, Any], images: Any, targets: Any, concrete: Any) -> tuple[Any, Any]:
        """Apply to the NCHW float batch and its [N, num_classes] float targets; returns both."""
        raise NotImplementedError(f"op {self.name!r} has no batch kernel")

    def stage(self, params: Mapping[str, Any]) -> str:
        """What ``dali-bridge show`` lists for this op (the same on every backend)."""
        raise NotImplementedError(f"op {self.name!r} has no post-finish stage")

    def torchvision_batch_transform(self, params: Mapping[str, Any], num_classes: int) -> Any:
        """The ``transforms.v2`` batch transform a user writes for this op, called as
        ``transform(images, labels)`` (the hand-written bench baseline)."""
        raise NotImplementedError(f"op {self.name!r} has no transforms.v2 batch counterpart")
