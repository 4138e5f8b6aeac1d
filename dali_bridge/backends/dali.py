"""The DALI backend: the plan compiled once into a DALI pipeline, fed in the bridge's order.

One graph builder serves ``dali`` (nvJPEG ``mixed`` decode, ops on the GPU) and ``dali-cpu``
(every op on the CPU); the only difference is the device each stage gets from
:func:`dali_bridge.plan.placement`. Samples enter through an external source in the order and
with the geometry the loader decided: the feeder reads each file, probes its size, and computes
torchvision-exact crop windows, resize sizes and flips, which DALI applies as per-sample
arguments (ROI decode of the crop window, then resize) — DALI draws no randomness of its own.
"""
from __future__ import annotations

import io
import logging
import os
import threading
import weakref
from collections import deque
from typing import Any, Iterator

import numpy as np
import torch

from ..images import ImageError, SampleError, decode_rgb
from .base import RawBatch, SkippedSample, Topology, default_workers
from ..plan import Plan, fused_mirror, placement, roi_decode
from ..plan import resize_methods as plan_resize_methods
from ..sampling import BatchTask, Crop, Flip, Resize, draws, sample_geometry
from ..sources import Listing
from ..spec import PipelineSpec

log = logging.getLogger("dali_bridge")

_INTERP = {"nearest": "INTERP_NN", "bilinear": "INTERP_LINEAR", "bicubic": "INTERP_CUBIC"}

# Every DALI pipeline alive in this process. A forked child (a DataLoader worker, say) inherits
# them without DALI's threads, and destroying one there — e.g. when the child's garbage collector
# finalizes a loader left in a reference cycle by a traceback — waits forever on a condition
# variable those threads were waiting on, or crashes. The child keeps them, never destroying them.
# They are pinned in the parent just before the fork: a collection can run in the child before
# any hook of ours (threading's own after-fork hook allocates), and must find them referenced.
_LIVE_PIPELINES: "weakref.WeakSet[Any]" = weakref.WeakSet()
_INHERITED_PIPELINES: list = []
_PINNED_FOR_FORK: list = []


def _pin_pipelines() -> None:
    _PINNED_FOR_FORK.extend(_LIVE_PIPELINES)


def _unpin_pipelines() -> None:
    _PINNED_FOR_FORK.clear()


def _keep_inherited_pipelines() -> None:
    _INHERITED_PIPELINES.extend(_PINNED_FOR_FORK)
    _PINNED_FOR_FORK.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_pin_pipelines, after_in_parent=_unpin_pipelines,
                        after_in_child=_keep_inherited_pipelines)

_DTYPES = {"float32": "FLOAT", "float16": "FLOAT16", "uint8": "UINT8"}


