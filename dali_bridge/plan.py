"""Spec → plan: the backend-neutral list of steps, and where each runs on each backend.

The plan lowers compound ops (``crop_mirror_normalize`` → centre crop, flip, normalize), puts
sizes in (height, width) form and separates the finishing step (dtype, normalisation, layout).
:func:`placement` answers, as plain data, which implementation and device every step gets on a
backend — the DALI graph builder reads it, ``dali-bridge show`` prints it, tests check it
without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .ops import OPS, fixed_output_size, unsupported_options
from .spec import PipelineSpec


@dataclass(frozen=True)
class Step:
    """A geometry step: ``kind`` is random_resized_crop | resize | center_crop | horizontal_flip."""
    kind: str
    params: dict[str, Any] = field(hash=False)
    op_index: int  # position of the op in the spec that produced it

    @property
    def random(self) -> bool:
        return self.kind in ("random_resized_crop", "horizontal_flip")


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


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    finish: Finish
    output_size: tuple[int, int]  # (height, width) in pixels
    decode_device: str            # as declared: mixed | cpu
    parity: str = "exact"         # exact: DALI reproduces torchvision's resize borders; fast: plain fn.resize

    @property
    def random(self) -> bool:
        return any(step.random for step in self.steps)

    def output_shape(self, batch: int) -> tuple[int, ...]:
        h, w = self.output_size
        return (batch, 3, h, w) if self.finish.layout == "CHW" else (batch, h, w, 3)


def build_plan(spec: PipelineSpec) -> Plan:
    """Lower a validated spec into a plan."""
    steps: list[Step] = []
    finish = Finish()
    size: tuple[int, int] | None = None
    for index, op in enumerate(spec.ops):
        p = dict(op.params)
        if op.name == "random_resized_crop":
            size = fixed_output_size(p["size"])
            steps.append(Step("random_resized_crop", {**p, "size": size}, index))
        elif op.name == "resize":
            shorter = isinstance(p["size"], int)
            if not shorter:
                size = fixed_output_size(p["size"])
            steps.append(Step("resize", {**p, "size": (p["size"],) if shorter else fixed_output_size(p["size"]),
                                         "shorter_side": shorter}, index))
        elif op.name == "center_crop":
            size = fixed_output_size(p["size"])
            steps.append(Step("center_crop", {"size": size}, index))
        elif op.name == "horizontal_flip":
            steps.append(Step("horizontal_flip", p, index))
        elif op.name == "crop_mirror_normalize":
            if p["crop"] is not None:
                size = fixed_output_size(p["crop"])
                steps.append(Step("center_crop", {"size": size}, index))
            if p["mirror"] > 0:
                steps.append(Step("horizontal_flip", {"probability": p["mirror"]}, index))
            finish = Finish(tuple(p["mean"]), tuple(p["std"]), p["dtype"], p["layout"])
        elif op.name == "normalize":
            finish = Finish(tuple(p["mean"]), tuple(p["std"]), p["dtype"], p["layout"])
        else:  # the registry and this lowering must grow together
            raise NotImplementedError(f"op {op.name!r} has no plan lowering")
    if size is None:
        raise ValueError("plan has no fixed output size (the spec validator should have caught this)")
    return Plan(tuple(steps), finish, size, spec.decode_device, spec.parity)


@dataclass(frozen=True)
class Placed:
    """One stage of a backend's execution: what it does, the implementation, and the device."""
    stage: str
    implementation: str
    device: str


def unsupported_ops(spec: PipelineSpec, backend: str) -> list[tuple[int, str, tuple[str, ...]]]:
    """(op position, op name, backends that support it) for every op ``backend`` cannot run.

    An op whose options only some backends reproduce is named with them (``resize with
    interpolation bicubic with antialias false (...)``, see :func:`~dali_bridge.ops.unsupported_options`).
    """
    found = [(i, op.name, OPS[op.name].backends) for i, op in enumerate(spec.ops)
             if backend not in OPS[op.name].backends]
    for i, op in enumerate(spec.ops):
        found += [(i, f"{op.name} with {what}", backends) for what, backends in unsupported_options(op.name, op.params)
                  if backend not in backends and backend in OPS[op.name].backends]
    return sorted(found, key=lambda item: item[0])


def resize_method(interpolation: str, antialias: bool) -> str:
    """How the DALI graph reproduces torchvision's F.resize on uint8 images (see backends/dali.py).

    ``nearest`` (torchvision ignores antialias for nearest): two half-step-shifted resizes per
    axis blended by a mask; ``linear`` (bilinear, no antialias): plain fn.resize; ``filter_1pass``
    (bilinear, antialias): border renormalisation, one 2-D pass; ``filter_2pass`` (bicubic,
    antialias): renormalised width then height pass, clamped in between; ``antialias``: plain
    antialiased fn.resize, chosen by :func:`resize_methods` where a crop hides the border.
    Bicubic without antialias has none (:func:`~dali_bridge.ops.unsupported_options`).
    """
    if interpolation == "nearest":
        return "nearest"
    if not antialias:
        if interpolation == "bilinear":
            return "linear"
        raise ValueError(f"{interpolation} without antialias has no torchvision-exact DALI equivalent")
    return "filter_1pass" if interpolation == "bilinear" else "filter_2pass"


