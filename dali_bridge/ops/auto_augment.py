"""Augmentation policies: trivial_augment_wide, rand_augment, auto_augment and augmix (torchvision's
``TrivialAugmentWide``, ``RandAugment``, ``AutoAugment`` and ``AugMix``), with torchvision's operation
sets, magnitude bins and signs.

The bridge draws every choice: which operation (``torch.randint(len(ops), ())``: the uniform scaled
and floored), which magnitude bin, the sign (negative when a uniform is <= 0.5, as
``torch.rand(()) <= 0.5``), for auto_augment which sub-policy and whether each of its two
operations applies (``torch.rand(()) <= probability``), for augmix each chain's depth and the
mixing weights (Dirichlet samples: Gamma variates by the inverse CDF of one uniform each). The
magnitudes are torchvision's own tables (``torch.linspace`` in float32, read once per table and
cached), evaluated at the image size the step receives, so a concrete operation is exactly what
torchvision's ``forward`` would apply.

On DALI backends these ops run in torch right after the DALI graph (they are not a ``DaliOp``), as
torchvision's kernels: most of their operations have no DALI operator with torchvision's arithmetic
— equalize, autocontrast, posterize and sharpness have none; brightness/color/contrast are uint8
blends (contrast around the grey level's mean) truncated after each step; shear, translate and
rotate are torchvision's ``affine``/``rotate`` (its inverse matrix and ``grid_sample`` grid, its fill
rule), which ``fn.warp_affine`` is not shown to reproduce pixel for pixel — and the operation itself
changes per sample, which one DALI graph could only follow by running every operation on every image.

This module holds the ops; the tables are in :mod:`.policy_tables`, the kernels in :mod:`.policy_kernels`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..util.checks import type_name, bool_checker, choice_checker, int_checker, is_int, is_number, optional
from .base import Op, Param, Step
# The tables and the kernels, importable from here as before the split (tests and the timm ops use them).
from .policy_kernels import affine_operations, apply_operation, apply_operations  # noqa: F401
from .facets import Batching, Display, SpecRules
from .policy_tables import (IMAGENET_POLICY, ORIGINAL, WIDE, POLICIES, SPACES, PolicyOperation,
    any_discontinuous, pick, signed_operation)
from .timm_rand_augment import TIMM_INTERPOLATIONS, TIMM_RAND_AUGMENT


def kernel_fill(fill: Any) -> Any:
    """A draw's fill colour as torchvision's kernels take it: an RGB tuple as a list (None or a number as is)."""
    return list(fill) if isinstance(fill, tuple) else fill


def fill_checker(value: Any) -> tuple[Any, str | None]:
    """torchvision's ``fill``: null (zeros), one level or one per channel (R, G, B), in 0-255 levels."""
    if value is None or is_number(value):
        return value, None
    if isinstance(value, list) and len(value) == 3 and all(is_number(v) for v in value):
        return [float(v) for v in value], None
    return value, f"expected null, a number or 3 numbers (R, G, B) in 0-255 levels, found {type_name(value)} {value!r}"


@dataclass(frozen=True)
class PolicyDraw:
    """The drawn operations, applied in order (none: the image is kept), with the step's interpolation
    and fill (a tuple when per channel): all the kernel needs."""
    operations: tuple[PolicyOperation, ...]
    interpolation: str
    fill: Any


class Policy(Op, SpecRules, Batching, Display):
    """A policy op; subclasses draw the operations."""

    def draw_operations(self, params, u, height, width) -> tuple[PolicyOperation, ...]:
        raise NotImplementedError

    def sample(self, params, u, height, width) -> tuple:
        fill = tuple(params["fill"]) if isinstance(params["fill"], list) else params["fill"]
        return (PolicyDraw(self.draw_operations(params, u, height, width), params["interpolation"], fill),)

    def torchvision_kernel(self, image, concrete, params):
        draw = concrete[0]
        fill = kernel_fill(draw.fill)
        for operation in draw.operations:
            image = apply_operation(image, operation, draw.interpolation, fill)
        return image

    def batch_kernel(self, images, concrete, params):
        from .batched import stacked

        batch = stacked(images)
        if batch is None:
            return None
        draws = [c[0] for c in concrete]
        fill = kernel_fill(draws[0].fill)  # the step's: one per plan
        for layer in range(max((len(draw.operations) for draw in draws), default=0)):
            layer_operations = [draw.operations[layer] if layer < len(draw.operations) else None for draw in draws]
            batch = apply_operations(batch, layer_operations, draws[0].interpolation, fill)
        return batch

    def torchvision_stage(self, params) -> str:
        return (f"torchvision's operation kernels as {self.transform} draws them "
                f"({params['interpolation']}, fill {params['fill']})")


