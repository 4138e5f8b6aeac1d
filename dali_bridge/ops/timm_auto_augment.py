"""timm_auto_augment: timm's AutoAugment (``--aa original``, ``originalr``, ``v0``, ``v0r``, ``3a``, each
with ``-mstd``): timm's policy tables (sub-policies of (operation, probability, magnitude 0 to 10)),
its magnitude scale and PIL kernels (:mod:`dali_bridge.ops.timm_rand_augment`), so ``--aa
original-mstd0.5`` is ``{timm_auto_augment: {policy: original, magnitude_std: 0.5}}``.

timm's ``AutoAugment`` picks one sub-policy (``random.choice``) and runs each of its operations as an
``AugmentOp``: applied unless ``random.random() > probability`` (no draw at probability 1), the
magnitude noise (``random.gauss(magnitude, std)`` for a std above 0), clipped to [0, 10], the sign
(``random.random() > 0.5``: negated) of the operations timm negates, the resampling filter
(``random.choice((BILINEAR, BICUBIC))`` for ``interpolation: random``, timm's default; a fixed
``interpolation``, timm's hparam, is used as given) of shear, translate and rotate, and ``GaussianBlurRand``'s
radius (``random.uniform(0.1, 2 * factor)``). The bridge draws 11 uniforms per sample, one for each
of those calls: the sub-policy (the uniform scaled and floored), then per operation slot (at most
two) whether it applies, its noise, sign, filter and radius.

It is timm's transform, not a transforms.v2 one: on the torchvision backend and after the DALI graph
(not a ``DaliOp``, as timm's RandAugment variant) the kernels are PIL's, on the host.
"""
from __future__ import annotations

from typing import Any

from .auto_augment import fill_checker
from ..util.checks import type_name, choice_checker, is_number
from .base import Op, Param
from .facets import Batching, Display
from .policy_tables import any_discontinuous
from .timm_rand_augment import (TIMM_INTERPOLATIONS, TimmDraw, TimmOperation, apply_timm, fill_colour,
    timm_operation)

_Policy = tuple[tuple[tuple[str, float, int], ...], ...]

_V0: _Policy = (  # timm's auto_augment_policy_v0 (the TPU EfficientNet implementation's ImageNet policy)
    (("Equalize", 0.8, 1), ("ShearY", 0.8, 4)), (("Color", 0.4, 9), ("Equalize", 0.6, 3)),
    (("Color", 0.4, 1), ("Rotate", 0.6, 8)), (("Solarize", 0.8, 3), ("Equalize", 0.4, 7)),
    (("Solarize", 0.4, 2), ("Solarize", 0.6, 2)), (("Color", 0.2, 0), ("Equalize", 0.8, 8)),
    (("Equalize", 0.4, 8), ("SolarizeAdd", 0.8, 3)), (("ShearX", 0.2, 9), ("Rotate", 0.6, 8)),
    (("Color", 0.6, 1), ("Equalize", 1.0, 2)), (("Invert", 0.4, 9), ("Rotate", 0.6, 0)),
    (("Equalize", 1.0, 9), ("ShearY", 0.6, 3)), (("Color", 0.4, 7), ("Equalize", 0.6, 0)),
    (("Posterize", 0.4, 6), ("AutoContrast", 0.4, 7)), (("Solarize", 0.6, 8), ("Color", 0.6, 9)),
    (("Solarize", 0.2, 4), ("Rotate", 0.8, 9)), (("Rotate", 1.0, 7), ("TranslateYRel", 0.8, 9)),
    (("ShearX", 0.0, 0), ("Solarize", 0.8, 4)), (("ShearY", 0.8, 0), ("Color", 0.6, 4)),
    (("Color", 1.0, 0), ("Rotate", 0.6, 2)), (("Equalize", 0.8, 4), ("Equalize", 0.0, 8)),
    (("Equalize", 1.0, 4), ("AutoContrast", 0.6, 2)), (("ShearY", 0.4, 7), ("SolarizeAdd", 0.6, 7)),
    (("Posterize", 0.8, 2), ("Solarize", 0.6, 10)), (("Solarize", 0.6, 8), ("Equalize", 0.6, 1)),
    (("Color", 0.8, 6), ("Rotate", 0.4, 5)),
)
ORIGINAL: _Policy = (  # timm's auto_augment_policy_original (the AutoAugment paper's ImageNet policy)
    (("PosterizeOriginal", 0.4, 8), ("Rotate", 0.6, 9)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)), (("PosterizeOriginal", 0.6, 7), ("PosterizeOriginal", 0.6, 6)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)), (("Equalize", 0.4, 4), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, 7)), (("PosterizeOriginal", 0.8, 5), ("Equalize", 1.0, 2)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)), (("Equalize", 0.6, 8), ("PosterizeOriginal", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)), (("Rotate", 0.4, 9), ("Equalize", 0.6, 2)),
    (("Equalize", 0.0, 7), ("Equalize", 0.8, 8)), (("Invert", 0.6, 4), ("Equalize", 1.0, 8)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)), (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)), (("Sharpness", 0.4, 7), ("Invert", 0.6, 8)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, 9)), (("Color", 0.4, 0), ("Equalize", 0.6, 3)),
    (("Equalize", 0.4, 7), ("Solarize", 0.2, 4)), (("Solarize", 0.6, 5), ("AutoContrast", 0.6, 5)),
    (("Invert", 0.6, 4), ("Equalize", 1.0, 8)), (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, 8), ("Equalize", 0.6, 3)),
)


