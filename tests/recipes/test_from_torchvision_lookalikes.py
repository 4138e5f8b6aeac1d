"""from_torchvision maps torchvision's own transform classes only: a subclass (whose methods may draw or
compute otherwise), a class that only shares a torchvision name, or timm's classes are refused by their
qualified name, with the reason — never converted into an op that gives other pixels."""
from __future__ import annotations

import pytest
import torch
import torchvision.transforms as T
from torchvision.transforms import v2

from dali_bridge import from_torchvision
from dali_bridge.errors import RecipeError
from dali_bridge.recipes.importing import library_class

HERE = __name__


class FlipEveryTime(v2.RandomHorizontalFlip):
    def forward(self, *inputs):
        return torch.flip(inputs[0], dims=[-1])


class FlipByTransform(v2.RandomHorizontalFlip):
    def _transform(self, inpt, params):   # the v2 hook: forward is torchvision's, the pixels are not
        return inpt


class QuietSubclass(v2.CenterCrop):
    """Overrides nothing: still not the class the bridge reproduces."""


class CenterCrop:   # crops a corner, not the centre
    def __init__(self, size):
        self.size = [size, size]

    def __call__(self, image):
        return image[..., :self.size[0], :self.size[1]]


class RandomResizedCrop:
    """Only the name: no attributes at all (torchvision's defaults would fill them)."""

    def __call__(self, image):
        return image


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, image):
        return image


class MixUp:
    alpha = 1.0


def _refusal(transform, **extra) -> str:
    with pytest.raises(RecipeError) as caught:
        from_torchvision(transform, source="/x", **extra)
    return str(caught.value)


def test_a_subclass_overriding_forward_is_refused_by_its_qualified_name():
    message = _refusal(v2.Compose([FlipEveryTime(p=0.5), v2.CenterCrop(16)]))
    assert (f"transform 0 (FlipEveryTime): {HERE}.FlipEveryTime is a subclass of "
            f"torchvision.transforms.v2.RandomHorizontalFlip") in message
    assert "use RandomHorizontalFlip itself" in message


@pytest.mark.parametrize("cls", [FlipByTransform, QuietSubclass])
def test_any_subclass_is_refused_whatever_it_overrides(cls):
    transform = cls(p=0.5) if cls is FlipByTransform else cls(16)
    message = _refusal(v2.Compose([transform, v2.CenterCrop(16)]))
    assert f"{HERE}.{cls.__qualname__} is a subclass of torchvision.transforms.v2." in message


def test_an_unrelated_class_named_like_a_torchvision_transform_is_refused():
    message = _refusal(v2.Compose([v2.Resize(32), CenterCrop(16)]))
    assert (f"transform 1 (CenterCrop): {HERE}.CenterCrop is not torchvision's CenterCrop, only a class of "
            f"the same name") in message


def test_a_bare_class_named_random_resized_crop_does_not_get_torchvisions_defaults():
    message = _refusal(v2.Compose([RandomResizedCrop(), v2.ToDtype(torch.float32, scale=True)]))
    assert f"{HERE}.RandomResizedCrop is not torchvision's RandomResizedCrop" in message


def test_a_lookalike_compose_is_refused_not_unpacked():
    message = _refusal(Compose([v2.RandomResizedCrop(16)]))
    assert f"transform 0 (Compose): {HERE}.Compose is not torchvision's Compose" in message


def test_a_lookalike_batch_transform_is_refused():
    message = _refusal(v2.Compose([v2.RandomResizedCrop(16)]), batch_transform=MixUp())
    assert f"batch_transform: {HERE}.MixUp is not torchvision's MixUp" in message
    choice = v2.RandomChoice([v2.CutMix(num_classes=3), MixUp()])
    message = _refusal(v2.Compose([v2.RandomResizedCrop(16)]), batch_transform=choice)
    assert f"batch_transform: {HERE}.MixUp is not torchvision's MixUp" in message


def test_timms_classes_are_refused_as_timms():
    transforms = pytest.importorskip("timm.data.transforms")
    message = _refusal(v2.Compose([transforms.RandomResizedCropAndInterpolation(16), v2.PILToTensor()]))
    assert "timm.data.transforms.RandomResizedCropAndInterpolation is timm's, not torchvision's" in message


def test_torchvisions_own_classes_v2_and_v1_are_accepted():
    assert library_class(v2.CenterCrop(16)) == "CenterCrop" and library_class(T.CenterCrop(16)) == "CenterCrop"
    assert library_class(CenterCrop(16)) is None and library_class(QuietSubclass(16)) is None
    spec = from_torchvision(T.Compose([T.PILToTensor(), T.RandomResizedCrop(16), T.RandomHorizontalFlip(),
                                       T.ConvertImageDtype(torch.float32)]), source="/x")
    assert [op.name for op in spec.ops] == ["random_resized_crop", "horizontal_flip", "normalize"]