class TrivialAugmentWide(Policy):
    draws = 3  # the operation, its magnitude bin, its sign
    transform = "TrivialAugmentWide"
    discontinuous = any_discontinuous(WIDE)

    def draw_operations(self, params, u, height, width):
        names = tuple(WIDE)
        bins = params["num_magnitude_bins"]
        name = names[pick(u[0], len(names))]
        return (signed_operation("wide", name, bins, pick(u[1], bins), u[2], height, width),)

    def torchvision_transforms(self, params):
        from torchvision.transforms import InterpolationMode, v2

        return [v2.TrivialAugmentWide(num_magnitude_bins=params["num_magnitude_bins"],
                                      interpolation=InterpolationMode(params["interpolation"]),
                                      fill=params["fill"])]


class RandAugment(Policy):
    """torchvision's RandAugment; with ``variant: timm`` it lowers to timm's
    (:class:`~dali_bridge.ops.timm_rand_augment.TimmRandAugment`)."""
    draws = 2  # per operation: which one, its sign (the magnitude bin is the parameter)
    transform = "RandAugment"
    discontinuous = any_discontinuous(ORIGINAL)

    def lower(self, params: dict[str, Any], op_index: int) -> list[Step]:
        timm = params["variant"] == "timm"
        interpolation = params["interpolation"] or ("random" if timm else "nearest")  # null: the variant's default
        return [Step(TIMM_RAND_AUGMENT if timm else self, {**params, "interpolation": interpolation}, op_index)]

    def draw_count(self, params) -> int:
        return self.draws * params["num_ops"]

    def extra_check(self, params: dict) -> list[tuple[str, str]]:
        if params.get("variant") == "timm":
            return []
        problems = []
        if params.get("interpolation") not in (None, "nearest", "bilinear"):
            problems.append(("interpolation", f"expected one of nearest, bilinear, found {params['interpolation']!r} "
                                              f"(torchvision's RandAugment; bicubic and random are timm's: add "
                                              f"'variant: timm')"))
        problems += [(name, f"only timm's variant has {name}: add 'variant: timm', or leave {name} out")
                    for name, default in (("magnitude_std", 0.0), ("increasing", False))
                    if params.get(name, default) != default]
        if is_int(params.get("magnitude")) and is_int(params.get("num_magnitude_bins")) \
                and params["magnitude"] >= params["num_magnitude_bins"]:
            problems.append(("magnitude", f"expected a bin below num_magnitude_bins ({params['num_magnitude_bins']}), "
                                          f"found {params['magnitude']}"))
        return problems

    def draw_operations(self, params, u, height, width):
        names = tuple(ORIGINAL)
        return tuple(signed_operation("original", names[pick(u[2 * n], len(names))], params["num_magnitude_bins"],
                                      params["magnitude"], u[2 * n + 1], height, width)
                     for n in range(params["num_ops"]))

    def torchvision_transforms(self, params):
        from torchvision.transforms import InterpolationMode, v2

        return [v2.RandAugment(num_ops=params["num_ops"], magnitude=params["magnitude"],
                               num_magnitude_bins=params["num_magnitude_bins"],
                               interpolation=InterpolationMode(params["interpolation"]), fill=params["fill"])]

class AutoAugment(Policy):
    draws = 5  # the sub-policy, then per operation of it: whether it applies, its sign
    transform = "AutoAugment"
    discontinuous = any_discontinuous(name for sub in IMAGENET_POLICY for name, _, _ in sub)
    key_hints = {"variant": "timm's AutoAugment policies (original, v0, 3a, ...) are the op timm_auto_augment"}

    def draw_operations(self, params, u, height, width):
        policy = POLICIES[params["policy"]]
        chosen = policy[pick(u[0], len(policy))]
        found = []
        for n, (name, probability, index) in enumerate(chosen):
            if u[1 + 2 * n] <= probability:  # torchvision skips when not torch.rand(()) <= probability
                found.append(signed_operation("auto", name, 10, index or 0, u[2 + 2 * n], height, width))
        return tuple(found)

    def torchvision_transforms(self, params):
        from torchvision.transforms import InterpolationMode, v2

        return [v2.AutoAugment(policy=v2.AutoAugmentPolicy(params["policy"]),
                               interpolation=InterpolationMode(params["interpolation"]), fill=params["fill"])]