# Output pixels next to each border whose bilinear antialiasing filter reaches past the image:
# 1 when downscaling ((x + 0.5) * s - s < 0 only for x = 0, likewise at the far end); none that
# matter when upscaling (the truncated radius-1 filter equals the clamped one). One more for safety.
_BILINEAR_BORDER = 2


def resize_methods(plan: Plan) -> dict[int, str]:
    """Step index of each resize (``resize``, ``random_resized_crop``) → its :func:`resize_method` on DALI.

    A bilinear antialiased resize to a shorter side, cropped at the centre to at most that side
    minus 2 x 2 pixels (the shipped validation pipeline: 256 then 224), never shows its border
    rows, where alone the renormalisation changes pixels: it runs as a plain antialiased
    fn.resize (``antialias``), without the cost of the exact border. One to a fixed size of at
    least 3 x 3 that is the last geometry step (a final flip folds into crop_mirror_normalize; the
    shipped training pipeline) runs plain too, with only its outermost rows and columns computed
    the exact way and written over the batch's (``border_patch``).
    """
    methods: dict[int, str] = {}
    for n, step in enumerate(plan.steps):
        if step.kind not in ("resize", "random_resized_crop"):
            continue
        method = resize_method(step.params["interpolation"], step.params["antialias"])
        if plan.parity == "fast" and method in ("filter_1pass", "filter_2pass"):
            method = "antialias"  # DALI's own border handling: plain fn.resize, up to a few levels off at the edges
        following = plan.steps[n + 1] if n + 1 < len(plan.steps) else None
        if (method == "filter_1pass" and step.kind == "resize" and step.params["shorter_side"]
                and step.params["max_size"] is None and following is not None and following.kind == "center_crop"
                and max(following.params["size"]) <= step.params["size"][0] - 2 * _BILINEAR_BORDER):
            method = "antialias"
        fixed_size = step.kind == "random_resized_crop" or not step.params["shorter_side"]
        last_geometry = following is None or (n + 2 == len(plan.steps) and fused_mirror(plan))
        if method == "filter_1pass" and fixed_size and last_geometry and min(step.params["size"]) >= 3:
            method = "border_patch"
        methods[n] = method
    return methods


# The DALI operators of each resize method, in the order the graph lists them (stage suffix, implementation).
_NEAREST_PASS = [("", "fn.resize (nearest, grid shifted +1/2 step)"), ("", "arithmetic (x line mask)"),
                 ("", "fn.resize (nearest, grid shifted -1/2 step)"), ("", "arithmetic (x line mask)"),
                 ("", "arithmetic (sum: the lines PyTorch's float32 index picks)")]
_RENORMALISED_PASS = [(".zero_margins", "fn.reshape (HWC, no copy)"),
                      (".zero_margins", "fn.multi_paste (image on a zeroed canvas)"),
                      ("", "fn.resize (antialias, float, region of interest on the image)")]
RESIZE_STAGES: dict[str, list[tuple[str, str]]] = {
    "linear": [("", "fn.resize (no antialias)")],
    "antialias": [("", "fn.resize (antialias, DALI border handling)")],
    "nearest": ([(".width", impl) for _, impl in _NEAREST_PASS] + [(".height", "fn.transpose (height as width)")]
                + [(".height", impl) for _, impl in _NEAREST_PASS] + [(".height", "fn.transpose (back)")]),
    "filter_1pass": (_RENORMALISED_PASS
                     + [(".border_weights", "fn.resize (weight on the image per row)"),
                        (".border_weights", "fn.resize (weight on the image per column)"),
                        (".border_weights", "arithmetic (row x column)"),
                        (".renormalise", "arithmetic (divide: torchvision's truncated filter)"),
                        (".round", "fn.cast (uint8, round to nearest)")]),
    "border_patch": ([("", "fn.resize (antialias: every line off the border equals torchvision's)"),
                      (".border", "fn.reshape (HWC, no copy)")]
                     + [(f".border.{edge}", impl) for edge in ("top", "bottom", "left", "right") for impl in
                        ("fn.multi_paste (the edge strip beside a zeroed margin)",
                         "fn.resize (antialias, float, roi mapping the edge as the full resize does)")]
                     + [(".border.rows", "fn.cat (first and last row)"),
                        (".border.rows", "arithmetic (divide by the filter's weight on the image: "
                                         "torchvision's truncated filter)"),
                        (".border.rows", "fn.cast (uint8, round to nearest)"),
                        (".border.columns", "fn.cat (first and last column of the rows between)"),
                        (".border.columns", "arithmetic (divide: torchvision's truncated filter)"),
                        (".border.columns", "fn.cast (uint8, round to nearest)")]),
    "filter_2pass": ([(".width" + suffix, impl) for suffix, impl in _RENORMALISED_PASS]
                     + [(".width.border_weights", "fn.resize (weight on the image per column)"),
                        (".width.renormalise", "arithmetic (divide)"),
                        (".width.clamp", "arithmetic (clamp to [0, 255], as torchvision between passes)")]
                     + [(".height" + suffix, impl) for suffix, impl in _RENORMALISED_PASS]
                     + [(".height.border_weights", "fn.resize (weight on the image per row)"),
                        (".height.renormalise", "arithmetic (divide)"),
                        (".round", "fn.cast (uint8, round to nearest)")]),
}


