"""Recording what lightly's multi-view transforms draw, view by view, for tests that compare their
distributions with the bridge's draws.

lightly builds each view as a Compose of torchvision's transforms (``RandomResizedCrop``,
``RandomHorizontalFlip``, ``RandomApply([ColorJitter])``, ``RandomGrayscale``) and its own
``GaussianBlur`` (PIL's filter, drawn with numpy) and ``RandomSolarization`` (PIL's ``solarize``).
The recorder patches each where its draw shows: torchvision's ``make_params`` of the crop (the box)
and of the jitter (its factors),
the ``transform`` of a transform applied with a probability (called only when it applies), and the
PIL filter and ``solarize`` lightly's own transforms call only when they apply. The crop, flips,
jitter, grey and float conversions and the normalisation return their input (only the draws are
wanted); lightly's own random calls are made as they are, in their order,
from torch's and numpy's generators.
"""
from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ViewDraws:
    """What one view of one image drew: the crop box (height, width) out of the image's (height,
    width), and whether each random transform applied (the blur's sigma when it did)."""
    crop: tuple[int, int] = (0, 0)
    image: tuple[int, int] = (0, 0)
    horizontal_flip: bool = False
    vertical_flip: bool = False
    color_jitter: bool = False
    random_grayscale: bool = False
    gaussian_blur: float | None = None
    solarize: bool = False
    jitter_factors: tuple = ()  # (brightness, contrast, saturation, hue) factors when jittered, None if unset

    @property
    def scale(self) -> float:
        """The crop's area as a fraction of the image's."""
        return self.crop[0] * self.crop[1] / (self.image[0] * self.image[1])

    @property
    def ratio(self) -> float:
        """The crop's width over its height."""
        return self.crop[1] / self.crop[0]


@dataclass
class LightlyRecorder:
    """Each view's :class:`ViewDraws`, per call of the multi-view transform: ``views[v][n]`` is view
    ``v`` of the ``n``-th image."""
    views: list[list[ViewDraws]] = field(default_factory=list)
    current: ViewDraws | None = None

    def _mark(self, name: str, value: Any = True) -> None:
        if self.current is not None:
            setattr(self.current, name, value)


def record_lightly(transform: Any, monkeypatch: Any) -> LightlyRecorder:
    """Patch lightly's multi-view ``transform`` (SimCLRTransform, BYOLTransform, DINOTransform ...)
    and the transforms it calls, so each call records every view's draws in the returned recorder."""
    from lightly.transforms import gaussian_blur as lightly_blur
    from lightly.transforms import solarize as lightly_solarize
    from PIL import ImageFilter, ImageOps
    from torchvision.transforms import v2
    from torchvision.transforms.v2._utils import query_size

    recorder = LightlyRecorder(views=[[] for _ in transform.transforms])

    def crop_params(self, flat_inputs):
        params = crop_make_params(self, flat_inputs)
        recorder._mark("crop", (params["height"], params["width"]))
        recorder._mark("image", tuple(query_size(flat_inputs)))
        return params

    def jitter_params(self, flat_inputs):
        params = jitter_make_params(self, flat_inputs)
        recorder._mark("jitter_factors", tuple(params[f"{name}_factor"]
                                               for name in ("brightness", "contrast", "saturation", "hue")))
        return params

    crop_make_params, jitter_make_params = v2.RandomResizedCrop.make_params, v2.ColorJitter.make_params
    monkeypatch.setattr(v2.RandomResizedCrop, "make_params", crop_params)
    monkeypatch.setattr(v2.ColorJitter, "make_params", jitter_params)
    monkeypatch.setattr(v2.RandomResizedCrop, "transform", lambda self, inpt, params: inpt)
    for cls in (v2.ToDtype, v2.Normalize):  # the float conversion: image work, no draw
        monkeypatch.setattr(cls, "transform", lambda self, inpt, params: inpt)
    for cls, name in ((v2.RandomHorizontalFlip, "horizontal_flip"), (v2.RandomVerticalFlip, "vertical_flip"),
                      (v2.ColorJitter, "color_jitter"), (v2.RandomGrayscale, "random_grayscale")):
        monkeypatch.setattr(cls, "transform", lambda self, inpt, params, name=name: (recorder._mark(name), inpt)[1])

    def blur(radius):
        recorder._mark("gaussian_blur", float(radius))
        return ImageFilter.GaussianBlur(radius=radius)

    def solarize(image, threshold):
        recorder._mark("solarize")
        return ImageOps.solarize(image, threshold=threshold)

    monkeypatch.setattr(lightly_blur, "ImageFilter", types.SimpleNamespace(GaussianBlur=blur))
    monkeypatch.setattr(lightly_solarize, "ImageOps", types.SimpleNamespace(solarize=solarize))

    def view(number: int, inner: Any) -> Any:
        def recorded(image):
            recorder.current = ViewDraws()
            try:
                return inner(image)
            finally:
                recorder.views[number].append(recorder.current)
                recorder.current = None
        return recorded

    monkeypatch.setattr(transform, "transforms", [view(n, t) for n, t in enumerate(transform.transforms)])
    return recorder


def sample_lightly(transform: Any, monkeypatch: Any, *, images: int, size: tuple[int, int] = (240, 320),
                   seed: int = 0) -> list[list[ViewDraws]]:
    """``views[v][n]``: what view ``v`` of image ``n`` drew, over ``images`` calls of lightly's
    ``transform`` on a PIL image of ``size`` (height, width), torch and numpy seeded with ``seed``."""
    import numpy as np
    import torch
    from PIL import Image

    recorder = record_lightly(transform, monkeypatch)
    image = Image.fromarray(np.zeros((*size, 3), dtype=np.uint8))
    torch.manual_seed(seed)
    np.random.seed(seed)
    for _ in range(images):
        transform(image)
    return recorder.views
