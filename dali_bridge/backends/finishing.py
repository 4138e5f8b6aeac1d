"""The finish of a batch — uint8 NCHW to the declared dtype, normalisation and layout — on the
batch's device, the same code for every backend (the torchvision workers' batches and the DALI
torch tail's), so what each backend hands the loader is finished alike."""
from __future__ import annotations

from functools import lru_cache

import torch

from ..dtypes import torch_dtype
from ..plan import Finish

__all__ = ["finish_batch"]


def finish_batch(images: torch.Tensor, finish: Finish, device: torch.device) -> torch.Tensor:
    """uint8 NCHW → the declared dtype and layout, normalised as (pixel/255 - mean)/std."""
    images = images.to(device, non_blocking=True)
    dtype = torch_dtype(finish.dtype)
    if finish.dtype == "uint8":
        out = images if images.device.type == "cuda" else images.clone()
    else:
        # The arithmetic of torchvision's ToDtype(scale=True) + Normalize, in float32, then cast.
        out = images.to(torch.float32).div_(255.0)
        if not finish.identity:
            mean, std = _normalisation(finish.mean, finish.std, out.device)
            out.sub_(mean).div_(std)
        if dtype != torch.float32:
            out = out.to(dtype)
    if finish.layout == "HWC":
        out = out.permute(0, 2, 3, 1).contiguous()
    return out


@lru_cache(maxsize=16)
def _normalisation(mean: tuple[float, ...], std: tuple[float, ...],
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """mean and std as [1, 3, 1, 1] float32 tensors on ``device``, made once: a per-batch
    ``torch.tensor(..., device=cuda)`` is a pageable host-to-device copy the host waits for."""
    return (torch.tensor(mean, dtype=torch.float32, device=device).view(1, 3, 1, 1),
            torch.tensor(std, dtype=torch.float32, device=device).view(1, 3, 1, 1))