def gamma_quantiles(alpha: float, u: Any) -> Any:
    """Gamma(alpha, 1) samples from uniforms by the inverse CDF (normalised, a Dirichlet sample, as
    ``torch._sample_dirichlet``): for alpha 1 (AugMix's default) the exponential's ``-log(1 - u)``;
    else bisection on log x of torch's regularised incomplete gamma in float64 (64 halvings of
    [-745, log(alpha + 60 sqrt(alpha) + 60)] reach float64's relative resolution)."""
    import numpy as np
    import torch

    from ..util.portable_math import exp, log

    # exp and log are the portable ones: numpy's and torch's are SIMD kernels picked by the CPU's
    # features, and a last bit there is another draw on another machine (a resumed job included).
    # For alpha 1 that makes the draw the same everywhere; other alphas still go through torch's
    # gammainc, whose kernel is compiled per CPU capability.
    if alpha == 1.0:
        return -log(1.0 - np.asarray(u, dtype=np.float64))  # exact: the uniforms are multiples of 2**-53
    target = torch.as_tensor(np.asarray(u, dtype=np.float64))
    shape = torch.full_like(target, float(alpha))
    low = torch.full_like(target, -745.0)
    high = torch.full_like(target, math.log(alpha + 60.0 * math.sqrt(alpha) + 60.0))
    for _ in range(64):
        middle = (low + high) / 2
        below = torch.special.gammainc(shape, torch.from_numpy(exp(middle.numpy()))) < target
        low, high = torch.where(below, middle, low), torch.where(below, high, middle)
    return exp(((low + high) / 2).numpy())


@dataclass(frozen=True)
class AugMixDraw:
    """AugMix's mixture: the original's weight, each chain's weight (float32, as torchvision's Dirichlet
    samples and their product are), the chains' operations, interpolation and fill."""
    original_weight: float
    chain_weights: tuple[float, ...]
    chains: tuple[tuple[PolicyOperation, ...], ...]
    interpolation: str
    fill: Any


class AugMix(Op, SpecRules, Batching, Display):
    """torchvision's AugMix: ``mixture_width`` chains of 1-3 operations mixed with the original by
    Dirichlet weights, in float32, truncated to uint8."""
    draws = 4  # per chain operation (which, bin, sign) plus one per chain; see draw_count
    transform = "AugMix"
    discontinuous = any_discontinuous(SPACES["augmix_partial"])  # all_ops adds only continuous ones
    key_hints = {"variant": "timm's AugMix (its augmix-m*-w*-d* policy) is the op timm_augmix"}

    @staticmethod
    def _depth(params) -> int:
        return params["chain_depth"] if params["chain_depth"] > 0 else 3

    def draw_count(self, params) -> int:
        # 2 gammas for the original's Beta weight, one per chain for the chains' Dirichlet weights, then per
        # chain its depth and (operation, bin, sign) for each operation it may apply.
        width = params["mixture_width"]
        return 2 + width + width * (1 + 3 * self._depth(params))

    def sample(self, params, u, height, width) -> tuple:
        import numpy as np

        count, space = params["mixture_width"], "augmix" if params["all_ops"] else "augmix_partial"
        names = tuple(SPACES[space])
        gammas = gamma_quantiles(params["alpha"], u[:2 + count])
        beta = np.float32(gammas[:2] / gammas[:2].sum())
        weights = np.float32(gammas[2:] / gammas[2:].sum()) * beta[1]  # float32 product, as torchvision's
        chains, stride = [], 1 + 3 * self._depth(params)
        for chain in range(count):
            v = u[2 + count + chain * stride:2 + count + (chain + 1) * stride]
            depth = params["chain_depth"] if params["chain_depth"] > 0 else 1 + pick(v[0], 3)  # randint(1, 4)
            chains.append(tuple(signed_operation(space, names[pick(v[1 + 3 * k], len(names))], 10,
                                                 pick(v[2 + 3 * k], params["severity"]), v[3 + 3 * k], height, width)
                                for k in range(depth)))
        fill = tuple(params["fill"]) if isinstance(params["fill"], list) else params["fill"]
        return (AugMixDraw(float(beta[0]), tuple(float(w) for w in weights), tuple(chains), params["interpolation"],
                           fill),)

    def torchvision_kernel(self, image, concrete, params):
        import torch

        draw = concrete[0]
        fill = kernel_fill(draw.fill)
        # Python scalars: torch multiplies a uint8 image by one in float32, as by a float32 weight tensor,
        # and a GPU tail copies nothing from the host per sample for it.
        mix = image.to(torch.float32) * draw.original_weight
        for weight, chain in zip(draw.chain_weights, draw.chains):
            augmented = image
            for operation in chain:
                augmented = apply_operation(augmented, operation, draw.interpolation, fill)
            mix.add_(augmented.to(torch.float32) * weight)
        return mix.to(image.dtype)  # truncation, as torchvision's

    def batch_kernel(self, images, concrete, params):
        import torch

        from .batched import per_sample, stacked

        batch = stacked(images)
        if batch is None:
            return None
        draws = [c[0] for c in concrete]
        fill = kernel_fill(draws[0].fill)  # the step's: one per plan
        # Per-sample weights as (N, 1, 1, 1) float32: the same products as by each sample's float32 scalar.
        mix = batch.to(torch.float32) * per_sample([draw.original_weight for draw in draws], batch)
        for chain in range(len(draws[0].chains)):
            augmented = batch
            for depth in range(max(len(draw.chains[chain]) for draw in draws)):
                operations = [draw.chains[chain][depth] if depth < len(draw.chains[chain]) else None
                              for draw in draws]
                augmented = apply_operations(augmented, operations, draws[0].interpolation, fill)
            mix.add_(augmented.to(torch.float32) * per_sample([draw.chain_weights[chain] for draw in draws], batch))
        return mix.to(batch.dtype)

    def torchvision_transforms(self, params):
        from torchvision.transforms import InterpolationMode, v2

        return [v2.AugMix(severity=params["severity"], mixture_width=params["mixture_width"],
                          chain_depth=params["chain_depth"], alpha=params["alpha"], all_ops=params["all_ops"],
                          interpolation=InterpolationMode(params["interpolation"]), fill=params["fill"])]

    def torchvision_stage(self, params) -> str:
        return (f"AugMix: {params['mixture_width']} chains of torchvision's operation kernels, mixed in float32 "
                f"({params['interpolation']}, fill {params['fill']})")