def _posterize_as(policy: _Policy, name: str) -> _Policy:
    """The policy with every posterize replaced by ``name`` (timm's 'r' variants: PosterizeIncreasing)."""
    return tuple(tuple((name if op.startswith("Posterize") else op, p, m) for op, p, m in sub) for sub in policy)


POLICIES: dict[str, _Policy] = {  # named as timm names them (TIMM_POLICY_NAMES)
    "original": ORIGINAL,
    "originalr": _posterize_as(ORIGINAL, "PosterizeIncreasing"),
    "v0": _V0,
    "v0r": _posterize_as(_V0, "PosterizeIncreasing"),
    "3a": ((("Solarize", 1.0, 5),), (("Desaturate", 1.0, 10),), (("GaussianBlurRand", 1.0, 10),)),  # DeiT III
}
SLOT_DRAWS = 5  # per operation slot: applies, noise, sign, filter, radius
MAX_SLOTS = max(len(sub) for policy in POLICIES.values() for sub in policy)


def draw_policy(params: Any, u: Any) -> tuple[TimmOperation, ...]:
    """The applied operations of one sub-policy from ``1 + 5 * MAX_SLOTS`` uniforms (the module docstring)."""
    policy = POLICIES[params["policy"]]
    chosen = policy[min(int(u[0] * len(policy)), len(policy) - 1)]  # random.choice: uniform
    found = []
    for slot, (name, probability, magnitude) in enumerate(chosen):
        v = u[1 + SLOT_DRAWS * slot:1 + SLOT_DRAWS * (slot + 1)]
        if probability < 1.0 and v[0] > probability:  # timm: self.prob < 1.0 and random.random() > self.prob
            continue
        found.append(timm_operation(name, magnitude, params["magnitude_std"], v[1:],
                                    interpolation=params["interpolation"]))
    return tuple(found)


def finite_std_checker(value: Any) -> tuple[Any, str | None]:
    if is_number(value) and value >= 0:
        return float(value), None
    return value, f"expected a number >= 0, found {type_name(value)} {value!r}"


# The filter of shear, translate and rotate: timm's hparams' interpolation (timm's AugMix shares it).
TIMM_INTERPOLATION_PARAM = Param("interpolation", "random", choice_checker(TIMM_INTERPOLATIONS),
                                 "resampling of shear, translate and rotate: random (bilinear or bicubic drawn per "
                                 "operation, timm's default) | nearest | bilinear | bicubic (timm's "
                                 "--train-interpolation when fixed) (default random)")
# The colour shear, translate and rotate move in (timm's AugMix shares it).
TIMM_FILL_PARAM = Param("fill", None, fill_checker,
                        "colour moved in by shear, translate and rotate, in 0-255 levels: a number or [R, G, B] "
                        "(timm's img_mean, round(255 * mean)) (default null: timm's [128, 128, 128])")


class TimmAutoAugment(Op, Batching, Display):
    """timm's AutoAugment; see the module docstring."""
    draws = 1 + SLOT_DRAWS * MAX_SLOTS
    discontinuous = any_discontinuous(name for policy in POLICIES.values() for sub in policy for name, _, _ in sub)

    def sample(self, params, u, height, width) -> tuple:
        return (TimmDraw(draw_policy(params, u), fill_colour(params["fill"])),)

    def kernel_on_host(self, params) -> bool:
        return True

    def torchvision_kernel(self, image, concrete, params):
        return apply_timm(image, concrete[0])

    def torchvision_transforms(self, params):
        raise NotImplementedError("timm_auto_augment is timm's transform, not a transforms.v2 one")

    def torchvision_stage(self, params) -> str:
        return (f"timm's AutoAugment policy {params['policy']} with PIL (magnitude std "
                f"{params['magnitude_std']}, {params['interpolation']} resampling, fill {fill_colour(params['fill'])})")


TIMM_AUTO_AUGMENT = TimmAutoAugment(
    "timm_auto_augment", "pixel", (
        Param("policy", "v0", choice_checker(tuple(POLICIES)),
              "timm's policy: original | originalr | v0 | v0r | 3a (the 'r' ones posterize with "
              "PosterizeIncreasing; 3a: DeiT III's solarize, desaturate or blur) (default v0)"),
        Param("magnitude_std", 0.0, finite_std_checker,
              "standard deviation of the normal noise on each operation's magnitude, timm's mstd (default 0)"),
        TIMM_INTERPOLATION_PARAM, TIMM_FILL_PARAM),
    "Apply one of timm's AutoAugment sub-policies with its PIL operations, each with its probability and "
    "magnitude of 10 (timm's --aa original, v0, originalr, v0r, 3a). On DALI backends it runs in torch "
    "right after the DALI graph.",
    primary="policy")

REGISTERED = (TIMM_AUTO_AUGMENT,)
