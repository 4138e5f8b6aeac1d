"""random_grayscale: turn an image grey with a probability (torchvision's ``RandomGrayscale``).

The output keeps 3 channels, each torchvision's grey level of a uint8 image
(``_rgb_to_grayscale_image``): ``r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114)`` in
float32, truncated to uint8. PyTorch's CPU kernel computes each ``add_`` with a fused
multiply-add (one rounding to float32 of ``sum + alpha * channel``; separate roundings differ
on 21 of the 16.7 M colours). DALI's colour-space conversion uses other coefficients, so the DALI
fragment spells the formula out: in float64, where ``sum + alpha * channel`` is exact, rounded
to float32 after each step as the fused multiply-add rounds, then floored — equal to torchvision
on every one of the 16.7 M colours (tests/ops/test_random_grayscale.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..util.checks import probability_checker
from .base import Param
from .dali_op import Column, DaliOp
from .facets import Batching, DaliBaseline, Display

# torchvision's weights, as float32 (the dtype PyTorch computes a uint8 image's grey in).
_WEIGHTS = tuple(np.float32(w) for w in (0.2989, 0.587, 0.114))


@dataclass(frozen=True)
class Grayscale:
    """Replace every channel with the grey level when ``apply``."""
    apply: bool


class RandomGrayscale(DaliOp, Batching, Display, DaliBaseline):
    draws = 1  # one uniform per sample: grey when below the probability, as torchvision's torch.rand(1) < p
    transform = "RandomGrayscale"

    def sample(self, params, u, height, width) -> tuple:
        return (Grayscale(bool(u[0] < params["probability"])),)

    def torchvision_kernel(self, image, concrete, params):
        from torchvision.transforms.v2 import functional as F

        return F.rgb_to_grayscale(image, num_output_channels=3) if concrete[0].apply else image

    def batch_kernel(self, images, concrete, params):
        from torchvision.transforms.v2 import functional as F

        from .batched import by_group, stacked

        batch = stacked(images)
        if batch is None:
            return None
        grey = [row for row, c in enumerate(concrete) if c[0].apply]
        return by_group(batch, {"grey": grey},
                        lambda _, group, rows: F.rgb_to_grayscale(group, num_output_channels=3).contiguous())

    def torchvision_transforms(self, params):
        from torchvision.transforms import v2

        return [v2.RandomGrayscale(params["probability"])]

    def torchvision_stage(self, params) -> str:
        return "F.rgb_to_grayscale (3 channels)"

    def dali_columns(self, step, ctx):
        return [Column("gray", "uint8", ()), Column("keep", "uint8", ())]

    def dali_arguments(self, step, concrete, sizes, ctx):
        gray = np.array([c[0].apply for c in concrete], dtype=np.uint8)
        return {"gray": gray, "keep": 1 - gray}

    def dali_graph(self, step, images, columns, ctx):
        from nvidia.dali import fn, math, types

        device = ctx.device
        gray, keep = columns["gray"], columns["keep"]
        if device == "gpu":
            gray, keep = gray.gpu(), keep.gpu()
        kept = images * keep  # uint8; exactly one of keep and gray is 1 per sample
        wide = fn.cast(images, dtype=types.FLOAT64, device=device)
        level = None
        for channel, weight in enumerate(_WEIGHTS):
            previous = None if level is None else fn.cast(level, dtype=types.FLOAT64, device=device)
            term = wide[:, :, channel] * weight  # exact in float64, and so is the sum
            level = fn.cast(term if previous is None else previous + term, dtype=types.FLOAT,
                            device=device)  # the float32 rounding PyTorch's fused multiply-add makes
        level = fn.cast(math.floor(level), dtype=types.UINT8, device=device)  # truncation, as .to(uint8)
        return kept + fn.stack(level, level, level, axis=2, device=device) * gray

    def dali_stages(self, step, ctx):
        stages = [("random_grayscale", "arithmetic (image x keep)"),
                  ("random_grayscale.level", "fn.cast (float64: sums of products exact)")]
        for channel in "RGB":
            if channel != "R":
                stages.append(("random_grayscale.level", "fn.cast (float64)"))
            stages.append(("random_grayscale.level", f"subscript ({channel} channel)"))
            stages.append(("random_grayscale.level", f"arithmetic (x {channel} weight)"))
            if channel != "R":
                stages.append(("random_grayscale.level", "arithmetic (add: PyTorch's fused multiply-add)"))
            stages.append(("random_grayscale.level", "fn.cast (float32, round to nearest)"))
        stages += [("random_grayscale.level", "arithmetic (floor)"),
                   ("random_grayscale.level", "fn.cast (uint8: torchvision's truncation)"),
                   ("random_grayscale", "fn.stack (grey level as 3 channels)"),
                   ("random_grayscale", "arithmetic (grey x chosen)"),
                   ("random_grayscale", "arithmetic (sum: the chosen one)")]
        return stages

    def dali_baseline(self, step, images, ctx):
        from nvidia.dali import fn, types

        # What a DALI user writes: saturation 0 (DALI's own grey coefficients) on a coin flip.
        keep = fn.random.coin_flip(probability=1.0 - step.params["probability"])
        return fn.hsv(images, saturation=fn.cast(keep, dtype=types.FLOAT), device=ctx.device)


RANDOM_GRAYSCALE = RandomGrayscale(
    "random_grayscale", "pixel", (
        Param("probability", 0.1, probability_checker,
              "chance of turning each image grey, in [0, 1] (default 0.1)"),),
    "Turn the image grey (3 equal channels, torchvision's grey levels) with the given probability "
    "(torchvision's RandomGrayscale).",
    primary="probability")

REGISTERED = (RANDOM_GRAYSCALE,)