def _placeholder_jpeg() -> bytes:
    """A tiny valid JPEG fed when every sample of a batch was skipped (DALI needs >= 1 sample)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "JPEG")
    return buffer.getvalue()


class _Feeder:
    """The external source: yields the inputs of each batch in the loader's order.

    DALI calls it ahead of consumption (prefetch); ``pending`` keeps, in order, which samples
    each fed batch holds so outputs can be matched to indices. Thread-safe: DALI may call from
    its own thread.
    """

    def __init__(self, spec: PipelineSpec, listing: Listing, plan: Plan):
        self.spec, self.listing, self.plan = spec, listing, plan
        self.tasks: list[BatchTask] = []
        self.position = 0
        self.stopped = True
        self.pending: deque = deque()
        # sample index → (reason, file signature then), found by a failed DALI run: skipped without
        # another failed run while the file stays as it was, read again once it changed.
        self.bad: dict[int, tuple[str, tuple[int, int] | None]] = {}
        self.lock = threading.Lock()
        self._placeholder: bytes | None = None
        self.resize_methods = resize_methods(plan)  # fixed per plan: not recomputed per batch

    def start(self, tasks: list[BatchTask]) -> None:
        with self.lock:
            self.tasks, self.position, self.stopped = tasks, 0, False
            self.pending.clear()

    def stop(self) -> None:
        with self.lock:
            self.stopped = True

    def __iter__(self) -> "_Feeder":
        return self

    def __next__(self) -> list[list[np.ndarray]]:
        with self.lock:
            if self.stopped or self.position >= len(self.tasks):
                raise StopIteration
            task = self.tasks[self.position]
            self.position += 1
        inputs, meta = self.prepare(task)
        with self.lock:
            self.pending.append(meta)
        return inputs

    def prepare(self, task: BatchTask) -> tuple[list[list[np.ndarray]], dict[str, Any]]:
        """Read, probe and compute geometry for one batch; apply the error policy to failures."""
        sample_draws = draws(self.plan, self.spec.seed, task.epoch, task.indices)
        encoded: list[np.ndarray] = []
        geometry: list[list] = []
        sizes: list[tuple[int, int]] = []  # decoded (height, width) of each kept sample
        kept: list[int] = []
        skipped: list[SkippedSample] = []
        error: SampleError | None = None
        for row, index in enumerate(task.indices.tolist()):
            path = self.listing.paths[index]
            try:
                if index in self.bad:
                    reason, signature = self.bad[index]
                    if self.listing.signature(index) == signature:
                        raise ImageError(reason)
                    del self.bad[index]  # replaced or gone since it failed: read it again, as torchvision would
                data, (height, width) = self.listing.read_sized(index)
                ops = sample_geometry(self.plan, height, width, {k: v[row] for k, v in sample_draws.items()})
            except ImageError as exc:  # unreadable, or no geometry fits it (too thin for a max_size resize)
                if self.spec.loader.on_error == "raise":
                    # Raised when the consumer reaches this batch, not now: DALI prefetches, and the
                    # batches before this one must still be yielded (as on the torchvision backend).
                    error = SampleError(index, path, str(exc))
                    encoded, geometry, kept = [], [], []
                    break
                skipped.append(SkippedSample(index, path, task.epoch, str(exc)))
                continue
            encoded.append(np.frombuffer(data, dtype=np.uint8))
            geometry.append(ops)
            sizes.append((height, width))
            kept.append(row)
        meta = {"task": task, "rows": kept, "skipped": skipped, "placeholder": not kept, "error": error}
        if not kept:  # DALI cannot run an empty batch: feed one placeholder and drop its output
            if self._placeholder is None:
                self._placeholder = _placeholder_jpeg()
            encoded = [np.frombuffer(self._placeholder, dtype=np.uint8)]
            geometry = [sample_geometry(self.plan, 8, 8, {k: v[0] for k, v in sample_draws.items()})]
            sizes = [(8, 8)]
        return [encoded] + _geometry_columns(geometry, sizes, self.resize_methods), meta


def _geometry_columns(per_sample: list[list], sizes: list[tuple[int, int]],
                      methods: dict[int, str]) -> list[np.ndarray | list[np.ndarray]]:
    """Per-sample op lists → one input column per DALI argument, in graph order.

    ``sizes`` are the samples' decoded (height, width): a resize's arguments depend on its input
    size; ``methods`` the :func:`resize_methods` of the plan. A column whose samples all have one
    shape is a single array with the batch as its first axis: DALI's external source converts it
    once, where a list costs a conversion per sample on the feeding thread.
    """
    columns: list[np.ndarray | list[np.ndarray]] = []
    current = list(sizes)
    for position in range(len(per_sample[0])):
        ops = [sample[position] for sample in per_sample]
        if isinstance(ops[0], Crop):
            columns.append(np.array([(op.top, op.left) for op in ops], dtype=np.int32))
            columns.append(np.array([(op.height, op.width) for op in ops], dtype=np.int32))
        elif isinstance(ops[0], Resize):
            if methods[position] in ("linear", "antialias", "border_patch"):
                out_hw = np.array([(op.height, op.width) for op in ops], dtype=np.float32)
                columns.append(out_hw)  # the plain resize's only argument
                if methods[position] == "border_patch":
                    columns.extend(border_columns(np.array(current), out_hw))
            else:
                per_op = [resize_arguments(methods[position], size, (op.height, op.width))
                          for op, size in zip(ops, current)]
                columns.extend(_batched(list(column)) for column in zip(*per_op))
        elif isinstance(ops[0], Flip):
            columns.append(np.array([op.apply for op in ops], dtype=np.int32))
        if isinstance(ops[0], (Crop, Resize)):
            current = [(op.height, op.width) for op in ops]
    return columns


def _batched(arrays: list[np.ndarray]) -> np.ndarray | list[np.ndarray]:
    """One array (batch first) when every sample's array has the same shape, else the list."""
    shape = arrays[0].shape
    return np.stack(arrays) if all(array.shape == shape for array in arrays) else arrays


