"""torchvision's uint8 kernels on a batch, with a parameter per sample: what the ops' batch kernels share.

A DALI backend's torch tail (:mod:`dali_bridge.backends.dali.tail`) applies each step to the whole
batch at once (``Op.batch_kernel``): an operation runs once on the group of samples that drew it,
and a parameter that differs from sample to sample (a colour factor, posterize bits, a solarize
threshold) is an (N, 1, 1, 1) tensor where torchvision's arithmetic allows, so the number of
kernel launches follows the operations drawn, not the batch size. Each function here reproduces
the per-sample kernel's arithmetic step by step, rounding included, so its pixels are torchvision's
(tests/backends/dali/test_batched_tail.py compares them over every operation, bin and sign).

Per-sample values are built on the host and moved to the batch's device in one copy per call:
nothing per sample crosses between host and device.
"""
from __future__ import annotations

from typing import Callable, Hashable, Sequence

import torch

_BOUND = 255.0  # uint8's largest level: torchvision's _max_value(torch.uint8)


def stacked(images: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The images as one (N, C, H, W) tensor (no copy when they are one already); None when their
    sizes differ (a step before the one that sets the output size)."""
    if isinstance(images, torch.Tensor):
        return images
    if len({tuple(image.shape) for image in images}) != 1:
        return None
    return torch.stack(list(images))


def per_sample(values: Sequence[float], like: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """One value per sample as an (N, 1, 1, 1) tensor of ``dtype`` on ``like``'s device. A Python float
    becomes float32 as torch rounds a scalar operand of a float32 kernel."""
    values = torch.tensor(list(values), dtype=dtype).view(-1, 1, 1, 1)
    return values if like.device.type == "cpu" else values.to(like.device, non_blocking=True)


def by_group(images: torch.Tensor, groups: dict[Hashable, list[int]],
             kernel: Callable[[Hashable, torch.Tensor, list[int]], torch.Tensor]) -> torch.Tensor:
    """``kernel(key, the group's images, its rows)`` on each group of rows, written back in place of
    those rows (rows in no group keep their pixels). One call per group, whatever its size."""
    groups = {key: rows for key, rows in groups.items() if rows}
    if not groups:
        return images
    if len(groups) == 1 and len(next(iter(groups.values()))) == len(images):  # every sample: no gather
        key, rows = next(iter(groups.items()))
        return kernel(key, images, rows)
    result = images.clone()
    for key, rows in groups.items():
        index = torch.tensor(rows, dtype=torch.int64)
        index = index if images.device.type == "cpu" else index.to(images.device, non_blocking=True)
        result.index_copy_(0, index, kernel(key, images.index_select(0, index), rows))
    return result


# What each device's add kernel does with ``base.add_(other, alpha=a)``, probed once per device
# and process (:func:`add_rounding`).
_ADD_ROUNDING: dict[torch.device, str] = {}


def add_rounding(device: torch.device | str) -> str:
    """How PyTorch's kernel on ``device`` rounds ``base.add_(other, alpha=a)``: ``"fused"`` (one
    rounding, a fused multiply-add), ``"unfused"`` (the product rounded, then the sum) or ``"mixed"``.
    Asked of the device itself, once: on the CPU the vectorised kernel calls ``vec::fmadd`` (fused
    on AVX2 and AVX-512, not on CPUs without FMA, ``ATEN_CPU_CAPABILITY=default``) and the scalar
    remainder is ``self + alpha * other`` as the C++ compiler contracts it; on CUDA the kernel is
    ``self + alpha * other`` as nvcc contracts it (``--fmad``, on by default, but a build flag).
    The batch kernels must round as the per-sample ones do on the device they run on."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    found = _ADD_ROUNDING.get(device)
    if found is None:  # two threads may both probe: the same answer, stored twice
        found = _ADD_ROUNDING[device] = probe_add_rounding(device)
    return found


def probe_add_rounding(device: torch.device) -> str:
    """One small add on ``device`` where the fused and the unfused rounding differ, over more elements
    than a CPU's vector loop or a CUDA block's vectorised share takes at once (2**16 + 3), so the
    vectorised body and the remainder both answer; its two verdicts come back to the host in one
    read (on a GPU, the probe's one wait for the device)."""
    factor = 1.0 + 2.0 ** -12  # factor * factor = 1 + 2^-11 + 2^-24: the 2^-24 is lost unless fused
    count = 2 ** 16 + 3
    base = torch.full((count,), -(1.0 + 2.0 ** -11), device=device)
    result = base.add_(torch.full((count,), factor, device=device), alpha=factor)
    fused, unfused = torch.stack(((result == 2.0 ** -24).all(), (result == 0).all())).tolist()
    return "fused" if fused else "unfused" if unfused else "mixed"


def cpu_add_rounding() -> str:
    """:func:`add_rounding` of this host's CPU."""
    return add_rounding("cpu")


def fused_multiply_add(base: torch.Tensor, other: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """``base + alpha * other`` in float32 as PyTorch's kernel on ``base``'s device computes
    ``base.add_(other, alpha=a)`` with a scalar ``a``, here with ``alpha`` per sample, rounded as that
    device's kernel rounds (:func:`add_rounding`). Fused is one rounding: ``alpha * other`` is exact
    in float64 (two 24-bit significands), the sum is split into its float64 value and its error
    (Knuth's two-sum), and where the float64 value sits exactly on a float32 rounding midpoint the
    error picks the side — so the result is the exact sum correctly rounded, as the fused kernel's.
    Unfused rounds the product first, as that kernel does; mixed (rounding that differs between the
    kernel's parts) runs each sample through PyTorch's own kernel."""
    rounding = add_rounding(base.device)
    if rounding == "unfused":
        return base + alpha * other
    if rounding == "mixed":  # the alphas read back at once (one wait on a GPU), not one by one
        return torch.stack([b.clone().add_(o, alpha=a) for b, o, a in zip(base, other, alpha.flatten().tolist())])
    wide, product = base.double(), alpha.double() * other.double()
    total = wide + product
    part = total - wide
    error = (wide - (total - part)) + (product - part)
    rounded = total.float()
    if total.device.type == "cpu" and not bool(error.any()):  # the sum was exact: one rounding already
        return rounded  # (checked on the CPU only: on a GPU the check would wait for the device)
    back = rounded.double()
    infinity = torch.full_like(rounded, float("inf"))  # filled on the device: no host copy
    neighbour = torch.where(back > total, torch.nextafter(rounded, -infinity), torch.nextafter(rounded, infinity))
    midpoint = (back + neighbour.double()) / 2 == total  # exact: two float32 values summed in float64
    upper, lower = torch.maximum(rounded, neighbour), torch.minimum(rounded, neighbour)
    return torch.where(midpoint & (error > 0), upper, torch.where(midpoint & (error < 0), lower, rounded))


def blend(image1: torch.Tensor, image2: torch.Tensor, ratios: Sequence[float]) -> torch.Tensor:
    """torchvision's ``_blend`` (``image1.mul(r).add_(image2, alpha=1 - r)``, clamped, truncated to
    uint8) with ratio ``ratios[n]`` for sample n: ``1 - r`` in float64 as Python computes it."""
    ratio = per_sample(ratios, image1)
    alpha = per_sample([1.0 - float(r) for r in ratios], image1)
    output = fused_multiply_add(image1.mul(ratio), image2, alpha)
    return output.clamp_(0, _BOUND).to(image1.dtype)


def grey_levels(images: torch.Tensor) -> torch.Tensor:
    """torchvision's float32 grey level of uint8 images, floored (as its saturation and contrast use it)."""
    from torchvision.transforms.v2.functional._color import _rgb_to_grayscale_image

    return _rgb_to_grayscale_image(images, num_output_channels=1, preserve_dtype=False).floor_()


def adjust_brightness(images: torch.Tensor, factors: Sequence[float]) -> torch.Tensor:
    """``F.adjust_brightness`` with a factor per sample."""
    return images.mul(per_sample(factors, images)).clamp_(0, _BOUND).to(images.dtype)


def adjust_saturation(images: torch.Tensor, factors: Sequence[float]) -> torch.Tensor:
    """``F.adjust_saturation`` with a factor per sample."""
    return blend(images, grey_levels(images), factors)


def adjust_contrast(images: torch.Tensor, factors: Sequence[float]) -> torch.Tensor:
    """``F.adjust_contrast`` with a factor per sample: each image blended with its own mean grey level.
    The mean is torch's own reduction per image; its float32 sum of whole levels is exact (so
    independent of how the reduction is split) for images up to 65,793 pixels (255 x that < 2**24)."""
    mean = torch.mean(grey_levels(images), dim=(-3, -2, -1), keepdim=True)
    return blend(images, mean, factors)


def adjust_hue(images: torch.Tensor, factors: Sequence[float]) -> torch.Tensor:
    """``F.adjust_hue`` with a shift per sample (turns): the same HSV round trip in float32."""
    from torchvision.transforms.v2 import functional as F
    from torchvision.transforms.v2.functional._color import _hsv_to_rgb, _rgb_to_hsv

    hsv = _rgb_to_hsv(F.to_dtype(images, torch.float32, scale=True))
    hue, saturation, value = hsv.unbind(dim=-3)
    hue.add_(per_sample(factors, images).view(-1, 1, 1)).remainder_(1.0)
    return F.to_dtype(_hsv_to_rgb(torch.stack((hue, saturation, value), dim=-3)), images.dtype, scale=True)


def adjust_sharpness(images: torch.Tensor, factors: Sequence[float]) -> torch.Tensor:
    """``F.adjust_sharpness`` with a factor per sample: the same 3x3 blur (torch's conv2d on the batch),
    the inner pixels blended towards it by one fused multiply-add each."""
    from torch.nn.functional import conv2d

    channels, height, width = images.shape[-3:]
    if images.numel() == 0 or height <= 2 or width <= 2:
        return images
    a, b = 1.0 / 13.0, 5.0 / 13.0
    kernel = torch.tensor([[a, a, a], [a, b, a], [a, a, a]], dtype=torch.float32)
    kernel = (kernel if images.device.type == "cpu" else kernel.to(images.device, non_blocking=True))
    kernel = kernel.expand(channels, 1, 3, 3)
    output = images.to(dtype=torch.float32, copy=True)
    blurred = conv2d(output, kernel, groups=channels).round_()
    view = output[..., 1:-1, 1:-1]
    view.copy_(fused_multiply_add(view, blurred.sub_(view), per_sample([1.0 - float(f) for f in factors], images)))
    return output.clamp_(0, _BOUND).to(images.dtype)


def posterize(images: torch.Tensor, bits: Sequence[int]) -> torch.Tensor:
    """``F.posterize`` with a bit count per sample: a uint8 mask each (8 bits or more keep the image)."""
    masks = [255 if b >= 8 else ((1 << b) - 1) << (8 - b) for b in bits]
    return images & per_sample(masks, images, torch.uint8)


def solarize(images: torch.Tensor, thresholds: Sequence[float]) -> torch.Tensor:
    """``F.solarize`` with a threshold per sample (0-255 levels; compared in float32, as torch compares
    a uint8 image with a Python float)."""
    from torchvision.transforms.v2 import functional as F

    return torch.where(images >= per_sample(thresholds, images), F.invert(images), images)