def positive_number_checker(value: Any) -> tuple[Any, str | None]:
    if is_number(value) and value > 0:
        return float(value), None
    return value, f"expected a number > 0, found {type_name(value)} {value!r}"


def magnitude_std_checker(value: Any) -> tuple[Any, str | None]:
    if is_number(value) and value >= 0:
        return float(value), None
    return value, f"expected a number >= 0 (.inf: uniform), found {type_name(value)} {value!r}"


# Upper bounds of the counts (docs/errors.md lists them): far above any recipe, low enough that
# no value costs more than a few times the largest recipe's work per image.
# torchvision's and timm's RandAugment recipes apply 2 or 3 operations; each is one kernel per image.
MAX_NUM_OPS = 16
# torchvision's default is 31; a table of magnitudes is built per bin, and beyond a few hundred
# bins neighbouring magnitudes give the same uint8 pixels.
MAX_MAGNITUDE_BINS = 1024
# AugMix holds one float32 copy of the image per chain and draws uniforms per chain and depth;
# torchvision's default is 3 chains of 1-3 operations.
MAX_CHAINS = 16
MAX_CHAIN_DEPTH = 16
SEVERITY_SCALE = 10  # torchvision's AugMix: severity counts magnitude bins out of 10

severity_checker = int_checker(1, SEVERITY_SCALE, "a severity", "AugMix draws from 10 magnitude bins")
_chain_depth = int_checker(1, MAX_CHAIN_DEPTH, "a chain depth", "AugMix recipes use 1 to 3")


def chain_depth_checker(value: Any) -> tuple[Any, str | None]:
    if is_int(value) and value <= 0:
        return value, None  # 1 to 3 at random, as torchvision's -1
    if is_int(value):
        return _chain_depth(value)
    return value, f"expected an integer (> 0: that depth; <= 0: 1 to 3 at random), found {type_name(value)} {value!r}"


_policy_choice = choice_checker(tuple(POLICIES))
TIMM_POLICY_NAMES = ("original", "originalr", "v0", "v0r", "3a")  # timm's, the timm_auto_augment op's


def policy_checker(value: Any) -> tuple[Any, str | None]:
    """torchvision's policy; timm's names are another op's, and the message says which."""
    value, problem = _policy_choice(value)
    if problem and value in TIMM_POLICY_NAMES:
        problem += f" ('{value}' is a timm policy: write it as timm_auto_augment: {{policy: {value}}})"
    return value, problem


_INTERPOLATION = Param("interpolation", "nearest", choice_checker(("nearest", "bilinear")),
                       "resampling of shear, translate and rotate: nearest | bilinear (default nearest)")
