"""Batch mixing: ``mixup``, ``cutmix`` and ``batch_mix`` (one of the two per batch).

Kind ``batch``: they run on the whole finished batch on the loader's device, last in the plan,
and blend the ``target`` output (soft targets) as they blend the images. Pairing, λ and the box
are torchvision's ``transforms.v2.MixUp``/``CutMix``: each sample is paired with the batch rolled
by one (sample n with sample n-1), λ ~ Beta(α, α); MixUp gives
``rolled * (1 - λ) + batch * λ``; CutMix pastes the rolled batch's box, centred at a uniform pixel
with half-sides ``int(0.5 * sqrt(1 - λ) * side)`` clipped to the image, and corrects λ to the
kept area. Targets mix with the same λ, as torchvision's ``_mixup_label``.

Draws per batch (:data:`BATCH_DRAWS` uniforms, keyed by seed, epoch, the batch's position in the
rank's epoch, rank and the op's position): whether the batch is mixed (``batch_mix``'s
``probability``), which of MixUp and CutMix (``cutmix_probability``), λ (numpy's Beta sampler
seeded by the batch's own uniform: a pure function of the key), the box centre's column and row.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .after_finish import BATCH, BatchOp
from ..util.checks import type_name, is_number, probability_checker
from .base import Param

BATCH_DRAWS = 5  # mixed or not, MixUp or CutMix, λ's seed, box centre column, box centre row


@dataclass(frozen=True)
class Mix:
    """One batch's mixing: ``mode`` ``mixup`` | ``cutmix`` | ``none``; ``lam`` the weight of each
    sample's own image and label (CutMix's corrected to the kept area); ``box`` CutMix's
    (x1, y1, x2, y2) in pixels."""
    mode: str
    lam: float = 1.0
    box: tuple[int, int, int, int] | None = None


def beta_draw(alpha: float, u: float) -> float:
    """λ ~ Beta(alpha, alpha) from one uniform: numpy's Beta sampler seeded by the uniform's 53 bits."""
    return float(np.random.default_rng(int(u * (1 << 53))).beta(alpha, alpha))


def cutmix_box(lam: float, height: int, width: int, u_x: float, u_y: float) -> tuple[tuple[int, int, int, int], float]:
    """torchvision's ``CutMix.make_params``: the box (x1, y1, x2, y2) centred at column
    ``floor(u_x * width)``, row ``floor(u_y * height)`` (its ``torch.randint``), and λ corrected."""
    r_x = min(int(u_x * width), width - 1)
    r_y = min(int(u_y * height), height - 1)
    r = 0.5 * math.sqrt(1.0 - lam)
    r_w_half, r_h_half = int(r * width), int(r * height)
    x1, y1 = max(r_x - r_w_half, 0), max(r_y - r_h_half, 0)
    x2, y2 = min(r_x + r_w_half, width), min(r_y + r_h_half, height)
    return (x1, y1, x2, y2), float(1.0 - (x2 - x1) * (y2 - y1) / (width * height))


def mix_batch(images: Any, targets: Any, mix: Mix) -> tuple[Any, Any]:
    """Apply one batch's :class:`Mix` to NCHW float images and [N, K] float targets (torchvision's
    arithmetic: ``rolled.mul_(1 - λ).add_(x.mul(λ))``; CutMix pastes the rolled batch's box).

    In place: the batch is the loader's own, fresh from the finish. CutMix rolls only its box and
    pastes it over the batch (torchvision clones the whole batch first, the same pixels). MixUp on
    the host goes sample by sample (:func:`mixup_in_place`)."""
    if mix.mode == "none":
        return images, targets
    if mix.mode == "mixup":
        images = mixup_in_place(images, mix.lam, per_sample=images.device.type == "cpu")
    else:
        x1, y1, x2, y2 = mix.box
        images[..., y1:y2, x1:x2] = images[..., y1:y2, x1:x2].roll(1, 0)  # roll copies: no overlap
    if targets is not None:
        targets = targets.roll(1, 0).mul_(1.0 - mix.lam).add_(targets.mul(mix.lam))
    return images, targets


def mixup_in_place(images: Any, lam: float, *, per_sample: bool) -> Any:
    """``images[n] = images[n - 1] * (1 - λ) + images[n] * λ`` for every n (sample 0 with the last),
    rounded as torchvision's MixUp rounds it: each product in float32, then their sum.

    ``per_sample`` (the host): one sample at a time from the last to the first, so each sample's
    partner is still unmixed when it is read and every operand stays in the cache, where the
    batch-wide roll, products and sum each stream the whole batch (47 MiB for 128 images at 176 px)
    through memory. On a GPU that costs three launches per sample; the batch-wide form there (one
    batch-sized copy)."""
    keep = 1.0 - lam
    if not per_sample:
        rolled = images.roll(1, 0).mul_(keep)
        return images.mul_(lam).add_(rolled)
    # One intra-op thread: the post-finish stage runs it under one_intra_op_thread_here.
    last = images[-1].mul(keep)  # sample 0's partner, before the loop mixes it
    for n in range(images.shape[0] - 1, 0, -1):
        images[n].mul_(lam).add_(images[n - 1].mul(keep))
    images[0].mul_(lam).add_(last)
    return images


def _alpha_checker(value: Any) -> tuple[Any, str | None]:
    if not is_number(value) or value <= 0:
        return value, f"expected alpha > 0 (Beta(alpha, alpha) draws λ), found {type_name(value)} {value!r}"
    return float(value), None


class _Mixing(BatchOp):
    batch_draws = BATCH_DRAWS
    mixes_targets = True

    def mode(self, params: Mapping[str, Any], u: np.ndarray) -> str:
        raise NotImplementedError

    def alpha(self, params: Mapping[str, Any], mode: str) -> float:
        return params["alpha"]

    def sample_batch(self, params, u, height, width) -> Mix:
        mode = self.mode(params, u)
        if mode == "none":
            return Mix("none")
        lam = beta_draw(self.alpha(params, mode), u[2])
        if mode == "mixup":
            return Mix("mixup", lam)
        box, lam = cutmix_box(lam, height, width, u[3], u[4])
        return Mix("cutmix", lam, box)

    def apply_batch(self, params, images, targets, concrete):
        return mix_batch(images, targets, concrete)


class MixUp(_Mixing):
    transform = "MixUp"

    def mode(self, params, u):
        return "mixup"

    def stage(self, params) -> str:
        return f"torch: MixUp (alpha {params['alpha']:g}) on the batch and its targets"

    def torchvision_batch_transform(self, params, num_classes):
        from torchvision.transforms import v2

        return v2.MixUp(alpha=params["alpha"], num_classes=num_classes)


class CutMix(_Mixing):
    transform = "CutMix"

    def mode(self, params, u):
        return "cutmix"

    def stage(self, params) -> str:
        return f"torch: CutMix (alpha {params['alpha']:g}) on the batch and its targets"

    def torchvision_batch_transform(self, params, num_classes):
        from torchvision.transforms import v2

        return v2.CutMix(alpha=params["alpha"], num_classes=num_classes)


class BatchMix(_Mixing):
    transform = "RandomChoice([MixUp, CutMix])"

    def mode(self, params, u):
        if not u[0] < params["probability"]:
            return "none"
        return "cutmix" if u[1] < params["cutmix_probability"] else "mixup"

    def alpha(self, params, mode):
        return params[f"{mode}_alpha"]

    def stage(self, params) -> str:
        return (f"torch: per batch, CutMix (alpha {params['cutmix_alpha']:g}) with probability "
                f"{params['cutmix_probability']:g}, else MixUp (alpha {params['mixup_alpha']:g}); "
                f"mixed with probability {params['probability']:g}")

    def torchvision_batch_transform(self, params, num_classes):
        from torchvision.transforms import v2

        choice = v2.RandomChoice([v2.MixUp(alpha=params["mixup_alpha"], num_classes=num_classes),
                                  v2.CutMix(alpha=params["cutmix_alpha"], num_classes=num_classes)],
                                 p=[1.0 - params["cutmix_probability"], params["cutmix_probability"]])
        return v2.RandomApply([choice], p=params["probability"])


_ALPHA_DOC = "α of the Beta(α, α) distribution λ is drawn from, > 0 (default {})"

MIXUP = MixUp(
    "mixup", BATCH, (Param("alpha", 1.0, _alpha_checker, _ALPHA_DOC.format(1)),),
    "Blend every image and its target with the previous one of the batch (torchvision's MixUp). Runs last, on the "
    "batch on the loader's device; needs the `target` output.",
    primary="alpha")

CUTMIX = CutMix(
    "cutmix", BATCH, (Param("alpha", 1.0, _alpha_checker, _ALPHA_DOC.format(1)),),
    "Paste a box of the previous image of the batch into every image, targets weighted by area (torchvision's "
    "CutMix). Runs last, on the batch on the loader's device; needs the `target` output.",
    primary="alpha")

BATCH_MIX = BatchMix(
    "batch_mix", BATCH, (
        Param("mixup_alpha", 0.2, _alpha_checker, "MixUp's α, > 0 (default 0.2, torchvision's recipe)"),
        Param("cutmix_alpha", 1.0, _alpha_checker, "CutMix's α, > 0 (default 1.0)"),
        Param("cutmix_probability", 0.5, probability_checker,
              "chance a mixed batch gets CutMix rather than MixUp, in [0, 1] (timm's switch_prob; default 0.5, "
              "torchvision's RandomChoice of the two)"),
        Param("probability", 1.0, probability_checker,
              "chance a batch is mixed at all, in [0, 1] (timm's prob; default 1)")),
    "Per batch, one of MixUp and CutMix (torchvision's RandomChoice([MixUp, CutMix]), timm's Mixup with "
    "switch_prob). Runs last, on the batch on the loader's device; needs the `target` output.")

REGISTERED = (MIXUP, CUTMIX, BATCH_MIX)
