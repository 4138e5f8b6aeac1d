"""A DALI backend's torch tail, batched: the plan's steps after the DALI graph, applied step by step
to the whole batch.

Each step runs as its op's batch kernel (:meth:`~dali_bridge.ops.facets.Batching.batch_kernel`): one call per
operation drawn, with per-sample parameters as tensors, so the kernel launches of a batch grow with
the operations drawn, not with the batch size. Where the op has no batch kernel, or the images do
not all have one size yet (a tail that starts with the resize under ``parity: exact``), the step
runs as the op's per-sample torchvision kernel in a loop. Both give the same pixels.

The batch kernels round a multiply-add as the device's own kernel does, which they ask of the
device once (:func:`~dali_bridge.ops.batched.add_rounding`); the tail asks before its first step,
so that one wait for a GPU falls in the first batch whatever that batch draws.

On the CPU the batch kernels save no launches and cost more than torchvision's own per-sample ones
(their exact rounding of a per-sample multiply-add is emulated in float64, the groups are gathered
and scattered): a host tail asks for the per-sample kernels throughout (``batched=False``).
"""
from __future__ import annotations

from typing import Sequence

import numpy
import torch

from ...ops.base import Step
from ...ops.batched import add_rounding
from ...ops.facets import Batching, facet


def run_tail(steps: Sequence[Step], images: Sequence[torch.Tensor], tail: Sequence[Sequence[tuple]], *,
             batched: bool = True, contiguous_after_first: bool = False,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """``steps`` on ``images`` (CHW uint8: a list, or one N x C x H x W tensor); ``tail[n]`` holds
    sample n's (concrete parameters, input size) for each step; ``batched=False``: each step as its
    op's per-sample torchvision kernel; ``contiguous_after_first``: the first step's images are made
    contiguous (CHW memory) for the steps after it. Returns the batch as one tensor in memory of its
    own: the input may be a view of DALI's buffer, which a step may leave unchanged. ``out``: that memory
    (N x C x H x W uint8), written image by image: a tail worker process writes its rows of the shared
    batch so, where a stacked batch was a fresh allocation (its pages faulted in each time) and one more
    copy of every image."""
    given = images
    if batched and steps and len(images):
        add_rounding(images[0].device)
    for position, step in enumerate(steps):
        concrete = [sample[position][0] for sample in tail]
        done = facet(step.op, Batching).batch_kernel(images, concrete, step.params) if batched else None
        if done is None:  # no batched kernel for this op (or these images): torchvision's, per sample
            done = [step.op.torchvision_kernel(image, parameters, step.params)
                    for image, parameters in zip(images, concrete)]
        if position == 0 and contiguous_after_first:
            done = done.contiguous() if isinstance(done, torch.Tensor) else [chw_copy(image) for image in done]
        images = done
    if out is not None:
        for row, image in zip(out, images):
            row.copy_(image)
        return out
    if images is given:
        return given.clone()
    return images if isinstance(images, torch.Tensor) else torch.stack(list(images))


def chw_copy(image: torch.Tensor) -> torch.Tensor:
    """``image`` in CHW memory of its own (``contiguous``). On the host numpy's copy: torch's
    transposing copy of a uint8 CHW view of HWC memory took about twice as long (timed on the
    recipes' resized crops), and the tail makes one per image."""
    if image.device.type != "cpu" or image.is_contiguous():
        return image.contiguous()
    return torch.from_numpy(numpy.ascontiguousarray(image.numpy()))