_FILL = Param("fill", None, fill_checker,
              "value of pixels moved in from outside by shear, translate and rotate, in 0-255 levels: a number or "
              "[R, G, B] (default null: zeros)")
_BINS = Param("num_magnitude_bins", 31, int_checker(2, MAX_MAGNITUDE_BINS, "a number of bins",
                                                    "neighbouring bins give the same pixels long before"),
              f"number of magnitude bins, at most {MAX_MAGNITUDE_BINS} (default 31)")

TRIVIAL_AUGMENT_WIDE = TrivialAugmentWide(
    "trivial_augment_wide", "pixel", (_BINS, _INTERPOLATION, _FILL),
    "Apply one of 14 operations at a random magnitude bin and sign (torchvision's TrivialAugmentWide). "
    "On DALI backends it runs in torch right after the DALI graph.")

RAND_AUGMENT = RandAugment(
    "rand_augment", "pixel", (
        Param("num_ops", 2, int_checker(0, MAX_NUM_OPS, "a number of operations", "recipes apply 2 or 3"),
              f"operations applied in turn, at most {MAX_NUM_OPS} (default 2)"),
        Param("magnitude", 9, int_checker(0, MAX_MAGNITUDE_BINS - 1, "a magnitude bin",
                                          f"num_magnitude_bins is at most {MAX_MAGNITUDE_BINS}"),
              "the magnitude bin of every operation, below num_magnitude_bins (default 9); with variant timm, "
              "timm's magnitude from 0 to 10"),
        _BINS,
        Param("interpolation", None, optional(choice_checker(TIMM_INTERPOLATIONS)),
              "resampling of shear, translate and rotate: nearest | bilinear; variant timm also bicubic | random "
              "(bilinear or bicubic drawn per operation, timm's default) (default null: nearest, variant timm random)"),
        _FILL,
        Param("variant", "torchvision", choice_checker(("torchvision", "timm")),
              "torchvision's RandAugment, or timm's: its operations with PIL, each layer applied with chance 0.5, "
              "magnitude 0 to 10, fill null meaning [128, 128, 128] (num_magnitude_bins unused) "
              "(default torchvision)"),
        Param("magnitude_std", 0.0, magnitude_std_checker,
              "variant timm: standard deviation of the magnitude's normal noise; .inf draws it uniformly "
              "from 0 to the magnitude (default 0)", infinity=True),
        Param("increasing", False, bool_checker,
              "variant timm: the operations whose strength increases with the magnitude (default false)")),
    "Apply num_ops operations drawn from 14, each at the given magnitude bin with a random sign "
    "(torchvision's RandAugment), or timm's variant (timm's rand-m9-mstd0.5-inc1: variant timm, magnitude 9, "
    "magnitude_std 0.5, increasing true). On DALI backends it runs in torch right after the DALI graph.",
    primary="num_ops")

AUTO_AUGMENT = AutoAugment(
    "auto_augment", "pixel", (
        Param("policy", "imagenet", policy_checker, "the learned policy: imagenet (default)"),
        _INTERPOLATION, _FILL),
    "Apply one of the policy's 25 sub-policies of two operations, each with its probability and "
    "magnitude (torchvision's AutoAugment). On DALI backends it runs in torch right after the DALI graph.",
    primary="policy")

AUGMIX = AugMix(
    "augmix", "pixel", (
        Param("severity", 3, severity_checker, "magnitude bins drawn from, 1 to 10 of 10 (default 3)"),
        Param("mixture_width", 3, int_checker(1, MAX_CHAINS, "a number of chains",
                                              "each chain holds a float32 copy of the image"),
              f"augmentation chains mixed, at most {MAX_CHAINS} (default 3)"),
        Param("chain_depth", -1, chain_depth_checker,
              f"operations per chain, at most {MAX_CHAIN_DEPTH}; <= 0 draws 1 to 3 per chain (default -1)"),
        Param("alpha", 1.0, positive_number_checker, "Dirichlet and Beta concentration of the weights (default 1.0)"),
        Param("all_ops", True, bool_checker, "include brightness, color, contrast and sharpness (default true)"),
        Param("interpolation", "bilinear", choice_checker(("nearest", "bilinear")),
              "resampling of shear, translate and rotate: nearest | bilinear (default bilinear)"),
        _FILL),
    "Mix the image with chains of random operations by random weights (torchvision's AugMix). On DALI "
    "backends it runs in torch right after the DALI graph.",
    primary="severity")

REGISTERED = (TRIVIAL_AUGMENT_WIDE, RAND_AUGMENT, AUTO_AUGMENT, AUGMIX)
