"""The finish of a batch — uint8 NCHW to the declared dtype, normalisation and layout — on the
batch's device, the same code for every backend (the torchvision workers' batches and the DALI
torch tail's), so what each backend hands the loader is finished alike.

On the CPU the finish is a table lookup: a uint8 pixel of a channel has 256 values, so the
arithmetic (:func:`_normalised`) runs once on those (a [channels, 256] table, made once per
finish) and each plane of the batch is looked up in its channel's row with ``numpy.take``,
which releases the GIL. The pixels are the arithmetic's bit for bit, by construction; the
lookup costs about a third of the four full passes (convert, divide, subtract, divide) over a
batch, and uses no intra-op threads competing with the workers for the cores."""
from __future__ import annotations

import threading
from functools import lru_cache

import numpy as np
import torch

from ..util.dtypes import torch_dtype
from ..ops.finish import Finish

__all__ = ["finish_batch", "FinishedBuffers"]


class FinishedBuffers:
    """Host memory for finished batches, reused once nothing outside holds a batch that used it.

    A fresh batch-sized buffer is a new mapping whose pages the kernel zeroes on first touch: for a
    recipe's batch (128 x 3 x 176 x 176 float32, 48 MB) that was most of the finishing thread's
    system time. A buffer is taken again only when its storage has no user but this ring (no
    tensor, view or numpy array of it elsewhere), so a batch the training loop keeps is never
    written over."""

    def __init__(self, *, keep: int = 4):
        self.keep = keep
        self._held: list[torch.Tensor] = []
        self.lent = self.made = 0  # buffers handed out, and of those how many were new
        self._lock = threading.Lock()  # two threads finishing at once must not take one buffer

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A buffer of ``shape`` and ``dtype`` that nothing else uses: a held one, else a new one.
        Handed out as a view, a tensor of its own on the same storage, so that whoever keeps it (or
        anything made from it) counts as a user of that storage."""
        with self._lock:
            self.lent += 1
            for buffer in self._held:
                if buffer.shape == shape and buffer.dtype == dtype and _unused(buffer):
                    return buffer.view(shape)
            buffer = torch.empty(shape, dtype=dtype)
            self.made += 1
            self._held = [buffer] + self._held[:self.keep - 1]
            return buffer.view(shape)


# torch's count of a storage's users is not public API: where a torch lacks it, no buffer is reused.
_STORAGE_USE_COUNT = getattr(torch._C, "_storage_Use_Count", None)


def _users(tensor: torch.Tensor) -> int:
    """How many tensors, views and storages use ``tensor``'s storage (the query's own included)."""
    return _STORAGE_USE_COUNT(tensor.untyped_storage()._cdata)


_UNSHARED = _users(torch.empty(1)) if _STORAGE_USE_COUNT else 0  # a tensor nothing else uses, as torch counts it


def _unused(buffer: torch.Tensor) -> bool:
    return _STORAGE_USE_COUNT is not None and _users(buffer) <= _UNSHARED


def finish_batch(images: torch.Tensor, finish: Finish, device: torch.device, *,
                 buffers: FinishedBuffers | None = None) -> torch.Tensor:
    """uint8 NCHW → the declared dtype and layout, normalised as (pixel/255 - mean)/std;
    ``buffers``: where a host batch finished by table lookup is written (else new memory). ``images``
    may be in channels-last memory (a torchvision worker's batch: ``in_layout_of``); the batch made is
    contiguous either way."""
    images = images.to(device, non_blocking=True)
    if finish.dtype == "uint8":
        out = (images.contiguous() if images.device.type == "cuda"
               else images.clone(memory_format=torch.contiguous_format))
    elif images.device.type == "cpu" and images.dim() == 4:
        table = _table(finish.mean, finish.std, finish.dtype, channels=images.shape[1])
        into = buffers.take(tuple(images.shape), torch_dtype(finish.dtype)) if buffers else None
        out = _looked_up(images, table, into=into)
    else:
        out = _normalised(images, finish).contiguous()
    if finish.layout == "HWC":
        out = out.permute(0, 2, 3, 1).contiguous()
    return out


def _normalised(images: torch.Tensor, finish: Finish) -> torch.Tensor:
    """The arithmetic of torchvision's ToDtype(scale=True) + Normalize, in float32, then cast."""
    out = images.to(torch.float32).div_(255.0)
    if not finish.identity:
        mean, std = _normalisation(finish.mean, finish.std, out.device)
        out.sub_(mean).div_(std)
    dtype = torch_dtype(finish.dtype)
    return out if dtype == torch.float32 else out.to(dtype)


@lru_cache(maxsize=16)
def _table(mean: tuple[float, ...], std: tuple[float, ...], dtype: str, *, channels: int) -> np.ndarray:
    """[channels, 256]: row c holds :func:`_normalised` of the values 0..255 in channel c."""
    values = torch.arange(256, dtype=torch.uint8).view(1, 1, 1, 256).expand(1, channels, 1, 256).contiguous()
    finished = _normalised(values, Finish(mean=mean, std=std, dtype=dtype))
    return finished.reshape(channels, 256).numpy().copy()


def _looked_up(images: torch.Tensor, table: np.ndarray, *, into: torch.Tensor | None = None) -> torch.Tensor:
    """Each channel plane of ``images`` (uint8 NCHW) through its row of ``table``. Plane by plane:
    numpy widens the indices to a buffer the size of what it takes, which then stays in cache.
    ``mode="wrap"`` skips the bounds check of the default mode: a uint8 index is always a row's
    0..255 (wrapping changes none), and the lookup runs about a quarter faster."""
    pixels = images.numpy()
    out = np.empty(pixels.shape, dtype=table.dtype) if into is None else into.numpy()
    for sample in range(pixels.shape[0]):
        for channel in range(pixels.shape[1]):
            np.take(table[channel], pixels[sample, channel], out=out[sample, channel], mode="wrap")
    return torch.from_numpy(out) if into is None else into


@lru_cache(maxsize=16)
def _normalisation(mean: tuple[float, ...], std: tuple[float, ...],
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """mean and std as [1, 3, 1, 1] float32 tensors on ``device``, made once: a per-batch
    ``torch.tensor(..., device=cuda)`` is a pageable host-to-device copy the host waits for."""
    return (torch.tensor(mean, dtype=torch.float32, device=device).view(1, 3, 1, 1),
            torch.tensor(std, dtype=torch.float32, device=device).view(1, 3, 1, 1))
