"""The post-finish stage: what the loader does to a finished batch before yielding it.

Every backend hands the loader a finished batch (the declared dtype and layout, on the loader's
device); this stage then applies, in plan order, the ops after the finish — per-sample ops on the
float images (``random_erasing``), then batch-level ops (``mixup``, ``cutmix``, ``batch_mix``) — and
builds the ``target`` output: one-hot labels over the source's classes, label smoothing folded in
(``(1 - ε) * one_hot + ε / num_classes``, what ``CrossEntropyLoss(label_smoothing=ε)`` uses), then
mixed with the images. The same torch code runs for every backend, so they differ after the
finish by nothing but what they handed over.

Draws: a per-sample op's uniforms are :func:`~dali_bridge.pipeline.sampling.draws`' (seed, epoch, sample
index, position); a batch op's are keyed by (seed, epoch, the batch's position in the rank's epoch,
rank, position) — a resumed run mixes the same pairs with the same λ and boxes.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from ..util.intra_op import one_intra_op_thread_here
from ..ops.after_finish import BATCH
from ..pipeline.plan import Plan
from ..pipeline.sampling import draws, uniforms

# Batch draws' counter: the rank in the high half, so (batch, rank) never collide for any world size.
_RANK_SHIFT = 32


def batch_uniforms(seed: int, epoch: int, number: int, rank: int, position: int, count: int) -> np.ndarray:
    """``[count]`` uniforms of the batch op at ``position`` for batch ``number`` of ``rank``'s epoch."""
    key = np.array([(rank << _RANK_SHIFT) + number], dtype=np.uint64)
    return uniforms(seed, epoch, key, stream=position + 1, count=count)[0]


@dataclass(frozen=True)
class PostFinish:
    """The stage for one loader: its plan, seed and rank, and the target's classes and smoothing."""
    plan: Plan
    seed: int
    rank: int
    num_classes: int
    label_smoothing: float = 0.0
    wants_target: bool = False

    @property
    def active(self) -> bool:
        return bool(self.plan.post_finish) or self.wants_target

    def targets(self, labels: torch.Tensor) -> torch.Tensor:
        """float32 [N, num_classes] one-hot targets with label smoothing folded in."""
        one_hot = torch.nn.functional.one_hot(labels, num_classes=self.num_classes).to(torch.float32)
        if self.label_smoothing:
            one_hot = one_hot.mul_(1.0 - self.label_smoothing).add_(self.label_smoothing / self.num_classes)
        return one_hot

    def apply(self, images: torch.Tensor, labels: torch.Tensor, indices: np.ndarray, *, epoch: int,
              number: int, repeats: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The batch after every post-finish op, and its targets (None unless the target output is wanted).

        ``labels``: int64 [N] on the images' device; ``indices``: the samples' positions in the
        listing; ``number``: the batch's position in this rank's epoch; ``repeats``: each sample's
        repeat number under ``loader.repeated_augmentations`` (None: all 0), part of its draw key.
        """
        # On the host these ops run on the consumer's thread as a stream of small kernels (a sample's
        # erased box, its label row): each would fork and join an OpenMP team whose threads then spin,
        # waiting for the next, on the cores the loader's workers are using.
        with one_intra_op_thread_here() if images.device.type == "cpu" else nullcontext():
            return self._apply(images, labels, indices, epoch=epoch, number=number, repeats=repeats)

    def _apply(self, images: torch.Tensor, labels: torch.Tensor, indices: np.ndarray, *, epoch: int,
               number: int, repeats: np.ndarray | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        targets = self.targets(labels) if self.wants_target else None
        if not self.plan.post_finish or len(indices) == 0:
            return images, targets
        hwc = self.plan.finish.layout == "HWC"
        chw = images.permute(0, 3, 1, 2) if hwc else images  # a view: the ops see NCHW either way
        sample_draws = draws(self.plan, self.seed, epoch, np.asarray(indices, dtype=np.int64), repeats)
        height, width = chw.shape[-2:]
        for position, step in self.plan.post_finish:
            op, params = step.op, step.params
            if op.category == BATCH:
                u = batch_uniforms(self.seed, epoch, number, self.rank, position, op.batch_draws)
                chw, targets = op.apply_batch(params, chw, targets, op.sample_batch(params, u, height, width))
                continue
            rows = sample_draws.get(position)
            op.apply_samples(params, chw, [op.sample(params, rows[row] if rows is not None else None, height, width)
                                           for row in range(chw.shape[0])])
        if hwc:
            chw = chw.permute(0, 2, 3, 1)
            images = chw if chw.is_contiguous() else chw.contiguous()
        else:
            images = chw
        return images, targets
