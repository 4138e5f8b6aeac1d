"""timm_augmix: timm's AugMix (``--aa augmix-m5-w4-d2``, with ``-mstd``, ``-a`` and ``-b``): its 13
operations (``_AUGMIX_TRANSFORMS``) with its PIL kernels (:mod:`dali_bridge.ops.timm_rand_augment`),
each always applied at a magnitude drawn uniformly from 0 to m (timm's default ``magnitude_std``
infinite; a given mstd draws a normal instead), translations of 0.3 of the size (what timm's
``create_transform`` sets for AugMix), so ``augmix-m5-w4-d2`` is ``{timm_augmix: {magnitude: 5,
mixture_width: 4, chain_depth: 2}}``.

timm's ``AugMixAugment`` draws the chains' weights (``np.random.dirichlet([alpha] * width)``) and the
blend (``np.random.beta(alpha, alpha)``), both in float32, then per chain its depth
(``np.random.randint(1, 4)`` unless fixed) and its operations (``np.random.choice`` with
replacement), each with the noise, sign and filter of ``AugmentOp`` (the filter drawn for
``interpolation: random``, timm's default, else the one given). The bridge draws the same:
the Dirichlet and Beta samples from Gamma variates (``gamma_quantiles``, shared with torchvision's
AugMix), then per chain 1 + 4 per operation it may apply (which, noise, sign, filter).

The mix is timm's: the chains accumulated in float32 (weight times image), clipped to [0, 255],
truncated to uint8 and blended with the original by PIL's ``Image.blend`` at the Beta weight; or
``blended`` (timm's ``-b1``): each chain blended into the running image by ``Image.blend`` at
weights timm's ``_calc_blended_weights`` derives in float32.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .auto_augment import (MAX_CHAINS, chain_depth_checker, gamma_quantiles, magnitude_std_checker,
    positive_number_checker)
from .policy_tables import pick
from ..util.checks import bool_checker, int_checker
from .base import Op, Param
from .facets import Batching, Display, SpecRules
from .policy_tables import any_discontinuous
from .timm_auto_augment import TIMM_FILL_PARAM, TIMM_INTERPOLATION_PARAM
from .timm_rand_augment import TimmOperation, apply_operations, fill_colour, from_picture, timm_operation, to_picture

OPERATIONS = ("AutoContrast", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
              "SharpnessIncreasing", "Equalize", "Rotate", "PosterizeIncreasing", "SolarizeIncreasing",
              "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")  # timm's _AUGMIX_TRANSFORMS, in its order
TRANSLATE_PCT = 0.3  # timm's create_transform: aa_params['translate_pct'] for AugMix
OPERATION_DRAWS = 4  # which, noise, sign, filter
RANDOM_DEPTHS = 3    # np.random.randint(1, 4)


@dataclass(frozen=True)
class TimmMixDraw:
    """One sample's AugMix: the chains' float32 weights, the Beta blend weight, the chains, the fill
    colour and whether each chain is blended in turn (timm's ``blended``)."""
    chain_weights: tuple[float, ...]
    blend: float
    chains: tuple[tuple[TimmOperation, ...], ...]
    fill: tuple[int, int, int]
    blended: bool


def _depth(params: Any) -> int:
    return params["chain_depth"] if params["chain_depth"] > 0 else RANDOM_DEPTHS


def draw_mix(params: Any, u: Any) -> TimmMixDraw:
    """The weights and chains from ``draw_count`` uniforms (the module docstring)."""
    import numpy as np

    width = params["mixture_width"]
    gammas = gamma_quantiles(params["alpha"], u[:width + 2])
    weights = np.float32(gammas[:width] / gammas[:width].sum())  # np.float32(np.random.dirichlet(...))
    blend = np.float32(gammas[width] / (gammas[width] + gammas[width + 1]))  # np.random.beta(alpha, alpha)
    stride, chains = 1 + OPERATION_DRAWS * _depth(params), []
    for chain in range(width):
        v = u[width + 2 + chain * stride:width + 2 + (chain + 1) * stride]
        depth = params["chain_depth"] if params["chain_depth"] > 0 else 1 + pick(v[0], RANDOM_DEPTHS)
        chains.append(tuple(
            timm_operation(OPERATIONS[pick(v[1 + OPERATION_DRAWS * k], len(OPERATIONS))], params["magnitude"],
                           params["magnitude_std"], v[2 + OPERATION_DRAWS * k:1 + OPERATION_DRAWS * (k + 1)],
                           TRANSLATE_PCT, interpolation=params["interpolation"])
            for k in range(depth)))
    return TimmMixDraw(tuple(float(w) for w in weights), float(blend), tuple(chains), fill_colour(params["fill"]),
                       bool(params["blended"]))


def blended_weights(weights: Any, blend: float) -> Any:
    """timm's ``_calc_blended_weights``: each chain's ``Image.blend`` weight, in float32 as its arithmetic."""
    import numpy as np

    ws = np.asarray(weights, dtype=np.float32) * np.float32(blend)
    cump, found = 1.0, []
    for w in ws[::-1]:
        alpha = w / cump
        cump *= 1 - alpha
        found.append(alpha)
    return np.array(found[::-1], dtype=np.float32)


def mix(image: Any, draw: TimmMixDraw) -> Any:
    """timm's AugMix mix of a CHW uint8 tensor in host memory (the module docstring)."""
    import numpy as np
    from PIL import Image

    picture = to_picture(image)
    if draw.blended:
        mixed = picture
        for weight, chain in zip(blended_weights(draw.chain_weights, draw.blend), draw.chains):
            mixed = Image.blend(mixed, apply_operations(picture, chain, draw.fill), float(weight))
        return from_picture(mixed)
    total = np.zeros((picture.size[1], picture.size[0], 3), dtype=np.float32)
    for weight, chain in zip(draw.chain_weights, draw.chains):
        total += np.float32(weight) * np.asarray(apply_operations(picture, chain, draw.fill), dtype=np.float32)
    np.clip(total, 0, 255.0, out=total)
    return from_picture(Image.blend(picture, Image.fromarray(total.astype(np.uint8)), draw.blend))


class TimmAugMix(Op, SpecRules, Batching, Display):
    """timm's AugMix; see the module docstring."""
    draws = 2 + 1 + OPERATION_DRAWS * RANDOM_DEPTHS  # per chain; see draw_count
    discontinuous = any_discontinuous(OPERATIONS)

    def draw_count(self, params) -> int:
        # The Dirichlet's gammas (one per chain), the Beta's two, then per chain its depth and the
        # (which, noise, sign, filter) of each operation it may apply.
        width = params["mixture_width"]
        return width + 2 + width * (1 + OPERATION_DRAWS * _depth(params))

    def sample(self, params, u, height, width) -> tuple:
        return (draw_mix(params, u),)

    def kernel_on_host(self, params) -> bool:
        return True

    def torchvision_kernel(self, image, concrete, params):
        return mix(image, concrete[0])

    def torchvision_transforms(self, params):
        raise NotImplementedError("timm_augmix is timm's transform, not a transforms.v2 one")

    def torchvision_stage(self, params) -> str:
        return (f"timm's AugMix: {params['mixture_width']} chains of its PIL operations at magnitude up to "
                f"{params['magnitude']}, {'blended in turn' if params['blended'] else 'mixed in float32'} "
                f"({params['interpolation']} resampling, fill {fill_colour(params['fill'])})")


TIMM_AUGMIX = TimmAugMix(
    "timm_augmix", "pixel", (
        Param("magnitude", 3, int_checker(0, 10, "a magnitude", "timm's scale ends at 10"),
              "timm's m: the magnitude each operation's is drawn below, 0 to 10 (default 3)"),
        Param("mixture_width", 3, int_checker(1, MAX_CHAINS, "a number of chains",
                                              "each chain holds a float32 copy of the image"),
              f"augmentation chains mixed, timm's w, at most {MAX_CHAINS} (default 3)"),
        Param("chain_depth", -1, chain_depth_checker,
              "operations per chain, timm's d; <= 0 draws 1 to 3 per chain (default -1)"),
        Param("alpha", 1.0, positive_number_checker,
              "Dirichlet and Beta concentration of the weights, timm's a (default 1.0)"),
        Param("magnitude_std", float("inf"), magnitude_std_checker,
              "timm's mstd: standard deviation of the normal noise on the magnitude; .inf (timm's default for "
              "AugMix) draws it uniformly from 0 to the magnitude (default .inf)", infinity=True),
        Param("blended", False, bool_checker,
              "timm's b: blend each chain into the image in turn instead of mixing them (default false)"),
        TIMM_INTERPOLATION_PARAM, TIMM_FILL_PARAM),
    "Mix the image with chains of timm's operations by random weights (timm's --aa augmix-m3-w3). On DALI "
    "backends it runs in torch right after the DALI graph.",
    primary="magnitude")

REGISTERED = (TIMM_AUGMIX,)
