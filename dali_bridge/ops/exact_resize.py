"""The torchvision-exact resize on DALI: one class per method, each owning its argument columns
(declared by name), how it builds them, its graph and the stages it lists.

:attr:`dali_bridge.backends.dali.plan.DaliPlan.resize_methods` chooses the method of each resizing step; the resizing
ops (``random_resized_crop``, ``resize``) hand their arguments and graph to :data:`METHODS`.
Arguments are pure numpy, built on the thread that feeds DALI; DALI is imported only inside
:meth:`ResizeMethod.graph`.

The torchvision backend resizes uint8 images with F.resize, whose sampling differs from a plain
DALI fn.resize in three ways, each measured on the sample images (see tests/backends/test_equivalence.py):
  * nearest: torchvision takes source pixel floor(x * in/out) (PyTorch's legacy "nearest"); DALI
    samples pixel centres, floor((x + 0.5) * in/out): up to 192 levels apart. Shifting DALI's
    region of interest by half an output pixel gives torchvision's grid; where x * in/out is an
    exact integer PyTorch's float32 product falls on either side of it, so two shifted resizes
    are blended with a per-line 0/1 mask (:class:`Nearest`).
  * antialias=True (bilinear, bicubic): torchvision (like PIL) truncates the filter at the image
    border and renormalises the remaining weights; DALI clamps coordinates (repeats the edge).
    Up to 11 levels apart in the border rows. Reproduced as num / den: the image pasted on a
    zeroed canvas with margins wider than the filter (fn.multi_paste) and resized with its region
    of interest on the real pixels (num), divided by the same resize of 1-D masks of ones
    padded with zeros (den: the filter weight falling on the image, per output row/column).
    Where the resize is the last geometry step at a fixed size (``border_patch``), only the
    outermost output lines differ from a plain resize, so only they go that way, from edge
    strips, with den in closed form (image_weight); torch writes them over the batch.
  * bicubic with antialias=True: torchvision resizes width, then height, clamping the
    intermediate to [0, 255]; the cubic filter's overshoot makes a single 2-D pass up to 5
    levels off at strong edges. Done as two passes with the same clamp (kept in float, so
    one rounding, at the end).
A random resized crop's ``interpolation: random`` (bilinear or bicubic per sample) takes the
bicubic method, two renormalised passes, with DALI's filter per sample (:func:`per_sample_filter`):
separable like the one 2-D pass, a bilinear sample gives the same pixels that way.
bilinear with antialias=False matches plain fn.resize (measured max |Δ| 1 level). bicubic with
antialias=False cannot match: torchvision's non-antialiased bicubic is Keys' cubic with
a = -0.75, DALI's cubic filter has a = -0.5 (up to 11 levels apart anywhere in the image), so the
op registry offers that combination on torchvision only (``Resize.unsupported_options``).
"""
from __future__ import annotations

from typing import Any, ClassVar, Mapping, Sequence

import numpy as np

from .dali_op import Column

_INTERP = {"nearest": "INTERP_NN", "bilinear": "INTERP_LINEAR", "bicubic": "INTERP_CUBIC"}
Stage = tuple[str, str]  # (stage name suffix, implementation)


def interp_type(interpolation: Any) -> Any:
    """DALI's filter argument: a filter's name (``nearest``, ``bilinear``, ``bicubic``) as DALI's enum,
    or a per-sample filter node (:func:`per_sample_filter`) as it is."""
    from nvidia.dali import types

    return getattr(types, _INTERP[interpolation]) if isinstance(interpolation, str) else interpolation


def per_sample_filter(bicubic: Any) -> Any:
    """A per-sample filter node for DALI's resize from a 0/1 int32 node (1: bicubic, 0: bilinear): a
    resize takes its ``interp_type`` per sample, so one graph serves both filters."""
    from nvidia.dali import fn, types

    linear, cubic = int(types.INTERP_LINEAR), int(types.INTERP_CUBIC)
    return fn.cast(bicubic * (cubic - linear) + linear, dtype=types.INTERP_TYPE)


def _batched(arrays: list[np.ndarray]) -> np.ndarray | list[np.ndarray]:
    """One array (batch first) when every sample's array has the same shape, else the list: DALI's
    external source converts an array once, where a list costs a conversion per sample."""
    shape = arrays[0].shape
    return np.stack(arrays) if all(array.shape == shape for array in arrays) else arrays


