"""The DALI graph's outputs as torch reads them, in one place for every way a batch leaves the graph
(handed over as it is, to the torch tail in this process, or to the tail's worker processes).

A graph whose last resize patches its border (``border_patch``) returns the images and, beside them,
the exact outermost lines of each; :func:`graph_batch` writes those over the images in DALI's own
memory once, so whatever reads the batch afterwards reads the finished pixels.
"""
from __future__ import annotations

from typing import Any

import torch


def graph_batch(outputs: Any, layout: str) -> torch.Tensor:
    """The graph's batch, its images all of one size, as a zero-copy view of DALI's memory (``layout``:
    HWC or CHW, as the graph laid it out), its border lines written over it. (Images whose sizes differ
    have no border: a border patch is only for a last step, which sets the output size.) The view is
    valid as long as ``outputs`` is (see :func:`~dali_bridge.backends.device.keep_alive`)."""
    images, *border = outputs
    batch = torch.from_dlpack(images.as_tensor())
    if border:
        write_border(batch, *(torch.from_dlpack(lines.as_tensor()) for lines in border), layout)
    return batch


def as_chw(images: torch.Tensor) -> torch.Tensor:
    """The graph's HWC output before a torch tail (an image, or a batch) as CHW: on the host a view of
    the HWC memory, as torchvision's decoder returns; on a GPU contiguous, the layout its batch
    kernels were measured on (see :attr:`~dali_bridge.backends.dali.plan.DaliPlan.finish_step`)."""
    chw = images.permute(0, 3, 1, 2) if images.dim() == 4 else images.permute(2, 0, 1)
    return chw if chw.device.type == "cpu" else chw.contiguous()


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
