"""The torchvision workers' collate: each image copied into the shared batch in its own memory layout,
with the pixels of a copy into CHW memory."""
from __future__ import annotations

import torch

from dali_bridge.backends.torchvision import in_layout_of


def hwc_images(count: int) -> list[torch.Tensor]:
    """CHW views of HWC memory, as a uint8 resize of a decoded image gives them."""
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (5, 7, 3), dtype=torch.uint8, generator=generator).permute(2, 0, 1)
            for _ in range(count)]


def copied(items: list[torch.Tensor]) -> torch.Tensor:
    batch = torch.zeros(len(items) + 1, 3, 5, 7, dtype=torch.uint8)[:len(items)]
    view = in_layout_of(items, batch)
    for slot, item in enumerate(items):
        view[slot].copy_(item)
    return view


def test_images_in_hwc_memory_are_copied_into_a_channels_last_view_of_the_batch_with_the_same_pixels():
    items = hwc_images(3)
    view = copied(items)
    assert view.permute(0, 2, 3, 1).is_contiguous()  # each image a plain copy of its bytes
    assert torch.equal(view, torch.stack(items))


def test_a_batch_mostly_in_chw_memory_keeps_the_chw_layout_and_the_pixels():
    items = [image.contiguous() for image in hwc_images(2)] + hwc_images(1)
    view = copied(items)
    assert view.is_contiguous()
    assert torch.equal(view, torch.stack(items))
