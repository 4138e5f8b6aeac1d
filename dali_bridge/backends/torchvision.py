"""The torchvision backend: the CPU fallback on torch's DataLoader.

Workers decode with torchvision.io (libjpeg-turbo, the decoder DALI's CPU path also uses), apply
each step's kernel with the parameters the loader computed (``transforms.v2.functional`` on
uint8 tensors) and ship whole uint8 batches — a quarter of the bytes of float32 — through the
worker queue into shared-memory buffers they reuse. Dtype conversion and normalisation run on the
batch: on the GPU when the loader targets one (copy on a side stream, overlapped with the
consumer's work), else in the main process.
"""
from __future__ import annotations

import logging
from collections import deque
from functools import lru_cache
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from ..images import ImageError, SampleError
from .base import RawBatch, SkippedSample, Topology, default_workers
from .device import cuda_ordinal
from ..plan import Finish, Plan
from ..sampling import BatchTask, draws, sample_steps
from ..sources import Listing
from ..spec import PipelineSpec

log = logging.getLogger("dali_bridge")

_TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "uint8": torch.uint8}
# Output buffers each worker cycles through. The DataLoader keeps at most `prefetch` batches in
# flight per worker and the main process finishes one batch before it asks for another, so a
# buffer is reused only after its batch was converted; two spare buffers keep a safe margin.
_SPARE_BUFFERS = 2


def apply_steps(image: torch.Tensor, plan: Plan, per_step: list) -> torch.Tensor:
    """Apply one sample's steps (:func:`~dali_bridge.sampling.sample_steps`) to a CHW uint8 tensor,
    each with its op's torchvision kernel."""
    for step, (concrete, _) in zip(plan.steps, per_step):
        image = step.op.torchvision_kernel(image, concrete)
    return image


class BatchDataset(Dataset):
    """Indexed by :class:`BatchTask`: returns the uint8 NCHW batch of the task's samples."""

    def __init__(self, spec: PipelineSpec, listing: Listing, plan: Plan, spare_buffers: int):
        self.listing = listing  # read(i): a file, or a positioned read from a shard
        self.paths = listing.paths
        self.plan = plan
        self.seed = spec.seed
        self.on_error = spec.loader.on_error
        self.batch_size = spec.batch_size
        self.ring_size = spare_buffers
        self._ring: list[torch.Tensor] = []
        self._next = 0

    def __len__(self) -> int:  # the sampler decides; DataLoader only needs the protocol
        return 0

    def _buffer(self, count: int) -> torch.Tensor:
        height, width = self.plan.output_size
        if not self._ring:
            in_worker = torch.utils.data.get_worker_info() is not None
            for _ in range(self.ring_size if in_worker else 1):
                nbytes = self.batch_size * 3 * height * width
                storage = torch.UntypedStorage._new_shared(nbytes) if in_worker else torch.UntypedStorage(nbytes)
                buffer = torch.empty(0, dtype=torch.uint8).set_(storage)
                self._ring.append(buffer.view(self.batch_size, 3, height, width))
        buffer = self._ring[self._next % len(self._ring)]
        self._next += 1
        return buffer[:count]

    def __getitem__(self, task: BatchTask) -> dict[str, Any]:
        sample_draws = draws(self.plan, self.seed, task.epoch, task.indices, task.repeats)
        images: list[torch.Tensor] = []
        rows: list[int] = []
        skipped: list[tuple[int, str, str]] = []
        self.listing.prefetch(task.indices.tolist())  # shards at a URL: the batch's GETs in flight together
        for row, index in enumerate(task.indices.tolist()):
            path = self.paths[index]
            try:
                image = self.listing.decode(index)
                per_step = sample_steps(self.plan, image.shape[-2], image.shape[-1],
                                        {k: v[row] for k, v in sample_draws.items()})
            except ImageError as exc:  # unreadable, or no geometry fits it (too thin for a max_size resize)
                if self.on_error == "raise":
                    return {"error": (index, path, str(exc))}
                skipped.append((index, path, str(exc)))
                continue
            images.append(apply_steps(image, self.plan, per_step))
            rows.append(row)
        out = self._buffer(len(images))
        for slot, image in enumerate(images):
            out[slot].copy_(image)
        return {"image": out, "rows": rows, "skipped": skipped, "number": task.number}


class _TaskSampler:
    """The current epoch's tasks; the executor swaps them before each pass of the DataLoader."""

    def __init__(self) -> None:
        self.tasks: list[BatchTask] = []

    def __iter__(self) -> Iterator[BatchTask]:
        return iter(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)


def finish_batch(images: torch.Tensor, finish: Finish, device: torch.device) -> torch.Tensor:
    """uint8 NCHW → the declared dtype and layout, normalised as (pixel/255 - mean)/std."""
    images = images.to(device, non_blocking=True)
    dtype = _TORCH_DTYPES[finish.dtype]
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


