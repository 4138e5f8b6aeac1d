"""Geometry ops: random_resized_crop, resize, center_crop, horizontal_flip.

Their concrete per-sample parameters are :class:`Crop`, :class:`Resize` and :class:`Flip`
(torchvision's own algorithms, driven by the bridge's uniforms); the DALI fragments apply them
as per-sample arguments, and the resizes hand their arguments and graph to the method
:attr:`dali_bridge.backends.dali.plan.DaliPlan.resize_methods` chose (:mod:`dali_bridge.ops.exact_resize`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from ..errors import ImageError
from ..util.checks import (bool_checker, choice_checker, fixed_output_size, optional, probability_checker,
    range_checker, size_checker)
from .base import INTERPOLATIONS, REQUIRED, Param, ResizeRequest, Step
from .dali_op import Column, DaliOp, GraphContext
from .exact_resize import METHODS, per_sample_filter
from .facets import DaliBaseline, Display, Sizing, SpecRules, facet

RRC_ATTEMPTS = 10  # torchvision's RandomResizedCrop tries 10 windows, then falls back to the centre
# timm's RandomResizedCropAndInterpolation with interpolation 'random' (its training default) picks one of
# these per image (``random.choice``, in this order): the crop's ``interpolation: random``.
RANDOM_FILTERS = ("bilinear", "bicubic")


@dataclass(frozen=True)
class Crop:
    """Take rows [top, top+height) and columns [left, left+width); outside the image is zero."""
    top: int
    left: int
    height: int
    width: int


@dataclass(frozen=True)
class Resize:
    """Resample to (height, width) pixels."""
    height: int
    width: int
    interpolation: str
    antialias: bool


@dataclass(frozen=True)
class Flip:
    """Mirror left-right when ``apply``."""
    apply: bool


def area_and_aspect(area: int, u_area: float, u_ratio: float, scale: Sequence[float],
                    ratio: Sequence[float]) -> tuple[float, float]:
    """One attempt of torchvision's random box: an area uniform in ``scale`` × ``area`` pixels and an
    aspect ratio log-uniform in ``ratio`` (RandomResizedCrop's and RandomErasing's draw alike)."""
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    return area * (scale[0] + (scale[1] - scale[0]) * u_area), math.exp(log_lo + (log_hi - log_lo) * u_ratio)


def rrc_window(height: int, width: int, u: Sequence[float], scale: Sequence[float],
               ratio: Sequence[float]) -> tuple[int, int, int, int]:
    """torchvision's ``RandomResizedCrop.get_params`` driven by 22 given uniforms.

    Returns (top, left, crop height, crop width). Area uniform in ``scale``, aspect ratio
    log-uniform in ``ratio``, 10 attempts, then the centred fallback — the same algorithm.
    """
    for attempt in range(RRC_ATTEMPTS):
        target_area, aspect = area_and_aspect(height * width, u[2 * attempt], u[2 * attempt + 1], scale, ratio)
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = min(int(u[-2] * (height - h + 1)), height - h)
            left = min(int(u[-1] * (width - w + 1)), width - w)
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def shorter_side_size(height: int, width: int, size: int, max_size: int | None = None) -> tuple[int, int]:
    """torchvision's output size for ``Resize(int)``: shorter side ``size``, aspect kept (truncated).

    Raises :class:`~dali_bridge.errors.ImageError` (a sample error, handled by ``on_error``) when
    ``max_size`` leaves the shorter side under one pixel: an image too thin for this resize.
    """
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    if max_size is not None and new_long > max_size:
        new_short, new_long = int(max_size * new_short / new_long), max_size
        if new_short < 1:
            raise ImageError(f"too thin to resize: shorter side {size} with max_size {max_size} would make this "
                             f"{height}x{width} image {max_size} pixels long and {max_size * short / long:.2f} wide")
    return (new_long, new_short) if width <= height else (new_short, new_long)


def center_crop_window(height: int, width: int, crop_h: int, crop_w: int) -> Crop:
    """torchvision's ``center_crop`` window, padding (negative anchors) when the crop is larger."""
    if crop_h > height or crop_w > width:
        pad_top = (crop_h - height) // 2 if crop_h > height else 0
        pad_left = (crop_w - width) // 2 if crop_w > width else 0
        padded_h = height + pad_top + ((crop_h - height + 1) // 2 if crop_h > height else 0)
        padded_w = width + pad_left + ((crop_w - width + 1) // 2 if crop_w > width else 0)
        top = int(round((padded_h - crop_h) / 2.0)) - pad_top
        left = int(round((padded_w - crop_w) / 2.0)) - pad_left
        return Crop(top, left, crop_h, crop_w)
    return Crop(int(round((height - crop_h) / 2.0)), int(round((width - crop_w) / 2.0)), crop_h, crop_w)


# ---- shared pieces

_INTERP = Param("interpolation", "bilinear", choice_checker(INTERPOLATIONS),
                "resampling filter: nearest | bilinear | bicubic (default bilinear)")
_RRC_INTERP = Param("interpolation", "bilinear", choice_checker(INTERPOLATIONS + ("random",)),
                     "resampling filter: nearest | bilinear | bicubic | random: bilinear or bicubic drawn per "
                     "sample, as timm's RandomResizedCropAndInterpolation (default bilinear)")
_ANTIALIAS = Param("antialias", True, bool_checker,
                   "low-pass filter when downscaling, as torchvision's antialias=True (default true)")
_CROP_COLUMNS = [Column("crop.anchor", "int32", (2,)), Column("crop.shape", "int32", (2,))]


def _interpolation(name: str) -> Any:
    from torchvision.transforms import InterpolationMode

    return {"nearest": InterpolationMode.NEAREST, "bilinear": InterpolationMode.BILINEAR,
            "bicubic": InterpolationMode.BICUBIC}[name]


def _dali_interp(name: str) -> Any:
    """DALI's filter; for ``random`` (the plain-DALI bench baseline) a per-sample coin flip between
    bilinear and bicubic, DALI's own draw."""
    from nvidia.dali import fn, types

    if name == "random":
        return per_sample_filter(fn.random.coin_flip(dtype=types.INT32))
    return {"nearest": types.INTERP_NN, "bilinear": types.INTERP_LINEAR, "bicubic": types.INTERP_CUBIC}[name]


def _crop_arguments(crops: Sequence[Crop]) -> dict[str, np.ndarray]:
    return {"crop.anchor": np.array([(c.top, c.left) for c in crops], dtype=np.int32),
            "crop.shape": np.array([(c.height, c.width) for c in crops], dtype=np.int32)}


def _slice(images: Any, columns: Mapping[str, Any], device: str) -> Any:
    from nvidia.dali import fn

    return fn.slice(images, columns["crop.anchor"], columns["crop.shape"], axis_names="HW", normalized_anchor=False,
                    normalized_shape=False, out_of_bounds_policy="pad", fill_values=0, device=device)


def _resize_kernel(image: Any, resize: Resize) -> Any:
    from torchvision.transforms.v2 import functional as F

    if image.shape[-2:] == (resize.height, resize.width):
        return image
    return F.resize(image, [resize.height, resize.width], interpolation=_interpolation(resize.interpolation),
                    antialias=resize.antialias)


class _Resampling(DaliOp, Sizing, SpecRules, Display, DaliBaseline):
    """What the two resizing ops share: unsupported options, the exact-resize method's columns,
    arguments, graph and stages (its column names prefixed ``resize.``)."""

    def resize_request(self, params: Mapping[str, Any]) -> ResizeRequest:
        return ResizeRequest(params["interpolation"], params["antialias"], tuple(params["size"]),
                             params.get("max_size"))

    def output_size(self, concrete: tuple, height: int, width: int) -> tuple[int, int]:
        resize = concrete[-1]  # its Resize comes last (after a random resized crop's window)
        return resize.height, resize.width

    def unsupported_options(self, params: Mapping[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
        """bicubic without antialias: torchvision's filter is Keys' cubic with a = -0.75 and DALI's
        cubic filter has a = -0.5 (measured up to 11 levels of 255 apart, everywhere in the image),
        so it runs on torchvision only rather than silently differ. A 1 x 1 output (size 1, or a
        shorter side of 1 on a square image) with bilinear or bicubic: PyTorch's uint8 resize fails
        on it with an internal assert, so it runs on the DALI backends only."""
        found = []
        if params.get("interpolation") in ("bicubic", "random") and params.get("antialias") is False:
            found.append((f"interpolation {params['interpolation']} with antialias false (torchvision's "
                          "non-antialiased bicubic, a=-0.75, has no DALI filter; DALI's cubic is a=-0.5): set "
                          "antialias: true or use bilinear", ("torchvision",)))
        if params.get("size") in (1, [1, 1], (1, 1)) and params.get("interpolation", "bilinear") != "nearest":
            found.append((f"size {params['size']} with interpolation {params.get('interpolation', 'bilinear')} "
                          "(PyTorch's uint8 resize cannot make a 1x1 image): use nearest or at least 2 pixels",
                          ("dali", "dali-cpu")))
        return found

    @staticmethod
    def _resize_columns(step: Step, ctx: GraphContext) -> list[Column]:
        method = METHODS[ctx.resize_methods[ctx.position]]
        drawn = [Column("resize.bicubic", "int32", ())] if step.params["interpolation"] == "random" else []
        return [Column("resize." + c.name, c.dtype, c.shape) for c in method.columns()] + drawn

    @staticmethod
    def _resize_arguments(step: Step, resizes: Sequence[Resize], in_hw: Sequence[tuple[int, int]],
                          ctx: GraphContext) -> dict[str, Any]:
        method = METHODS[ctx.resize_methods[ctx.position]]
        built = method.arguments(in_hw, [(r.height, r.width) for r in resizes])
        if step.params["interpolation"] == "random":  # each sample's drawn filter: 1 bicubic, 0 bilinear
            built["bicubic"] = np.array([r.interpolation == "bicubic" for r in resizes], dtype=np.int32)
        return {"resize." + name: value for name, value in built.items()}

    @staticmethod
    def _resize_graph(step: Step, images: Any, columns: Mapping[str, Any], ctx: GraphContext) -> Any:
        method = METHODS[ctx.resize_methods[ctx.position]]
        own = {name[len("resize."):]: node for name, node in columns.items() if name.startswith("resize.")}
        interpolation = step.params["interpolation"]
        if interpolation == "random":  # one graph for both filters: DALI's resize takes its filter per sample
            interpolation = per_sample_filter(own.pop("bicubic"))
        images, side_outputs = method.graph(images, own, interpolation, ctx.device)
        ctx.side_outputs += side_outputs  # a border patch's edge lines: the finish treats them as images
        return images

    @staticmethod
    def _resize_stages(step: Step, stage: str, ctx: GraphContext) -> list[tuple[str, str]]:
        drawn = ([(stage + ".filter", "arithmetic + fn.cast of a per-sample argument (the filter drawn: bilinear "
                                      "or bicubic)")] if step.params["interpolation"] == "random" else [])
        return drawn + [(stage + suffix, impl) for suffix, impl in METHODS[ctx.resize_methods[ctx.position]].stages()]


class RandomResizedCrop(_Resampling):
    draws = 2 * RRC_ATTEMPTS + 2  # 2 per attempt (area, log aspect ratio), then top and left
    transform = "RandomResizedCrop"
    size_param, size_rule = "size", "output"
    window_columns = ("crop.anchor", "crop.shape")  # as the first step, the decoder's region of interest

    def lower(self, params: dict[str, Any], op_index: int) -> list[Step]:
        return [Step(self, {**params, "size": fixed_output_size(params["size"])}, op_index)]

    def draw_count(self, params) -> int:
        return self.draws + (params["interpolation"] == "random")  # then one more: the filter

    def sample(self, params, u, height, width) -> tuple:
        top, left, crop_h, crop_w = rrc_window(height, width, u[:self.draws], params["scale"], params["ratio"])
        out_h, out_w = params["size"]
        interpolation = params["interpolation"]
        if interpolation == "random":  # timm's random.choice(self.interpolation)
            interpolation = RANDOM_FILTERS[min(int(u[self.draws] * len(RANDOM_FILTERS)), len(RANDOM_FILTERS) - 1)]
        return Crop(top, left, crop_h, crop_w), Resize(out_h, out_w, interpolation, params["antialias"])

    def torchvision_kernel(self, image, concrete, params):
        from torchvision.transforms.v2 import functional as F

        crop, resize = concrete
        return _resize_kernel(F.crop(image, crop.top, crop.left, crop.height, crop.width), resize)

    def torchvision_transforms(self, params):
        from torchvision.transforms import v2

        def crop(interpolation: str) -> Any:
            return v2.RandomResizedCrop(list(params["size"]), scale=tuple(params["scale"]),
                                        ratio=tuple(params["ratio"]), interpolation=_interpolation(interpolation),
                                        antialias=params["antialias"])
        if params["interpolation"] == "random":  # a filter per image, equally likely: timm's choice
            return [v2.RandomChoice([crop(name) for name in RANDOM_FILTERS])]
        return [crop(params["interpolation"])]

    def torchvision_stage(self, params) -> str:
        return "F.crop + F.resize"

    def _window_decoded(self, ctx: GraphContext) -> bool:
        # the first step's window is the decoder's region of interest (unless views share a whole decode)
        return ctx.position == 0 and ctx.window_decoded

    def dali_columns(self, step, ctx):
        return _CROP_COLUMNS + self._resize_columns(step, ctx)

    def dali_arguments(self, step, concrete, sizes, ctx):
        crops = [c[0] for c in concrete]
        return {**_crop_arguments(crops),
                **self._resize_arguments(step, [c[1] for c in concrete], [(c.height, c.width) for c in crops], ctx)}

    def dali_graph(self, step, images, columns, ctx):
        if not self._window_decoded(ctx):
            images = _slice(images, columns, ctx.device)
        return self._resize_graph(step, images, columns, ctx)

    def dali_stages(self, step, ctx):
        crop = [] if self._window_decoded(ctx) else [(f"{step.name}.crop", "fn.slice")]
        return crop + self._resize_stages(step, f"{step.name}.resize", ctx)

    def dali_baseline_decode(self, step: Step, encoded: Any, decode_device: str, ctx: GraphContext) -> Any:
        """DALI's own random-crop decoder, then the resize: what a DALI user writes first."""
        from nvidia.dali import fn, types

        p = step.params
        images = fn.decoders.image_random_crop(encoded, device=decode_device, output_type=types.RGB,
                                               random_area=list(p["scale"]), random_aspect_ratio=list(p["ratio"]),
                                               num_attempts=RRC_ATTEMPTS)
        return fn.resize(images, resize_x=p["size"][1], resize_y=p["size"][0],
                         interp_type=_dali_interp(p["interpolation"]), antialias=p["antialias"], device=ctx.device)

    def dali_baseline(self, step, images, ctx):
        from nvidia.dali import fn

        p = step.params
        return fn.random_resized_crop(images, size=list(p["size"]), random_area=list(p["scale"]),
                                      random_aspect_ratio=list(p["ratio"]), antialias=p["antialias"],
                                      interp_type=_dali_interp(p["interpolation"]), device=ctx.device)


class ResizeOp(_Resampling):
    transform = "Resize"
    size_param, size_rule = "size", "resize"

    def lower(self, params: dict[str, Any], op_index: int) -> list[Step]:
        shorter = isinstance(params["size"], int)
        size = (params["size"],) if shorter else fixed_output_size(params["size"])
        return [Step(self, {**params, "size": size, "shorter_side": shorter}, op_index)]

    def sample(self, params, u, height, width) -> tuple:
        if params["shorter_side"]:
            height, width = shorter_side_size(height, width, params["size"][0], params["max_size"])
        else:
            height, width = params["size"]
        return (Resize(height, width, params["interpolation"], params["antialias"]),)

    def torchvision_kernel(self, image, concrete, params):
        return _resize_kernel(image, concrete[0])

    def torchvision_transforms(self, params):
        from torchvision.transforms import v2

        size = params["size"][0] if params["shorter_side"] else list(params["size"])
        return [v2.Resize(size, interpolation=_interpolation(params["interpolation"]), max_size=params.get("max_size"),
                          antialias=params["antialias"])]

    def torchvision_stage(self, params) -> str:
        return "F.resize"

    def dali_columns(self, step, ctx):
        return self._resize_columns(step, ctx)

    def dali_arguments(self, step, concrete, sizes, ctx):
        return self._resize_arguments(step, [c[0] for c in concrete], sizes, ctx)

    def dali_graph(self, step, images, columns, ctx):
        return self._resize_graph(step, images, columns, ctx)

    def dali_stages(self, step, ctx):
        return self._resize_stages(step, step.name, ctx)

    def dali_baseline(self, step, images, ctx):
        from nvidia.dali import fn

        p = step.params
        interp = _dali_interp(p["interpolation"])
        if p["shorter_side"]:
            extra = {"max_size": p["max_size"]} if p.get("max_size") else {}
            return fn.resize(images, resize_shorter=p["size"][0], interp_type=interp, antialias=p["antialias"],
                             device=ctx.device, **extra)
        return fn.resize(images, resize_x=p["size"][1], resize_y=p["size"][0], device=ctx.device, interp_type=interp,
                         antialias=p["antialias"])


class CenterCrop(DaliOp, Sizing, SpecRules, Display, DaliBaseline):
    transform = "CenterCrop"
    size_param, size_rule = "size", "crop"

    def kept_centre(self, params: Mapping[str, Any]) -> tuple[int, int]:
        return params["size"]

    def output_size(self, concrete: tuple, height: int, width: int) -> tuple[int, int]:
        return concrete[0].height, concrete[0].width

    def lower(self, params: dict[str, Any], op_index: int) -> list[Step]:
        return [Step(self, {"size": fixed_output_size(params["size"])}, op_index)]

    def sample(self, params, u, height, width) -> tuple:
        return (center_crop_window(height, width, *params["size"]),)

    def torchvision_kernel(self, image, concrete, params):
        from torchvision.transforms.v2 import functional as F

        crop = concrete[0]
        return F.crop(image, crop.top, crop.left, crop.height, crop.width)

    def torchvision_transforms(self, params):
        from torchvision.transforms import v2

        return [v2.CenterCrop(list(params["size"]))]

    def torchvision_stage(self, params) -> str:
        return "F.crop (zero padding)"

    def dali_columns(self, step, ctx):
        return list(_CROP_COLUMNS)

    def dali_arguments(self, step, concrete, sizes, ctx):
        return _crop_arguments([c[0] for c in concrete])

    def dali_graph(self, step, images, columns, ctx):
        return _slice(images, columns, ctx.device)

    def dali_stages(self, step, ctx):
        return [(step.name, "fn.slice (zero padding)")]

    def dali_baseline(self, step, images, ctx):
        from nvidia.dali import fn

        if all(facet(later.op, Sizing).folds_into_finish for later in ctx.plan.steps[ctx.position + 1:]):
            ctx.crop = list(step.params["size"])  # crop_mirror_normalize crops (a user's fused op)
            return images
        return fn.crop(images, crop=list(step.params["size"]), out_of_bounds_policy="pad", device=ctx.device)


class HorizontalFlip(DaliOp, Sizing, Display, DaliBaseline):
    draws = 1
    transform = "RandomHorizontalFlip"
    folds_into_finish = True

    def sample(self, params, u, height, width) -> tuple:
        return (Flip(bool(u[0] < params["probability"])),)

    def torchvision_kernel(self, image, concrete, params):
        from torchvision.transforms.v2 import functional as F

        return F.horizontal_flip(image) if concrete[0].apply else image

    def torchvision_transforms(self, params):
        from torchvision.transforms import v2

        return [v2.RandomHorizontalFlip(params["probability"])]

    def torchvision_stage(self, params) -> str:
        return "F.horizontal_flip"

    def dali_columns(self, step, ctx):
        return [Column("flip", "int32", ())]

    def dali_arguments(self, step, concrete, sizes, ctx):
        return {"flip": np.array([c[0].apply for c in concrete], dtype=np.int32)}

    def dali_graph(self, step, images, columns, ctx):
        from nvidia.dali import fn

        if ctx.is_last_step():  # crop_mirror_normalize mirrors it: one pass less
            ctx.mirror = columns["flip"]
            return images
        return fn.flip(images, horizontal=columns["flip"], device=ctx.device)

    def dali_stages(self, step, ctx):
        return [(step.name, "fused into fn.crop_mirror_normalize" if ctx.is_last_step() else "fn.flip")]

    def dali_baseline(self, step, images, ctx):
        from nvidia.dali import fn

        coin = fn.random.coin_flip(probability=step.params["probability"])
        if ctx.is_last_step():
            ctx.mirror = coin
            return images
        return fn.flip(images, horizontal=coin, device=ctx.device)


RANDOM_RESIZED_CROP = RandomResizedCrop(
    "random_resized_crop", "geometry", (
        Param("size", REQUIRED, size_checker, "output size in pixels: an integer (square) or [height, width]"),
        Param("scale", [0.08, 1.0], range_checker(0.0, 1.0, "fractions of the image area"),
              "range of the crop's area as a fraction of the image area, in (0, 1] (default [0.08, 1.0])"),
        Param("ratio", [3.0 / 4.0, 4.0 / 3.0], range_checker(0.0, None, "aspect ratios (width/height)"),
              "range of the crop's aspect ratio width/height, drawn log-uniformly (default [3/4, 4/3])"),
        _RRC_INTERP, _ANTIALIAS),
    "Crop a random window (area and aspect ratio drawn as torchvision's RandomResizedCrop: "
    "10 attempts, then a centred fallback) and resize it to `size`; `interpolation: random` draws "
    "bilinear or bicubic per sample (timm's RandomResizedCropAndInterpolation default).",
    primary="size")

RESIZE = ResizeOp(
    "resize", "geometry", (
        Param("size", REQUIRED, size_checker,
              "an integer: the shorter side in pixels, aspect ratio kept (torchvision's Resize(int)); "
              "or [height, width]: exact output size"),
        Param("max_size", None, optional(size_checker),
              "with an integer size: cap on the longer side in pixels (default none)"),
        _INTERP, _ANTIALIAS),
    "Resize the image, like torchvision's Resize.", primary="size")

CENTER_CROP = CenterCrop(
    "center_crop", "geometry", (
        Param("size", REQUIRED, size_checker, "output size in pixels: an integer (square) or [height, width]"),),
    "Crop the centre (torchvision's rounding); images smaller than the crop are padded with zeros.",
    primary="size")

HORIZONTAL_FLIP = HorizontalFlip(
    "horizontal_flip", "geometry", (
        Param("probability", 0.5, probability_checker, "chance of flipping each image, in [0, 1] (default 0.5)"),),
    "Mirror left-right with the given probability (torchvision's RandomHorizontalFlip).",
    primary="probability")

REGISTERED = (RANDOM_RESIZED_CROP, RESIZE, CENTER_CROP, HORIZONTAL_FLIP)