def roi_decode(plan: Plan) -> bool:
    """DALI decodes only the crop window when the first step is a random resized crop."""
    return bool(plan.steps) and plan.steps[0].kind == "random_resized_crop"


def fused_mirror(plan: Plan) -> bool:
    """A flip that is the last geometry step folds into DALI's crop_mirror_normalize."""
    return bool(plan.steps) and plan.steps[-1].kind == "horizontal_flip"


def placement(plan: Plan, backend: str, cuda: bool = False) -> list[Placed]:
    """Where each stage runs on ``backend``.

    ``dali``: decode ``mixed`` (nvJPEG; ``cpu`` when the spec says ``decode.device: cpu``), every
    other op on ``gpu``. ``dali-cpu``: everything on ``cpu``. ``torchvision``: decode and geometry
    in DataLoader worker processes on the CPU, finishing on the batch — on ``cuda`` when the loader
    targets a GPU (``cuda=True``), else in the main process.
    """
    if backend in ("dali", "dali-cpu"):
        gpu = backend == "dali"
        op_device = "gpu" if gpu else "cpu"
        decode_device = ("mixed" if plan.decode_device == "mixed" else "cpu") if gpu else "cpu"
        stages = [Placed("read", "fn.external_source (bridge-owned order)", "cpu")]
        if roi_decode(plan):
            stages.append(Placed("decode", "fn.decoders.image_slice (ROI decode of the crop window)", decode_device))
        else:
            stages.append(Placed("decode", "fn.decoders.image", decode_device))
        if gpu and decode_device == "cpu":
            stages.append(Placed("to_gpu", ".gpu()", "gpu"))
        methods = resize_methods(plan)
        for n, step in enumerate(plan.steps):
            if step.kind == "random_resized_crop":
                if n > 0:
                    stages.append(Placed("random_resized_crop.crop", "fn.slice", op_device))
                stages += [Placed("random_resized_crop.resize" + suffix, impl, op_device)
                           for suffix, impl in RESIZE_STAGES[methods[n]]]
            elif step.kind == "resize":
                stages += [Placed("resize" + suffix, impl, op_device) for suffix, impl in RESIZE_STAGES[methods[n]]]
            elif step.kind == "center_crop":
                stages.append(Placed("center_crop", "fn.slice (zero padding)", op_device))
            elif step.kind == "horizontal_flip":
                if n == len(plan.steps) - 1:
                    stages.append(Placed("horizontal_flip", "fused into fn.crop_mirror_normalize", op_device))
                else:
                    stages.append(Placed("horizontal_flip", "fn.flip", op_device))
        stages.append(Placed("finish", f"fn.crop_mirror_normalize ({plan.finish.dtype}, {plan.finish.layout})",
                             op_device))
        if "border_patch" in methods.values():  # the resize's exact border lines, finished as the image
            stages += [Placed("finish.border", f"fn.crop_mirror_normalize ({lines}, as the image)", op_device)
                       for lines in ("first and last rows", "first and last columns")]
            stages.append(Placed("border_patch", "torch: the exact border lines written over the batch's, in place",
                                 "cuda" if gpu else "cpu"))
        return stages
    if backend == "torchvision":
        stages = [Placed("read", "DataLoader worker: file read", "cpu"),
                  Placed("decode", "torchvision.io.decode_image (RGB, EXIF orientation)", "cpu")]
        for step in plan.steps:
            impl = {"random_resized_crop": "F.crop + F.resize", "resize": "F.resize",
                    "center_crop": "F.crop (zero padding)", "horizontal_flip": "F.horizontal_flip"}[step.kind]
            stages.append(Placed(step.kind, impl, "cpu"))
        stages.append(Placed("batch", "uint8 batch through worker queue", "cpu"))
        stages.append(Placed("finish", f"to {plan.finish.dtype}, normalise, {plan.finish.layout} on the batch",
                             "cuda" if cuda else "cpu"))
        return stages
    raise ValueError(f"unknown backend {backend!r}")