def prefetched(items: Iterable[Any], *, start: Callable[[Any], Any], ready: Callable[[Any], RawBatch],
               lookahead: int) -> Iterator[RawBatch]:
    """``ready(start(item))`` for each item, in order, with ``start`` run ``lookahead`` items ahead.

    ``start`` may fail (a bad sample under ``on_error: raise``, a worker's error): the items
    started before it are yielded first, then the error is raised — what the consumer sees is the
    same for every lookahead, only the overlap differs.
    """
    started: deque[Any] = deque()
    iterator = iter(items)
    while True:
        try:
            item = next(iterator)
        except StopIteration:
            break
        except Exception as exc:
            error = exc
        else:
            try:
                started.append(start(item))
                error = None
            except Exception as exc:
                error = exc
        if error is not None:
            while started:
                yield ready(started.popleft())
            raise error
        while len(started) > lookahead:
            yield ready(started.popleft())
    while started:
        yield ready(started.popleft())


class TorchvisionExecutor:
    """DataLoader workers produce uint8 batches; finishing runs where the loader's device is."""

    def __init__(self, spec: PipelineSpec, listing: Listing, plan: Plan, *, topology: Topology,
                 device: str | torch.device | None = None):
        self.spec, self.listing, self.plan = spec, listing, plan
        if device is None:
            from .select import probe  # the host facts auto and `show` use (DALI_BRIDGE_DISABLE=cuda included)
            devices = probe().cuda_devices
            device = (torch.device("cuda", cuda_ordinal(topology.local_rank, devices)) if devices
                      else torch.device("cpu"))
        self.device = torch.device(device)
        self.workers = spec.loader.workers if spec.loader.workers is not None else default_workers()
        self.sampler = _TaskSampler()
        cuda = self.device.type == "cuda"
        self.dataset = BatchDataset(spec, listing, plan, spare_buffers=spec.loader.prefetch + _SPARE_BUFFERS)
        kwargs: dict[str, Any] = {}
        if self.workers > 0:
            kwargs.update(prefetch_factor=spec.loader.prefetch, persistent_workers=True)
        self.dataloader = DataLoader(self.dataset, batch_size=None, sampler=self.sampler, num_workers=self.workers,
                                     collate_fn=_identity, pin_memory=cuda, **kwargs)
        self.stream = torch.cuda.Stream(self.device) if cuda else None

    def run(self, tasks: list[BatchTask]) -> Iterator[RawBatch]:
        self.sampler.tasks = list(tasks)
        by_number = {task.number: task for task in tasks}
        if self.stream is None:
            yield from prefetched(self.dataloader, start=lambda item: self._finish_here(item, by_number),
                                  ready=lambda raw: raw, lookahead=0)
        else:
            # GPU: copy + finish batch k+1 on a side stream while the consumer works on batch k.
            yield from prefetched(self.dataloader, start=lambda item: self._finish_on_side_stream(item, by_number),
                                  ready=self._ready, lookahead=1)

    def _finish_here(self, item: dict[str, Any], by_number: dict[int, BatchTask]) -> RawBatch:
        image = finish_batch(item["image"], self.plan.finish, self.device) if "image" in item else None
        return self._raw(item, by_number, image)

    def _finish_on_side_stream(self, item: dict[str, Any],
                               by_number: dict[int, BatchTask]) -> tuple[RawBatch, torch.cuda.Event]:
        raw = self._raw(item, by_number, None)  # a bad sample raises here, before any GPU work
        with torch.cuda.stream(self.stream):
            raw.image = finish_batch(item["image"], self.plan.finish, self.device)
            done = torch.cuda.Event()
            done.record(self.stream)
        return raw, done

    def _ready(self, started: tuple[RawBatch, torch.cuda.Event]) -> RawBatch:
        """The consumer's stream waits for this batch's finishing only, not for later work on the side stream."""
        raw, done = started
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(done)
        raw.image.record_stream(consumer)  # allocated on the side stream, used on the consumer's
        return raw

    def _raw(self, item: dict[str, Any], by_number: dict[int, BatchTask], image: torch.Tensor | None) -> RawBatch:
        if "error" in item:
            index, path, reason = item["error"]
            raise SampleError(index, path, reason)
        task = by_number[item["number"]]
        rows = item["rows"]
        skipped = [SkippedSample(index, path, task.epoch, reason) for index, path, reason in item["skipped"]]
        return RawBatch(image, task.indices[rows], task.valid[rows], skipped, repeats=task.repeats[rows])

    def close(self) -> None:
        iterator = getattr(self.dataloader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()
        self.dataloader._iterator = None


def _identity(batch: Any) -> Any:
    return batch
