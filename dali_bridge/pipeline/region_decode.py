"""Decoding only the window a sample's first crop keeps: the torchvision backend's region of interest.

A first step that crops a window (a random resized crop: its op declares ``window_columns``) throws the
rest of the image away. libjpeg-turbo can skip the rows above and below the window
(``jpeg_skip_scanlines``) and decode only the columns of blocks it spans (``jpeg_crop_scanline``),
as DALI's CPU decoder does. nvImageCodec's CPU decoder (its libjpeg-turbo extension; the
``nvidia-nvimgcodec`` wheel DALI installs) exposes that as a region of a code stream, and its
pixels equal torchvision's full decode then crop bit for bit (``tests/pipeline/test_region_decode.py``
pins it for every row span and column span of small baseline and progressive JPEGs, every window
of a tiny one, and edge windows and drawn crops of real photos, colour and grey).

Everything else is decoded whole by :func:`~dali_bridge.data.sources.images.decode_checked` and cropped, which
gives the same pixels at the usual cost: nvImageCodec missing, a PNG or WebP, a JPEG with an EXIF
orientation (the window is in oriented coordinates), a four-channel JPEG (CMYK and YCCK colour
conversions are each decoder's own), or a JPEG the region decoder refuses (the full decode then
reports any error, as it would without this module).
"""
from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from ..data.sources.formats import ImageInfo, inspect_image
from ..data.sources.images import decode_checked
from ..ops.geometry import Crop
from .plan import Plan
from ..ops.facets import Sizing, facet

if TYPE_CHECKING:
    import torch

__all__ = ["decode_region", "decode_steps", "decode_window", "decoded_window", "describe_decode",
           "region_decode_available", "region_decoder", "steps_over_window"]

_state = threading.local()  # each thread's (process id, decoder, decode parameters)
_unavailable: list[str] = []  # why nvImageCodec cannot be used here, once looked up


def _nvimgcodec() -> Any:
    """The nvImageCodec module, or None (the reason kept for :func:`region_decoder`)."""
    if _unavailable:
        return None
    try:
        from nvidia import nvimgcodec
    except (ImportError, OSError) as exc:  # OSError: the wheel is there, a shared library it needs is not
        _unavailable.append(f"{type(exc).__name__}: {exc}")
        return None
    return nvimgcodec


def region_decode_available() -> bool:
    """Whether JPEG windows are decoded alone here (nvImageCodec imports)."""
    return _nvimgcodec() is not None


def region_decoder() -> str:
    """One line: which decoder the torchvision backend runs for a first crop's window."""
    module = _nvimgcodec()
    if module is None:
        return (f"torchvision.io full decode, then crop (nvImageCodec, which decodes only the window, does not "
                f"load: {_unavailable[0]}; it comes with nvidia-dali-cuda120 on Linux)")
    return (f"nvImageCodec {module.__version__} CPU (libjpeg-turbo) decodes only the crop window of a JPEG; "
            f"torchvision.io full decode for other images")


def describe_decode(plan: Plan) -> str:
    """What decodes each sample of ``plan`` on the torchvision backend (``dali-bridge show``)."""
    if plan.views:
        return "torchvision.io full decode, once per sample: every view is cut from it"
    if plan.steps and facet(plan.steps[0].op, Sizing).window_columns:
        return region_decoder()
    return "torchvision.io full decode (the first step needs the whole image)"


def _decoder() -> tuple[Any, Any] | None:
    """This thread's nvImageCodec CPU decoder and parameters (one per thread, made again in a forked
    worker: a decoder made before the fork belongs to the parent), or None where it is missing."""
    module = _nvimgcodec()
    if module is None:
        return None
    held = getattr(_state, "held", None)
    if held is None or held[0] != os.getpid():
        # One CPU thread: the DataLoader worker (or the loader's thread) is the unit of parallelism.
        decoder = module.Decoder(device_id=module.NVIMGCODEC_DEVICE_CPU_ONLY, max_num_cpu_threads=1,
                                 backends=[module.Backend(module.BackendKind.CPU_ONLY)])
        # Interleaved RGB, libjpeg-turbo's own output (planar costs nvImageCodec a conversion pass);
        # orientation is left out (only orientation-1 files come here).
        params = module.DecodeParams(color_spec=module.SRGB, sample_format=module.I_RGB,
                                     apply_exif_orientation=False)
        held = _state.held = (os.getpid(), decoder, params)
    return held[1], held[2]