# --------------------------------------------------------------------------------------------
# torchvision-exact resizing
#
# The torchvision backend resizes uint8 images with F.resize, whose sampling differs from a plain
# DALI fn.resize in three ways, each measured on the sample images (see tests/test_equivalence.py):
#   * nearest: torchvision takes source pixel floor(x * in/out) (PyTorch's legacy "nearest"); DALI
#     samples pixel centres, floor((x + 0.5) * in/out): up to 192 levels apart. Shifting DALI's
#     region of interest by half an output pixel gives torchvision's grid; where x * in/out is an
#     exact integer PyTorch's float32 product falls on either side of it, so two shifted resizes
#     are blended with a per-line 0/1 mask (see _nearest_pass).
#   * antialias=True (bilinear, bicubic): torchvision (like PIL) truncates the filter at the image
#     border and renormalises the remaining weights; DALI clamps coordinates (repeats the edge).
#     Up to 11 levels apart in the border rows. Reproduced as num / den: the image pasted on a
#     zeroed canvas with margins wider than the filter (fn.multi_paste) and resized with its region
#     of interest on the real pixels (num), divided by the same resize of 1-D masks of ones
#     padded with zeros (den: the filter weight falling on the image, per output row/column).
#     Where the resize is the last geometry step at a fixed size (``border_patch``), only the
#     outermost output lines differ from a plain resize, so only they go that way, from edge
#     strips, with den in closed form (image_weight); torch writes them over the batch.
#   * bicubic with antialias=True: torchvision resizes width, then height, clamping the
#     intermediate to [0, 255]; the cubic filter's overshoot makes a single 2-D pass up to 5
#     levels off at strong edges. Done as two passes with the same clamp (kept in float, so
#     one rounding, at the end).
# bilinear with antialias=False matches plain fn.resize (measured max |Δ| 1 level). bicubic with
# antialias=False cannot match: torchvision's non-antialiased bicubic is Keys' cubic with
# a = -0.75, DALI's cubic filter has a = -0.5 (up to 11 levels apart anywhere in the image), so the
# op registry offers that combination on torchvision only (ops.unsupported_options).

def resize_methods(plan: Plan) -> dict[int, str]:
    """Position in the geometry template of each resize → its :func:`~dali_bridge.plan.resize_method`
    (from :func:`~dali_bridge.plan.resize_methods`, which placement() describes)."""
    by_step = plan_resize_methods(plan)
    positions = [n for n, step in enumerate(plan.steps) for _ in range(2 if step.kind == "random_resized_crop" else 1)]
    return {position: by_step[step] for position, ((name, _), step) in
            enumerate(zip(_geometry_template(plan), positions)) if name == "Resize"}


