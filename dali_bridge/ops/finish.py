"""The finish: dtype conversion, normalisation and layout (``normalize``), and the DALI-style
compound ``crop_mirror_normalize`` that lowers to a centre crop, a flip and the finish.

On torchvision the finish runs on the whole batch (``backends.finishing.finish_batch``, from
:attr:`dali_bridge.pipeline.plan.Plan.finish`); on DALI it is one fn.crop_mirror_normalize, which also
takes a last flip as its ``mirror`` argument.
"""
from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any

from ..util.dtypes import dali_type, torch_dtype
from ..util.checks import channels_checker, choice_checker, optional, probability_checker, size_checker
from .base import DTYPES, LAYOUTS, Op, Param, Step
from .dali_op import DaliOp
from .facets import DaliBaseline, Display, Sizing, SpecRules, facet
from .geometry import CENTER_CROP, HORIZONTAL_FLIP


@dataclass(frozen=True)
class Finish:
    """dtype conversion and normalisation: float = (pixel/255 - mean)/std; uint8 = unchanged."""
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    dtype: str = "uint8"
    layout: str = "CHW"

    @property
    def identity(self) -> bool:
        return self.mean == (0.0, 0.0, 0.0) and self.std == (1.0, 1.0, 1.0)


# The finish a spec without normalize gets: uint8, CHW, values unchanged.
IMPLICIT_FINISH = {"mean": [0.0, 0.0, 0.0], "std": [1.0, 1.0, 1.0], "dtype": "uint8", "layout": "CHW"}


def _output_dtype(params: Mapping[str, Any]) -> str:
    """The finish's output dtype from the spec's parameters (its default when left out)."""
    return params.get("dtype", _DTYPE.default)


def _check_finish(params: dict) -> list[tuple[str, str]]:
    if params.get("dtype") == "uint8" and (params.get("mean") != [0.0] * 3 or params.get("std") != [1.0] * 3):
        return [("dtype", "uint8 output cannot hold normalised values: use dtype float32 or float16, "
                          "or leave mean/std at their defaults [0,0,0]/[1,1,1]")]
    return []


class Normalize(DaliOp, Sizing, SpecRules, Display, DaliBaseline):
    transform = "ToDtype + Normalize"

    def extra_check(self, params: dict) -> list[tuple[str, str]]:
        return _check_finish(params)

    def output_dtype(self, params: Mapping[str, Any]) -> str:
        return _output_dtype(params)

    def lower(self, params: dict[str, Any], op_index: int) -> list[Step]:
        return [Step(self, {key: params[key] for key in ("mean", "std", "dtype", "layout")}, op_index)]

    @staticmethod
    def finish(params: dict[str, Any]) -> Finish:
        return Finish(tuple(params["mean"]), tuple(params["std"]), params["dtype"], params["layout"])

    def torchvision_transforms(self, params):
        from torchvision.transforms import v2

        finish = self.finish(params)
        found = [v2.ToDtype(torch_dtype(finish.dtype), scale=True)]
        if not finish.identity:
            found.append(v2.Normalize(list(finish.mean), list(finish.std)))
        if finish.layout != "CHW":
            found.append(v2.Lambda(lambda image: image.permute(1, 2, 0)))
        return found

    def torchvision_stage(self, params) -> str:
        return f"to {params['dtype']}, normalise, {params['layout']} on the batch"

    def _arguments(self, step: Step, ctx: Any) -> dict[str, Any]:
        finish = self.finish(step.params)
        args: dict[str, Any] = dict(dtype=dali_type(finish.dtype), output_layout=finish.layout,
                                    device=ctx.device)
        if finish.dtype != "uint8":  # float outputs are pixel/255 even with the default mean 0, std 1
            args.update(mean=[m * 255.0 for m in finish.mean], std=[s * 255.0 for s in finish.std])
        if ctx.mirror is not None:
            args["mirror"] = ctx.mirror
        return args

    def dali_graph(self, step, images, columns, ctx):
        """The pipeline's outputs: the images, then the side outputs (finished alike, flip included)."""
        from nvidia.dali import fn

        args = self._arguments(step, ctx)
        return tuple(fn.crop_mirror_normalize(out, **args) for out in [images] + ctx.side_outputs)

    def dali_stages(self, step, ctx):
        return [("finish", f"fn.crop_mirror_normalize ({step.params['dtype']}, {step.params['layout']})")]

    def dali_baseline(self, step, images, ctx):
        from nvidia.dali import fn

        args = self._arguments(step, ctx)
        if ctx.crop is not None:
            args.update(crop=ctx.crop, out_of_bounds_policy="pad")
        return fn.crop_mirror_normalize(images, **args)


class CropMirrorNormalize(Op, Sizing, SpecRules):
    size_param, size_rule = "crop", "crop"

    @property
    def random(self) -> bool:
        return True  # its mirror lowers to a random flip

    def extra_check(self, params: dict) -> list[tuple[str, str]]:
        return _check_finish(params)

    def output_dtype(self, params: Mapping[str, Any]) -> str:
        return _output_dtype(params)

    def lower(self, params: dict[str, Any], op_index: int) -> list[Step]:
        steps: list[Step] = []
        if params["crop"] is not None:
            steps += CENTER_CROP.lower({"size": params["crop"]}, op_index)
        if params["mirror"] > 0:
            steps += facet(HORIZONTAL_FLIP, SpecRules).lower({"probability": params["mirror"]}, op_index)
        return steps + NORMALIZE.lower(params, op_index)


_MEAN = Param("mean", [0.0, 0.0, 0.0], channels_checker("mean", positive=False),
              "per-channel mean in [0, 1] units (default [0, 0, 0])")
_STD = Param("std", [1.0, 1.0, 1.0], channels_checker("std", positive=True),
             "per-channel std in [0, 1] units, > 0 (default [1, 1, 1])")
_DTYPE = Param("dtype", "float32", choice_checker(DTYPES), "output dtype: float32 | float16 | uint8 (default float32)")
_LAYOUT = Param("layout", "CHW", choice_checker(LAYOUTS), "output layout per image: CHW | HWC (default CHW)")

NORMALIZE = Normalize(
    "normalize", "finish", (_MEAN, _STD, _DTYPE, _LAYOUT),
    "Convert to `dtype` and normalise: (pixel/255 - mean) / std for float outputs. Comes after every op on uint8 "
    "images.")

CROP_MIRROR_NORMALIZE = CropMirrorNormalize(
    "crop_mirror_normalize", "compound", (
        Param("crop", None, optional(size_checker), "centre crop size in pixels applied first (default none)"),
        Param("mirror", 0.0, probability_checker, "chance of a horizontal flip, in [0, 1] (default 0)"),
        _MEAN, _STD, _DTYPE, _LAYOUT),
    "DALI-style fused op: optional centre crop, random mirror, then normalize. Comes after every op on uint8 images.",
)

REGISTERED = (NORMALIZE, CROP_MIRROR_NORMALIZE)