def _region(data: bytes, window: Crop) -> Any:
    """The window as a uint8 CHW tensor from nvImageCodec, or None where it does not decode it."""
    import numpy as np
    import torch

    found = _decoder()
    if found is None:
        return None
    decoder, params = found
    module = _nvimgcodec()
    stream = module.CodeStream(data)
    if stream.num_channels not in (1, 3):
        return None
    region = module.Region(start=(window.top, window.left),
                           end=(window.top + window.height, window.left + window.width))
    image = decoder.decode(stream.get_sub_code_stream(region=region), params=params)
    if image is None:  # nvImageCodec logs its reason and returns nothing
        return None
    # HWC seen as CHW: the memory layout torchvision's decode_image returns, so the kernels after the
    # decode take the same paths. The array keeps nvImageCodec's host buffer alive.
    return torch.from_numpy(np.asarray(image)).permute(2, 0, 1)


def decode_window(data: bytes, *, info: ImageInfo, window: Crop) -> torch.Tensor:
    """Pixels of ``window`` (inside the image as decoded) of bytes that passed
    :func:`~dali_bridge.data.sources.formats.inspect_image` with result ``info``: a uint8 CHW RGB tensor equal to
    :func:`~dali_bridge.data.sources.images.decode_rgb` then crop, decoding only the window where it can."""
    height, width = info.size
    if not (0 <= window.top and 0 <= window.left and 0 < window.height and 0 < window.width
            and window.top + window.height <= height and window.left + window.width <= width):
        raise ValueError(f"window {window.height}x{window.width} at ({window.top}, {window.left}) is not inside "
                         f"the {height}x{width} image: only a window inside it can be decoded alone")
    if info.format == "jpeg" and info.orientation == 1:
        # The region decoder upsamples the 4:2:0 chroma of a one-pixel-wide output differently from the
        # same column inside a wider one (the tests found it): such a window is decoded two columns
        # wide, then cut.
        narrow = window.width == 1 and width > 1
        left = min(window.left, width - 2) if narrow else window.left
        wider = Crop(window.top, left, window.height, 2 if narrow else window.width)
        image = _region(data, wider)
        if image is not None:
            return image[:, :, window.left - left:window.left - left + window.width]
    image = decode_checked(data)
    return image[:, window.top:window.top + window.height, window.left:window.left + window.width]


def decode_region(data: bytes, top: int, left: int, height: int, width: int, *,
                  max_pixels: int | None = None) -> torch.Tensor:
    """Rows [top, top+height) and columns [left, left+width) of the encoded image ``data`` as a uint8
    CHW RGB tensor: :func:`~dali_bridge.data.sources.images.decode_rgb` then crop, pixel for pixel. The bytes are
    checked first, as :func:`~dali_bridge.data.sources.images.decode_rgb` checks them."""
    info = inspect_image(data, max_pixels=max_pixels)
    return decode_window(data, info=info, window=Crop(top, left, height, width))


def decoded_window(plan: Plan, per_step: list) -> Crop | None:
    """The window the plan's first step keeps of the image (``per_step``: the sample's
    :func:`~dali_bridge.pipeline.sampling.sample_steps`) when it may be decoded alone, else None: the step's
    op crops a window first (it declares ``window_columns``) and the window lies inside the image."""
    if not plan.steps or not facet(plan.steps[0].op, Sizing).window_columns:
        return None
    concrete, (height, width) = per_step[0]
    crop = concrete[0] if concrete else None
    if not isinstance(crop, Crop):
        return None
    inside = 0 <= crop.top and 0 <= crop.left and crop.top + crop.height <= height and crop.left + crop.width <= width
    return crop if inside else None


def decode_steps(data: bytes, *, info: ImageInfo, plan: Plan, per_step: list) -> tuple[torch.Tensor, list]:
    """The sample's image as its steps need it, and the steps to apply to it: the first step's window
    alone (:func:`decode_window`) with that step's crop made the identity window over it, else the
    whole image and ``per_step`` unchanged. ``data`` passed :func:`~dali_bridge.data.sources.formats.inspect_image`
    (result ``info``); the pipeline's pixels are those of a full decode."""
    window = decoded_window(plan, per_step)
    if window is None:
        return decode_checked(data), per_step
    return decode_window(data, info=info, window=window), steps_over_window(per_step, window)


def steps_over_window(per_step: list, window: Crop) -> list:
    """A sample's steps to apply to ``window`` (:func:`decoded_window`) decoded alone: the first step's
    crop made the identity window over it, its input size the window's; the other steps unchanged."""
    concrete, _ = per_step[0]
    first = ((Crop(0, 0, window.height, window.width), *concrete[1:]), (window.height, window.width))
    return [first, *per_step[1:]]