def _nearest_pass(in_hw: tuple[int, int], out_hw: tuple[int, int], axis: int) -> list[np.ndarray]:
    """Arguments of one nearest-neighbour pass along ``axis`` (0 = height, 1 = width).

    PyTorch picks ``floor(float32(x) * float32(in / out))``. DALI samples ``start + (x + 0.5) *
    scale``: start = -scale/2 gives the exact ``x * in / out``, whose fractional parts are
    multiples of 1/out, so shifting by +0.5/out ("up") picks ``floor(x * in / out)`` with half a
    grid step of margin, and -0.5/out ("down") picks one pixel lower exactly where ``x * in / out``
    is an integer. PyTorch's float32 product lands on either side of those integers (it depends on
    the rounding of each product), so both are resized and a 0/1 mask per output line selects the
    one PyTorch takes. Order: output size, up roi start, up roi end, down roi start, down roi end,
    up mask, down mask (uint8).
    """
    n_in, n_out = in_hw[axis], out_hw[axis]
    x = np.arange(n_out, dtype=np.int64)
    torch_index = np.minimum(np.floor(x.astype(np.float32) * (np.float32(n_in) / np.float32(n_out))),
                             n_in - 1).astype(np.int64)
    down = np.maximum((x * n_in - 1) // n_out, 0)
    use_down = (torch_index == down) & (torch_index != np.minimum(x * n_in // n_out, n_in - 1))
    scale = n_in / n_out
    size = list(in_hw)
    size[axis] = n_out
    args = [np.array(size, dtype=np.float32)]
    for shift in (0.5 / n_out, -0.5 / n_out):
        start, end = [0.0, 0.0], [float(in_hw[0]), float(in_hw[1])]
        start[axis] = -0.5 * scale + shift
        end[axis] = start[axis] + n_in
        args += [np.array(start, dtype=np.float32), np.array(end, dtype=np.float32)]
    shape = (n_out, 1, 1) if axis == 0 else (1, n_out, 1)
    args += [(~use_down).astype(np.uint8).reshape(shape), use_down.astype(np.uint8).reshape(shape)]
    return args


def _filter_margin(interpolation: str, in_size: int, out_size: int) -> int:
    """Zero padding (source pixels) wider than the filter's reach: radius 1 (bilinear) or 2
    (bicubic) output pixels when downscaling, source pixels when upscaling, plus a margin."""
    reach = (1.0 if interpolation == "bilinear" else 2.0) * max(in_size / out_size, 1.0)
    return int(np.ceil(reach)) + 2


def _filter_pass(interpolation: str, in_hw: tuple[int, int], out_hw: tuple[int, int],
                 axes: tuple[int, ...]) -> list[np.ndarray]:
    """Arguments of one renormalised resize pass along ``axes`` (0 = height, 1 = width).

    Order: output size, paste anchor (the zero margins), padded size, roi start, roi end, then per
    axis: weight mask (ones on the image, zeros on the margins), its output size, roi start, roi end.
    """
    margin = [(_filter_margin(interpolation, in_hw[a], out_hw[a]) if a in axes else 0) for a in (0, 1)]
    args = [np.array(out_hw, dtype=np.float32),
            np.array([margin], dtype=np.int32),
            np.array([in_hw[0] + 2 * margin[0], in_hw[1] + 2 * margin[1]], dtype=np.int32),
            np.array(margin, dtype=np.float32),
            np.array([margin[0] + in_hw[0], margin[1] + in_hw[1]], dtype=np.float32)]
    for axis in axes:
        length = in_hw[axis] + 2 * margin[axis]
        mask = np.zeros(length, dtype=np.float32)
        mask[margin[axis]:margin[axis] + in_hw[axis]] = 1.0
        if axis == 0:
            args += [mask.reshape(length, 1, 1), np.array([out_hw[0], 1], dtype=np.float32),
                     np.array([margin[0], 0], dtype=np.float32), np.array([margin[0] + in_hw[0], 1], dtype=np.float32)]
        else:
            args += [mask.reshape(1, length, 1), np.array([1, out_hw[1]], dtype=np.float32),
                     np.array([0, margin[1]], dtype=np.float32), np.array([1, margin[1] + in_hw[1]], dtype=np.float32)]
    return args


def image_weight(in_size: np.ndarray, out_size: int) -> np.ndarray:
    """[N, out_size]: the share of each output line's bilinear antialiasing filter that falls on the
    image, resizing ``in_size`` (per sample) source pixels to ``out_size`` (1 off the border).

    DALI's filter, in closed form: a triangle of radius max(scale, 1) source pixels centred at
    (x + 0.5) * scale, sampled at pixel centres (equals fn.resize of a 0/1 mask within 1e-4: tested).
    Dividing a zero-padded resize by it gives torchvision's truncated, renormalised filter.
    """
    scale = in_size.astype(np.float64) / out_size
    radius = np.maximum(scale, 1.0)
    # Lines per end whose filter can reach past the image: 1 when downscaling, ~1/scale upscaling.
    edge = int(min(out_size, np.ceil((radius / scale).max()) + 1))
    lines = np.unique(np.concatenate([np.arange(edge), np.arange(out_size - edge, out_size)]))
    centre = (lines[None, :] + 0.5) * scale[:, None]
    taps = np.floor(centre - radius[:, None])[..., None] + np.arange(int(np.ceil(2 * radius.max())) + 3)
    weight = np.clip(1 - np.abs(taps + 0.5 - centre[..., None]) / radius[:, None, None], 0, None)
    inside = (taps >= 0) & (taps < in_size[:, None, None])
    share = np.ones((len(in_size), out_size))
    share[:, lines] = (weight * inside).sum(-1) / weight.sum(-1)
    return share


def border_columns(in_hw: np.ndarray, out_hw: np.ndarray) -> list[np.ndarray]:
    """Argument columns (batch first) of the exact outermost output rows and columns of bilinear
    antialiased resizes from ``in_hw`` ([N, 2] (height, width) pixels) to one ``out_hw`` size.

    Only output lines whose filter reaches past the image differ from a plain fn.resize: the first
    and last row and column when downscaling (none when upscaling, computed anyway). Each comes
    from a strip of the image along its edge, pasted beside a zero margin wider than the filter
    and resized with its region of interest mapping the strip's edge exactly as the full resize
    maps the image's, then divided by :func:`image_weight`; the left and right strips give the
    rows between the first and last. Columns: the strips' shapes ([N, 1, 2] int32), canvas sizes
    ([N, 2] int32) and output sizes (float32) — rows, then columns; per strip the paste source
    anchor and canvas anchor (where not 0, 0) and the roi start and end; then the weights of the
    two rows ([N, 2, W, 1]) and of the two columns ([N, 1, 2, 1]). Vectorised: this runs per
    batch on the thread that feeds DALI.
    """
    n_h, n_w = (in_hw[:, axis].astype(np.int64) for axis in (0, 1))
    (m_h, m_w), = {(int(h), int(w)) for h, w in np.asarray(out_hw)}  # one output size per batch
    s_h, s_w = n_h / m_h, n_w / m_w
    # The first output line's filter (centre 0.5 s, radius r = max(s, 1)) reaches r - 0.5 s source
    # pixels past the edge (the zero margin) and 0.5 s + r into the image (the strip), a pixel of
    # slack on each. Only edge lines are computed here, so the strips stay that thin: DALI's CPU
    # resize and paste cost grows with their area.
    (margin_h, k_h), (margin_w, k_w) = (
        (np.ceil(np.maximum(s, 1.0) - 0.5 * s + 0.5).astype(np.int64) + 1,
         np.minimum(n, np.ceil(0.5 * s + np.maximum(s, 1.0) - 0.5).astype(np.int64) + 1))
        for s, n in ((s_h, n_h), (s_w, n_w)))
    zero = np.zeros_like(n_h)

    def sizes(first, second, dtype=np.int32) -> np.ndarray:  # [N, 2]
        return np.stack(np.broadcast_arrays(first, second, zero)[:2], axis=1).astype(dtype)

    def pairs(first, second) -> np.ndarray:  # [N, 1, 2] int32: one paste region per sample
        return sizes(first, second)[:, None, :]

    across, down = image_weight(n_w, m_w), image_weight(n_h, m_h)
    row_weights = np.stack([down[:, :1] * across, down[:, -1:] * across], axis=1)
    column_weights = np.stack([across[:, 0], across[:, -1]], axis=1)
    return [pairs(k_h, n_w), sizes(k_h + margin_h, n_w + 2 * margin_w), sizes(1, m_w, np.float32),
            pairs(n_h, k_w), sizes(n_h, k_w + margin_w), sizes(m_h - 2, 1, np.float32),
            # top: pasted at the margins; bottom: its last rows, margin below; left; right: its last columns
            pairs(margin_h, margin_w), sizes(margin_h, margin_w, np.float32),
            sizes(margin_h + s_h, margin_w + n_w, np.float32),
            pairs(n_h - k_h, zero), pairs(zero, margin_w), sizes(k_h - s_h, margin_w, np.float32),
            sizes(k_h, margin_w + n_w, np.float32),
            pairs(zero, margin_w), sizes(s_h, margin_w, np.float32), sizes(n_h - s_h, margin_w + s_w, np.float32),
            pairs(zero, n_w - k_w), sizes(s_h, k_w - s_w, np.float32), sizes(n_h - s_h, k_w, np.float32),
            row_weights.astype(np.float32)[..., None], column_weights.astype(np.float32)[:, None, :, None]]


def resize_arguments(method: str, in_hw: tuple[int, int], out_hw: tuple[int, int]) -> list[np.ndarray]:
    """The per-sample DALI arguments of one resize from ``in_hw`` to ``out_hw`` (pixels), in graph order."""
    if method in ("linear", "antialias"):
        return [np.array(out_hw, dtype=np.float32)]
    if method == "nearest":  # width, then height as the width of the transposed image (see resize_graph)
        return (_nearest_pass(in_hw, (in_hw[0], out_hw[1]), 1)
                + _nearest_pass((out_hw[1], in_hw[0]), (out_hw[1], out_hw[0]), 1))
    if method == "filter_1pass":
        return _filter_pass("bilinear", in_hw, out_hw, (0, 1))
    if method == "border_patch":  # the feeder builds these per batch (_geometry_columns)
        return [np.array(out_hw, dtype=np.float32)] + [column[0] for column in
                                                        border_columns(np.array([in_hw]), np.array([out_hw]))]
    if method == "filter_2pass":  # width first, as torchvision
        middle = (in_hw[0], out_hw[1])
        return _filter_pass("bicubic", in_hw, middle, (1,)) + _filter_pass("bicubic", middle, out_hw, (0,))
    raise ValueError(f"unknown resize method {method!r}")


def resize_column_types(method: str, types: Any) -> list:
    """DALI dtypes of :func:`resize_arguments`' columns."""
    nearest_pass = [types.FLOAT] * 5 + [types.UINT8] * 2

    def filter_pass(axes: int) -> list:
        return [types.FLOAT, types.INT32, types.INT32, types.FLOAT, types.FLOAT] + [types.FLOAT] * 4 * axes

    shapes = [types.INT32, types.INT32, types.FLOAT]
    anchored, two_anchors = [types.INT32] + [types.FLOAT] * 2, [types.INT32] * 2 + [types.FLOAT] * 2
    edges = anchored + two_anchors + anchored + anchored  # top, bottom, left, right: see border_columns
    return {"linear": [types.FLOAT], "antialias": [types.FLOAT], "nearest": nearest_pass * 2,
            "filter_1pass": filter_pass(2),
            "border_patch": [types.FLOAT] + shapes * 2 + edges + [types.FLOAT] * 2,
            "filter_2pass": filter_pass(1) * 2}[method]


def resize_graph(images: Any, columns: list, method: str, interpolation: str, device: str) -> Any:
    """Add the resize to the graph, consuming its argument columns from the front of ``columns``."""
    from nvidia.dali import fn, math, types

    interp = getattr(types, _INTERP[interpolation])
    if method in ("linear", "antialias"):
        return fn.resize(images, size=columns.pop(0), interp_type=interp, antialias=method == "antialias",
                         device=device)
    if method == "border_patch":  # (image, [border rows, border columns]): see border_columns
        image = fn.resize(images, size=columns.pop(0), interp_type=interp, antialias=True, device=device)
        hwc = fn.reshape(images, layout="HWC")
        row_shape, row_canvas, row_size, col_shape, col_canvas, col_size = (columns.pop(0) for _ in range(6))
        strips = []
        for edge in ("top", "bottom", "left", "right"):
            anchors = {}  # multi_paste's anchors default to 0, 0
            if edge in ("bottom", "right"):
                anchors["in_anchors"] = columns.pop(0)
            if edge != "right":
                anchors["out_anchors"] = columns.pop(0)
            shape, canvas, size = (row_shape, row_canvas, row_size) if edge in ("top", "bottom") else \
                (col_shape, col_canvas, col_size)
            pasted = fn.multi_paste(hwc, shapes=shape, output_size=canvas, device=device, **anchors)
            strips.append(fn.resize(pasted, size=size, roi_start=columns.pop(0), roi_end=columns.pop(0),
                                    roi_relative=False, interp_type=interp, antialias=True, dtype=types.FLOAT,
                                    device=device))
        row_weights, column_weights = (columns.pop(0) for _ in range(2))
        if device == "gpu":
            row_weights, column_weights = row_weights.gpu(), column_weights.gpu()
        rows = fn.cat(strips[0], strips[1], axis=0, device=device) / row_weights
        cols = fn.cat(strips[2], strips[3], axis=1, device=device) / column_weights
        return image, [fn.cast(line, dtype=types.UINT8, device=device) for line in (rows, cols)]
    if method == "nearest":
        # Both passes run along the width: DALI's CPU resize steps through rows accumulating the
        # source position in float32 (measured 0.003 pixel off after 168 rows of 2372 → 224), more
        # than the half-grid-step margin, while columns are computed exactly. So the height pass
        # runs on the transposed image.
        for transposed in (False, True):
            if transposed:
                images = fn.transpose(images, perm=[1, 0, 2], transpose_layout=False, device=device)
            size, up_start, up_end, down_start, down_end, up_mask, down_mask = (columns.pop(0) for _ in range(7))
            if device == "gpu":
                up_mask, down_mask = up_mask.gpu(), down_mask.gpu()
            up, down = (fn.resize(images, size=size, roi_start=start, roi_end=end, roi_relative=False,
                                  interp_type=interp, antialias=False, device=device)
                        for start, end in ((up_start, up_end), (down_start, down_end)))
            images = up * up_mask + down * down_mask  # uint8; exactly one mask is 1 on each output column
        return fn.transpose(images, perm=[1, 0, 2], transpose_layout=False, device=device)

    def renormalised(images: Any, axes: int) -> Any:
        # Zero margins via multi_paste: a fresh zeroed canvas, ~6x faster than fn.slice's padding on the CPU.
        size, anchor, canvas, start, end = (columns.pop(0) for _ in range(5))
        padded = fn.multi_paste(fn.reshape(images, layout="HWC"), out_anchors=anchor, output_size=canvas,
                                device=device)
        out = fn.resize(padded, size=size, roi_start=start, roi_end=end, roi_relative=False, interp_type=interp,
                        antialias=True, dtype=types.FLOAT, device=device)
        weight = None
        for _ in range(axes):
            mask, mask_size, mask_start, mask_end = (columns.pop(0) for _ in range(4))
            line = fn.resize(mask.gpu() if device == "gpu" else mask, size=mask_size, roi_start=mask_start,
                             roi_end=mask_end, roi_relative=False, interp_type=interp, antialias=True,
                             dtype=types.FLOAT, device=device)
            weight = line if weight is None else weight * line
        return out / weight  # broadcast: the in-image weight sum of each output row and column

    if method == "filter_1pass":
        out = renormalised(images, 2)
    elif method == "filter_2pass":
        out = math.clamp(renormalised(images, 1), 0.0, 255.0)  # torchvision clamps between the passes
        out = renormalised(out, 1)
    else:
        raise ValueError(f"unknown resize method {method!r}")
    return fn.cast(out, dtype=types.UINT8, device=device)  # rounds to nearest, saturates


def _geometry_template(plan: Plan) -> list[tuple[str, Any]]:
    """The shape of every sample's geometry list, from a probe image (it never depends on the sample)."""
    zero_draws = {pos: np.zeros(32) for pos in range(len(plan.steps))}
    return [(type(op).__name__, op) for op in sample_geometry(plan, 64, 64, zero_draws)]


def build_pipeline(spec: PipelineSpec, plan: Plan, feeder: _Feeder, *, gpu: bool, device_id: int | None,
                   threads: int):
    """Compile the plan into a DALI pipeline (stage devices from ``placement``)."""
    from nvidia.dali import fn, pipeline_def, types

    stages = {stage.stage: stage for stage in placement(plan, "dali" if gpu else "dali-cpu")}
    op_device = "gpu" if gpu else "cpu"
    template = _geometry_template(plan)
    steps = [step for step in plan.steps for _ in range(2 if step.kind == "random_resized_crop" else 1)]
    methods = resize_methods(plan)
    column_types = [types.UINT8]
    for n, (name, op) in enumerate(template):
        if name == "Resize":
            column_types += resize_column_types(methods[n], types)
        else:
            column_types += {"Crop": [types.INT32, types.INT32], "Flip": [types.INT32]}[name]

    @pipeline_def(batch_size=spec.batch_size, num_threads=threads, device_id=device_id,
                  prefetch_queue_depth=spec.loader.prefetch, py_start_method="spawn",
                  exec_dynamic=True)  # outputs stay valid after the next run: zero-copy DLPack
    def graph():
        columns = list(fn.external_source(source=feeder, num_outputs=len(column_types), dtype=column_types,
                                          batch=True, no_copy=False))
        encoded = columns.pop(0)
        decode = stages["decode"]
        decoder_args: dict[str, Any] = dict(device=decode.device, output_type=types.RGB)
        if decode.device == "mixed":
            # libjpeg-turbo-compatible chroma upsampling (DALI's default differs); memory hints as NVIDIA's RN50.
            decoder_args.update(jpeg_fancy_upsampling=True, hw_decoder_load=0.65,
                                device_memory_padding=211025920, host_memory_padding=140544512)
        first = 0
        if roi_decode(plan):
            anchor, shape = columns.pop(0), columns.pop(0)
            images = fn.decoders.image_slice(encoded, anchor, shape, axis_names="HW", normalized_anchor=False,
                                             normalized_shape=False, **decoder_args)
            first = 1
        else:
            images = fn.decoders.image(encoded, **decoder_args)
        if gpu and decode.device == "cpu":
            images = images.gpu()
        mirror, border = None, []
        for n, ((name, _), step) in enumerate(zip(template, steps)):
            if n < first:
                continue
            if name == "Crop":
                anchor, shape = columns.pop(0), columns.pop(0)
                images = fn.slice(images, anchor, shape, axis_names="HW", normalized_anchor=False,
                                  normalized_shape=False, out_of_bounds_policy="pad", fill_values=0,
                                  device=op_device)
            elif name == "Resize":
                interpolation = step.params["interpolation"]
                images = resize_graph(images, columns, methods[n], interpolation, op_device)
                if methods[n] == "border_patch":  # the last geometry step: its border lines finish alike
                    images, border = images
            elif name == "Flip":
                flip = columns.pop(0)
                if n == len(template) - 1 and fused_mirror(plan):
                    mirror = flip
                else:
                    images = fn.flip(images, horizontal=flip, device=op_device)
        finish = plan.finish
        cmn_args: dict[str, Any] = dict(dtype=getattr(types, _DTYPES[finish.dtype]), output_layout=finish.layout,
                                        device=op_device)
        if finish.dtype != "uint8":  # float outputs are pixel/255 even with the default mean 0, std 1
            cmn_args.update(mean=[m * 255.0 for m in finish.mean], std=[s * 255.0 for s in finish.std])
        if mirror is not None:
            cmn_args["mirror"] = mirror
        return tuple(fn.crop_mirror_normalize(out, **cmn_args) for out in [images] + border)

    pipe = graph()
    pipe.build()
    _LIVE_PIPELINES.add(pipe)
    return pipe


class DaliExecutor:
    """Runs tasks through a DALI pipeline built once (rebuilt only after a failed batch)."""

    def __init__(self, spec: PipelineSpec, listing: Listing, plan: Plan, *, gpu: bool, topology: Topology,
                 device: str | torch.device | None = None):
        self.spec, self.listing, self.plan, self.gpu = spec, listing, plan, gpu
        # workers: 0 means "in the calling process" on torchvision; DALI always needs a thread.
        self.threads = default_workers() if spec.loader.workers is None else max(1, spec.loader.workers)
        self.device_id = topology.local_rank if gpu else None
        if gpu:
            self.device = torch.device(device) if device is not None else torch.device("cuda", self.device_id)
        else:
            self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.feeder = _Feeder(spec, listing, plan)
        self.pipe = None
        self._open_runs = 0

    def _pipeline(self):
        if self.pipe is None:
            self.pipe = build_pipeline(self.spec, self.plan, self.feeder, gpu=self.gpu,
                                       device_id=self.device_id, threads=self.threads)
        return self.pipe

    def run(self, tasks: list[BatchTask]) -> Iterator[RawBatch]:
        position = 0
        while position < len(tasks):
            pipe = self._pipeline()
            self.feeder.start(tasks[position:])
            try:
                for _ in range(len(tasks) - position):
                    try:
                        images, *border = pipe.run()
                    except StopIteration:  # the feeder ended early: should not happen
                        raise RuntimeError("DALI pipeline ended before the epoch's batches were produced") from None
                    meta = self.feeder.pending.popleft()
                    if meta["error"] is not None:
                        raise meta["error"]
                    position += 1
                    yield self._convert(images, meta, border)
            except (SampleError, GeneratorExit):
                self._discard()
                raise
            except Exception as exc:
                # DALI fails a whole batch for one undecodable sample: find it, then raise or skip it.
                task = tasks[position]
                self._discard()
                culprits = self._find_culprits(task)
                if not culprits:
                    raise RuntimeError(f"DALI failed on epoch {task.epoch} batch {task.number} (samples "
                                       f"{task.indices.tolist()}), yet each of them reads and decodes on its "
                                       f"own: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc!r}") from exc
                index, reason = culprits[0]
                if self.spec.loader.on_error == "raise":
                    raise SampleError(index, self.listing.paths[index], reason) from exc
                self.feeder.bad.update((index, (reason, self.listing.signature(index))) for index, reason in culprits)
                continue
            else:
                self._end_epoch()

    def _convert(self, images, meta: dict[str, Any], border: list) -> RawBatch:
        task: BatchTask = meta["task"]
        rows = meta["rows"]
        if meta["placeholder"]:
            tensor = torch.empty((0,) + tuple(self.plan.output_shape(0)[1:]), dtype=_torch_dtype(self.plan.finish.dtype))
        else:
            # The dynamic executor never reuses a returned buffer, so DLPack hands it to torch without a copy.
            tensor = torch.from_dlpack(images.as_tensor())
            if border:
                write_border(tensor, *(torch.from_dlpack(lines.as_tensor()) for lines in border),
                             self.plan.finish.layout)
        if tensor.device != self.device:
            tensor = tensor.to(self.device, non_blocking=True)
        return RawBatch(tensor, task.indices[rows], task.valid[rows], meta["skipped"])

    def _end_epoch(self) -> None:
        """Consume DALI's end-of-epoch signal and rewind for the next run."""
        self.feeder.stop()
        try:
            while True:
                self.pipe.run()
                self.feeder.pending.popleft()
        except StopIteration:
            pass
        self.pipe.reset()

    def _discard(self) -> None:
        """Throw the pipeline away after an error or an early exit (prefetched batches included)."""
        self.feeder.stop()
        pipe, self.pipe = self.pipe, None
        del pipe

    def _find_culprits(self, task: BatchTask) -> list[tuple[int, str]]:
        found = []
        for index in task.indices.tolist():
            try:
                decode_rgb(self.listing.read(index))
            except ImageError as exc:
                found.append((index, str(exc)))
        return found

    def close(self) -> None:
        self._discard()


def write_border(images: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, layout: str) -> None:
    """Write a ``border_patch`` resize's exact outermost lines over the batch, in place.

    ``rows``: the first and last row of each image ([N, C, 2, W] for CHW, [N, 2, W, C] for HWC);
    ``cols``: the first and last column of the rows in between ([N, C, H-2, 2] / [N, H-2, 2, C]).
    Both went through the same crop_mirror_normalize as the images, flip included.
    """
    if layout == "HWC":  # as CHW with the channel axis moved: views, no copies
        images, rows, cols = (t.permute(0, 3, 1, 2) for t in (images, rows, cols))
    height, width = images.shape[-2:]
    # One strided pass each (first and last together): the column writes touch every row of the
    # batch, so both ends of a row are written while its memory is at hand.
    images[:, :, ::height - 1, :] = rows
    images[:, :, 1:-1, ::width - 1] = cols


def _torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float16": torch.float16, "uint8": torch.uint8}[name]