def _per_sample(build: Any, in_hw: Sequence[tuple[int, int]], out_hw: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """Columns of per-sample argument dicts ``build(in, out)``, batched by name."""
    per_sample = [build(tuple(i), tuple(o)) for i, o in zip(in_hw, out_hw)]
    return {name: _batched([sample[name] for sample in per_sample]) for name in per_sample[0]}


class ResizeMethod:
    """One way of resizing uint8 images on DALI. ``graph`` returns the resized images and the side
    outputs the finish must treat as images too (a border patch's edge lines)."""
    name: ClassVar[str]

    def columns(self) -> list[Column]:
        raise NotImplementedError

    def arguments(self, in_hw: Sequence[tuple[int, int]], out_hw: Sequence[tuple[int, int]]) -> dict[str, Any]:
        """The batch's argument columns by name, resizing ``in_hw[k]`` to ``out_hw[k]`` pixels."""
        raise NotImplementedError

    def graph(self, images: Any, columns: Mapping[str, Any], interpolation: Any, device: str) -> tuple[Any, list]:
        """``interpolation``: a filter's name, or a per-sample filter node (:func:`per_sample_filter`)."""
        raise NotImplementedError

    def stages(self) -> list[Stage]:
        """(stage suffix, implementation) of each DALI operator :meth:`graph` adds, in graph order."""
        raise NotImplementedError

    def finish_stages(self, torch_device: str) -> list[tuple[str, str, str]]:
        """(stage, implementation, device) added after the finish: none but for a border patch."""
        return []


_SIZE = Column("size", "float32", (2,))


class Plain(ResizeMethod):
    """One fn.resize: ``linear`` (bilinear without antialias: equals F.resize) or ``antialias``
    (DALI's border handling, chosen where a crop hides the border or under ``parity: fast``)."""

    def __init__(self, name: str, antialias: bool):
        self.name, self.antialias = name, antialias

    def columns(self) -> list[Column]:
        return [_SIZE]

    def arguments(self, in_hw, out_hw) -> dict[str, Any]:
        return {"size": np.array(out_hw, dtype=np.float32).reshape(-1, 2)}

    def graph(self, images, columns, interpolation, device):
        from nvidia.dali import fn

        return fn.resize(images, size=columns["size"], interp_type=interp_type(interpolation),
                         antialias=self.antialias, device=device), []

    def stages(self) -> list[Stage]:
        return [("", "fn.resize (antialias, DALI border handling)" if self.antialias else "fn.resize (no antialias)")]


# ---- nearest

_NEAREST_NAMES = ("size", "up_start", "up_end", "down_start", "down_end", "up_mask", "down_mask")


def _nearest_pass(in_hw: tuple[int, int], out_hw: tuple[int, int], axis: int) -> dict[str, np.ndarray]:
    """Arguments of one nearest-neighbour pass along ``axis`` (0 = height, 1 = width).

    PyTorch picks ``floor(float32(x) * float32(in / out))``. DALI samples ``start + (x + 0.5) *
    scale``: start = -scale/2 gives the exact ``x * in / out``, whose fractional parts are
    multiples of 1/out, so shifting by +0.5/out ("up") picks ``floor(x * in / out)`` with half a
    grid step of margin, and -0.5/out ("down") picks one pixel lower exactly where ``x * in / out``
    is an integer. PyTorch's float32 product lands on either side of those integers (it depends on
    the rounding of each product), so both are resized and a 0/1 mask per output line selects the
    one PyTorch takes: output size, up/down roi start and end, up/down mask (uint8).
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
    return dict(zip(_NEAREST_NAMES, args))


class Nearest(ResizeMethod):
    """Two half-step-shifted resizes per axis blended by PyTorch's per-line choice; the height pass
    runs as the width of the transposed image. torchvision ignores antialias for nearest."""
    name = "nearest"
    _PASSES = ("width", "height")

    def columns(self) -> list[Column]:
        shapes = {"up_mask": (1, None, 1), "down_mask": (1, None, 1)}
        return [Column(f"{p}.{n}", "uint8" if n in shapes else "float32", shapes.get(n, (2,)))
                for p in self._PASSES for n in _NEAREST_NAMES]

    def arguments(self, in_hw, out_hw) -> dict[str, Any]:
        def build(i: tuple[int, int], o: tuple[int, int]) -> dict[str, np.ndarray]:
            width = _nearest_pass(i, (i[0], o[1]), 1)
            height = _nearest_pass((o[1], i[0]), (o[1], o[0]), 1)
            return {f"{p}.{n}": v for p, args in zip(self._PASSES, (width, height)) for n, v in args.items()}
        return _per_sample(build, in_hw, out_hw)

    def graph(self, images, columns, interpolation, device):
        from nvidia.dali import fn

        interp = interp_type(interpolation)
        # Both passes run along the width: DALI's CPU resize steps through rows accumulating the
        # source position in float32 (measured 0.003 pixel off after 168 rows of 2372 → 224), more
        # than the half-grid-step margin, while columns are computed exactly. So the height pass
        # runs on the transposed image.
        for transposed, name in ((False, "width"), (True, "height")):
            if transposed:
                images = fn.transpose(images, perm=[1, 0, 2], transpose_layout=False, device=device)
            size, up_start, up_end, down_start, down_end, up_mask, down_mask = (
                columns[f"{name}.{n}"] for n in _NEAREST_NAMES)
            if device == "gpu":
                up_mask, down_mask = up_mask.gpu(), down_mask.gpu()
            up, down = (fn.resize(images, size=size, roi_start=start, roi_end=end, roi_relative=False,
                                  interp_type=interp, antialias=False, device=device)
                        for start, end in ((up_start, up_end), (down_start, down_end)))
            images = up * up_mask + down * down_mask  # uint8; exactly one mask is 1 on each output column
        return fn.transpose(images, perm=[1, 0, 2], transpose_layout=False, device=device), []

    def stages(self) -> list[Stage]:
        one_pass = ["fn.resize (nearest, grid shifted +1/2 step)", "arithmetic (x line mask)",
                    "fn.resize (nearest, grid shifted -1/2 step)", "arithmetic (x line mask)",
                    "arithmetic (sum: the lines PyTorch's float32 index picks)"]
        return ([(".width", impl) for impl in one_pass] + [(".height", "fn.transpose (height as width)")]
                + [(".height", impl) for impl in one_pass] + [(".height", "fn.transpose (back)")])


# ---- border renormalisation

def filter_margin(interpolation: str, in_size: int, out_size: int) -> int:
    """Zero padding (source pixels) wider than the filter's reach: radius 1 (bilinear) or 2
    (bicubic) output pixels when downscaling, source pixels when upscaling, plus a margin."""
    reach = (1.0 if interpolation == "bilinear" else 2.0) * max(in_size / out_size, 1.0)
    return int(np.ceil(reach)) + 2


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


_PASS_NAMES = ("size", "anchor", "canvas", "roi_start", "roi_end")
_AXIS_NAMES = ("mask", "mask_size", "mask_start", "mask_end")
_AXES = {0: "rows", 1: "columns"}


def _filter_pass(interpolation: str, in_hw: tuple[int, int], out_hw: tuple[int, int],
                 axes: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Arguments of one renormalised resize pass along ``axes`` (0 = height, 1 = width): output
    size, paste anchor (the zero margins), padded size, roi start, roi end, then per axis
    (``rows.``/``columns.``): weight mask (ones on the image, zeros on the margins), its output
    size, roi start, roi end."""
    margin = [(filter_margin(interpolation, in_hw[a], out_hw[a]) if a in axes else 0) for a in (0, 1)]
    args = {"size": np.array(out_hw, dtype=np.float32),
            "anchor": np.array([margin], dtype=np.int32),
            "canvas": np.array([in_hw[0] + 2 * margin[0], in_hw[1] + 2 * margin[1]], dtype=np.int32),
            "roi_start": np.array(margin, dtype=np.float32),
            "roi_end": np.array([margin[0] + in_hw[0], margin[1] + in_hw[1]], dtype=np.float32)}
    for axis in axes:
        length = in_hw[axis] + 2 * margin[axis]
        mask = np.zeros(length, dtype=np.float32)
        mask[margin[axis]:margin[axis] + in_hw[axis]] = 1.0
        if axis == 0:
            values = [mask.reshape(length, 1, 1), np.array([out_hw[0], 1], dtype=np.float32),
                      np.array([margin[0], 0], dtype=np.float32), np.array([margin[0] + in_hw[0], 1], dtype=np.float32)]
        else:
            values = [mask.reshape(1, length, 1), np.array([1, out_hw[1]], dtype=np.float32),
                      np.array([0, margin[1]], dtype=np.float32), np.array([1, margin[1] + in_hw[1]], dtype=np.float32)]
        args.update({f"{_AXES[axis]}.{name}": value for name, value in zip(_AXIS_NAMES, values)})
    return args


def _filter_pass_columns(prefix: str, axes: tuple[int, ...]) -> list[Column]:
    columns = [Column(prefix + "size", "float32", (2,)), Column(prefix + "anchor", "int32", (1, 2)),
               Column(prefix + "canvas", "int32", (2,)), Column(prefix + "roi_start", "float32", (2,)),
               Column(prefix + "roi_end", "float32", (2,))]
    for axis in axes:
        mask_shape = (None, 1, 1) if axis == 0 else (1, None, 1)
        columns += [Column(f"{prefix}{_AXES[axis]}.{name}", "float32", mask_shape if name == "mask" else (2,))
                    for name in _AXIS_NAMES]
    return columns


def _renormalised(images: Any, columns: Mapping[str, Any], prefix: str, axes: tuple[int, ...], interpolation: Any,
                  device: str) -> Any:
    """A zero-padded float resize divided by the filter's weight on the image (torchvision's truncation)."""
    from nvidia.dali import fn, types

    interp = interp_type(interpolation)
    size, anchor, canvas, start, end = (columns[prefix + name] for name in _PASS_NAMES)
    # Zero margins via multi_paste: a fresh zeroed canvas, ~6x faster than fn.slice's padding on the CPU.
    padded = fn.multi_paste(fn.reshape(images, layout="HWC"), out_anchors=anchor, output_size=canvas, device=device)
    out = fn.resize(padded, size=size, roi_start=start, roi_end=end, roi_relative=False, interp_type=interp,
                    antialias=True, dtype=types.FLOAT, device=device)
    weight = None
    for axis in axes:
        mask, mask_size, mask_start, mask_end = (columns[f"{prefix}{_AXES[axis]}.{name}"] for name in _AXIS_NAMES)
        line = fn.resize(mask.gpu() if device == "gpu" else mask, size=mask_size, roi_start=mask_start,
                         roi_end=mask_end, roi_relative=False, interp_type=interp, antialias=True,
                         dtype=types.FLOAT, device=device)
        weight = line if weight is None else weight * line
    return out / weight  # broadcast: the in-image weight sum of each output row and column


_RENORMALISED_PASS = [(".zero_margins", "fn.reshape (HWC, no copy)"),
                      (".zero_margins", "fn.multi_paste (image on a zeroed canvas)"),
                      ("", "fn.resize (antialias, float, region of interest on the image)")]


class Filter1Pass(ResizeMethod):
    """Bilinear with antialias: one renormalised 2-D pass."""
    name = "filter_1pass"

    def columns(self) -> list[Column]:
        return _filter_pass_columns("", (0, 1))

    def arguments(self, in_hw, out_hw) -> dict[str, Any]:
        return _per_sample(lambda i, o: _filter_pass("bilinear", i, o, (0, 1)), in_hw, out_hw)

    def graph(self, images, columns, interpolation, device):
        from nvidia.dali import fn, types

        out = _renormalised(images, columns, "", (0, 1), interpolation, device)
        return fn.cast(out, dtype=types.UINT8, device=device), []  # rounds to nearest, saturates

    def stages(self) -> list[Stage]:
        return (_RENORMALISED_PASS
                + [(".border_weights", "fn.resize (weight on the image per row)"),
                   (".border_weights", "fn.resize (weight on the image per column)"),
                   (".border_weights", "arithmetic (row x column)"),
                   (".renormalise", "arithmetic (divide: torchvision's truncated filter)"),
                   (".round", "fn.cast (uint8, round to nearest)")])


class Filter2Pass(ResizeMethod):
    """Bicubic with antialias: renormalised width, then height pass, clamped in between as torchvision."""
    name = "filter_2pass"

    def columns(self) -> list[Column]:
        return _filter_pass_columns("width.", (1,)) + _filter_pass_columns("height.", (0,))

    def arguments(self, in_hw, out_hw) -> dict[str, Any]:
        def build(i: tuple[int, int], o: tuple[int, int]) -> dict[str, np.ndarray]:
            middle = (i[0], o[1])  # width first, as torchvision
            width = _filter_pass("bicubic", i, middle, (1,))
            height = _filter_pass("bicubic", middle, o, (0,))
            return {**{"width." + k: v for k, v in width.items()}, **{"height." + k: v for k, v in height.items()}}
        return _per_sample(build, in_hw, out_hw)

    def graph(self, images, columns, interpolation, device):
        from nvidia.dali import fn, math, types

        out = math.clamp(_renormalised(images, columns, "width.", (1,), interpolation, device), 0.0, 255.0)
        out = _renormalised(out, columns, "height.", (0,), interpolation, device)
        return fn.cast(out, dtype=types.UINT8, device=device), []  # rounds to nearest, saturates

    def stages(self) -> list[Stage]:
        return ([(".width" + suffix, impl) for suffix, impl in _RENORMALISED_PASS]
                + [(".width.border_weights", "fn.resize (weight on the image per column)"),
                   (".width.renormalise", "arithmetic (divide)"),
                   (".width.clamp", "arithmetic (clamp to [0, 255], as torchvision between passes)")]
                + [(".height" + suffix, impl) for suffix, impl in _RENORMALISED_PASS]
                + [(".height.border_weights", "fn.resize (weight on the image per row)"),
                   (".height.renormalise", "arithmetic (divide)"),
                   (".round", "fn.cast (uint8, round to nearest)")])


# ---- border patch

_EDGES = ("top", "bottom", "left", "right")


def _edge_names(edge: str) -> list[str]:
    """A strip's paste and resize arguments (multi_paste's anchors default to 0, 0)."""
    names = [f"{edge}.in_anchors"] if edge in ("bottom", "right") else []
    names += [f"{edge}.out_anchors"] if edge != "right" else []
    return names + [f"{edge}.roi_start", f"{edge}.roi_end"]


def border_columns(in_hw: np.ndarray, out_hw: np.ndarray) -> dict[str, np.ndarray]:
    """Argument columns (batch first) of the exact outermost output rows and columns of bilinear
    antialiased resizes from ``in_hw`` ([N, 2] (height, width) pixels) to one ``out_hw`` size.

    Only output lines whose filter reaches past the image differ from a plain fn.resize: the first
    and last row and column when downscaling (none when upscaling, computed anyway). Each comes
    from a strip of the image along its edge, pasted beside a zero margin wider than the filter
    and resized with its region of interest mapping the strip's edge exactly as the full resize
    maps the image's, then divided by :func:`image_weight`; the left and right strips give the
    rows between the first and last. Columns: the strips' shapes ([N, 1, 2] int32), canvas sizes
    ([N, 2] int32) and output sizes (float32) — ``rows.``, then ``columns.``; per strip the paste
    source anchor and canvas anchor (where not 0, 0) and the roi start and end; then the weights
    of the two rows ([N, 2, W, 1]) and of the two columns ([N, 1, 2, 1]). Vectorised: this runs per
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
    return {"rows.shape": pairs(k_h, n_w), "rows.canvas": sizes(k_h + margin_h, n_w + 2 * margin_w),
            "rows.size": sizes(1, m_w, np.float32),
            "columns.shape": pairs(n_h, k_w), "columns.canvas": sizes(n_h, k_w + margin_w),
            "columns.size": sizes(m_h - 2, 1, np.float32),
            # top: pasted at the margins; bottom: its last rows, margin below; left; right: its last columns
            "top.out_anchors": pairs(margin_h, margin_w), "top.roi_start": sizes(margin_h, margin_w, np.float32),
            "top.roi_end": sizes(margin_h + s_h, margin_w + n_w, np.float32),
            "bottom.in_anchors": pairs(n_h - k_h, zero), "bottom.out_anchors": pairs(zero, margin_w),
            "bottom.roi_start": sizes(k_h - s_h, margin_w, np.float32),
            "bottom.roi_end": sizes(k_h, margin_w + n_w, np.float32),
            "left.out_anchors": pairs(zero, margin_w), "left.roi_start": sizes(s_h, margin_w, np.float32),
            "left.roi_end": sizes(n_h - s_h, margin_w + s_w, np.float32),
            "right.in_anchors": pairs(zero, n_w - k_w), "right.roi_start": sizes(s_h, k_w - s_w, np.float32),
            "right.roi_end": sizes(n_h - s_h, k_w, np.float32),
            "rows.weights": row_weights.astype(np.float32)[..., None],
            "columns.weights": column_weights.astype(np.float32)[:, None, :, None]}


class BorderPatch(ResizeMethod):
    """Bilinear with antialias to a fixed size as the last geometry step: a plain antialiased
    fn.resize, whose lines off the border already equal torchvision's, plus the exact outermost
    rows and columns (from edge strips) that the finish treats as images and torch writes over the
    batch's (``backends.dali.write_border``)."""
    name = "border_patch"

    def columns(self) -> list[Column]:
        found = [_SIZE]
        for lines in ("rows", "columns"):
            found += [Column(f"{lines}.shape", "int32", (1, 2)), Column(f"{lines}.canvas", "int32", (2,)),
                      Column(f"{lines}.size", "float32", (2,))]
        for edge in _EDGES:
            found += [Column(name, "int32" if "anchors" in name else "float32",
                             (1, 2) if "anchors" in name else (2,)) for name in _edge_names(edge)]
        return found + [Column("rows.weights", "float32", (2, None, 1)),
                        Column("columns.weights", "float32", (1, 2, 1))]

    def arguments(self, in_hw, out_hw) -> dict[str, Any]:
        out = np.array(out_hw, dtype=np.float32).reshape(-1, 2)
        return {"size": out, **border_columns(np.array(in_hw).reshape(-1, 2), out)}

    def graph(self, images, columns, interpolation, device):
        from nvidia.dali import fn, types

        interp = interp_type(interpolation)
        image = fn.resize(images, size=columns["size"], interp_type=interp, antialias=True, device=device)
        hwc = fn.reshape(images, layout="HWC")
        strips = []
        for edge in _EDGES:
            lines = "rows" if edge in ("top", "bottom") else "columns"
            anchors = {key: columns[f"{edge}.{key}"] for key in ("in_anchors", "out_anchors")
                       if f"{edge}.{key}" in _edge_names(edge)}
            pasted = fn.multi_paste(hwc, shapes=columns[f"{lines}.shape"], output_size=columns[f"{lines}.canvas"],
                                    device=device, **anchors)
            strips.append(fn.resize(pasted, size=columns[f"{lines}.size"], roi_start=columns[f"{edge}.roi_start"],
                                    roi_end=columns[f"{edge}.roi_end"], roi_relative=False, interp_type=interp,
                                    antialias=True, dtype=types.FLOAT, device=device))
        row_weights, column_weights = columns["rows.weights"], columns["columns.weights"]
        if device == "gpu":
            row_weights, column_weights = row_weights.gpu(), column_weights.gpu()
        rows = fn.cat(strips[0], strips[1], axis=0, device=device) / row_weights
        cols = fn.cat(strips[2], strips[3], axis=1, device=device) / column_weights
        return image, [fn.cast(line, dtype=types.UINT8, device=device) for line in (rows, cols)]

    def stages(self) -> list[Stage]:
        return ([("", "fn.resize (antialias: every line off the border equals torchvision's)"),
                 (".border", "fn.reshape (HWC, no copy)")]
                + [(f".border.{edge}", impl) for edge in _EDGES for impl in
                   ("fn.multi_paste (the edge strip beside a zeroed margin)",
                    "fn.resize (antialias, float, roi mapping the edge as the full resize does)")]
                + [(".border.rows", "fn.cat (first and last row)"),
                   (".border.rows", "arithmetic (divide by the filter's weight on the image: "
                                    "torchvision's truncated filter)"),
                   (".border.rows", "fn.cast (uint8, round to nearest)"),
                   (".border.columns", "fn.cat (first and last column of the rows between)"),
                   (".border.columns", "arithmetic (divide: torchvision's truncated filter)"),
                   (".border.columns", "fn.cast (uint8, round to nearest)")])

    def finish_stages(self, torch_device: str) -> list[tuple[str, str, str]]:
        return [("finish.border", f"fn.crop_mirror_normalize ({lines}, as the image)", "")
                for lines in ("first and last rows", "first and last columns")] + [
            ("border_patch", "torch: the exact border lines written over the batch's, in place", torch_device)]


METHODS: dict[str, ResizeMethod] = {method.name: method for method in (
    Plain("linear", antialias=False), Plain("antialias", antialias=True), Nearest(), Filter1Pass(), Filter2Pass(),
    BorderPatch())}
