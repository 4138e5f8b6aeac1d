"""The references a bench measures the bridge against, each a stream of (images, sample indices)
built inside the measuring process:

* ``ceiling``: read + full decode (``torchvision.io.decode_image``, libjpeg-turbo) on a thread
  pool of N threads — the decoder releases the GIL, and threads avoid the inter-process copies a
  DataLoader would add, so this is the faster honest ceiling. No augmentation, no batching.
* ``torchvision``: the DataLoader a typical user writes from the docs: ImageFolder-style dataset
  reading with ``torchvision.io.decode_image``, ``transforms.v2`` geometry, ``ToDtype`` +
  ``Normalize`` in the workers, default collate into float batches, same worker count.
  ``torchvision-pil`` is the same with ImageFolder's default PIL loader (torchvision's reference
  training scripts' default).
* ``dali-cpu`` / ``dali``: a plain DALI pipeline + ``DALIGenericIterator``: ``fn.readers.file``,
  ``fn.decoders.image_random_crop`` (ROI decode) + ``fn.resize`` + ``fn.crop_mirror_normalize``
  (with DALI's own random draws), on the CPU / with ``mixed`` decode on the GPU.

* ``spdl`` / ``spdl-torchvision``: a thread-pool loader written as SPDL's examples write one
  (:mod:`dali_bridge.bench.spdl_baseline`): ``spdl.io``'s FFmpeg decode and filters, or
  torchvision's decode and ``transforms.v2`` in SPDL's threads.

The baselines' "label" is the sample's index (the same int the label would be, so the same cost):
it tells which samples each batch holds, so pixel counts are exact for every candidate.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .baseline_transforms import torchvision_baseline_transform, torchvision_batch_transform
from .results import BenchError
from ..ops.facets import DaliBaseline, facet


_REFERENCES = {
    "ceiling": "read + torchvision.io full decode on a pool of {threads}; no augmentation, no batching",
    "torchvision": "DataLoader with {workers}: torchvision.io.decode_image + the pipeline's transforms.v2 Compose, "
                   "default collate",
    "torchvision-pil": "DataLoader with {workers}: ImageFolder's PIL loader + the pipeline's transforms.v2 Compose, "
                       "default collate",
    "dali-cpu": "plain DALI pipeline on the CPU ({threads}): fn.readers.file, ROI decode of DALI's own random crop, "
                "fn.resize, fn.crop_mirror_normalize",
    "dali": "plain DALI pipeline on the GPU ({threads}): fn.readers.file, nvJPEG ROI decode of DALI's own random "
            "crop, fn.resize, fn.crop_mirror_normalize",
}


def reference_description(kind: str, name: str, threads: int) -> str:
    """What a reference candidate is, as the bench table says it (the SPDL one as it runs here)."""
    if name.startswith("spdl"):
        from .spdl_baseline import spdl_configuration
        return spdl_configuration(name, threads)
    counted = {"threads": f"{threads} thread{'s' if threads != 1 else ''}",
               "workers": f"{threads} worker{'s' if threads != 1 else ''}"}
    return _REFERENCES["ceiling" if kind == "ceiling" else name].format(**counted)


class _EpochOrderSampler:
    """The bridge's epoch orders (``epoch_order(n, seed, epoch)``), one epoch per ``iter()``: the
    baselines read the same samples in the same order as the bridge's loaders."""

    def __init__(self, count: int, seed: int, shuffle: bool):
        self.count, self.seed, self.shuffle, self.epoch = count, seed, shuffle, 0

    def __iter__(self) -> Iterator[int]:
        from ..pipeline.sampling import epoch_order

        order = epoch_order(self.count, self.seed, self.epoch, self.shuffle)
        self.epoch += 1
        return iter(order.tolist())

    def __len__(self) -> int:
        return self.count


class _ImageFolderStyle:
    """``torchvision.datasets.ImageFolder.__getitem__`` over the bench's listing: ``load(path)``,
    then ``transform``; the target is the sample's index (see the module docstring)."""

    def __init__(self, paths: Sequence[str], load: Callable[[str], Any], transform: Callable[[Any], Any]):
        self.paths, self.load, self.transform = list(paths), load, transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self.transform(self.load(self.paths[index])), index


def _decode_image_rgb(path: str):
    from torchvision.io import ImageReadMode, decode_image
    return decode_image(path, mode=ImageReadMode.RGB)


def _pil_rgb(path: str):
    from PIL import Image  # torchvision.datasets.folder.pil_loader
    with open(path, "rb") as handle:
        image = Image.open(handle)
        return image.convert("RGB")


def torchvision_baseline(spec, listing, plan, threads: int, pil: bool, cuda: bool):
    import torch
    from torch.utils.data import DataLoader

    dataset = _ImageFolderStyle(listing.paths, _pil_rgb if pil else _decode_image_rgb,
                                torchvision_baseline_transform(plan, pil=pil))
    kwargs: dict[str, Any] = {}
    if threads > 0:
        kwargs.update(persistent_workers=True, prefetch_factor=spec.loader.prefetch)
    loader = DataLoader(dataset, batch_size=spec.batch_size, sampler=_EpochOrderSampler(len(listing), spec.seed,
                        spec.loader.shuffle), num_workers=threads, pin_memory=cuda,
                        drop_last=spec.loader.last_batch == "drop", **kwargs)
    device = torch.device("cuda") if cuda else None
    mix = torchvision_batch_transform(plan, len(listing.classes))
    labels = torch.as_tensor(listing.labels)

    def stream() -> Iterator[tuple[Any, np.ndarray]]:
        while True:
            for images, indices in loader:
                if device is not None:
                    images = images.to(device, non_blocking=True)
                if mix is not None:  # on the batch, where the bridge mixes too
                    images, _ = mix(images, labels[indices].to(images.device))
                yield images, indices.numpy()

    return stream(), lambda: None


def baseline_device(gpu: bool) -> int | None:
    """DALI's ``device_id`` for the baseline: the rank's own GPU, as the bridge's ``dali`` loader (not
    GPU 0 for every rank of a node); None on the CPU."""
    if not gpu:
        return None
    from ..backends.base import resolve_topology
    from ..backends.device import gpu_target

    return gpu_target(None, resolve_topology().local_rank).index


def dali_baseline_pipeline(spec, listing, plan, threads: int, gpu: bool):
    """The plain DALI pipeline a user writes for ``plan``: file reader in the bridge's epoch-0 order
    (DALI's reader cannot change order per epoch), then each step's plain DALI counterpart with
    DALI's own random draws (a first random resized crop decodes its random window), and
    crop_mirror_normalize (taking a last centre crop and flip)."""
    from nvidia.dali import fn, pipeline_def, types

    from ..backends.dali.plan import graph_context
    from ..ops.dali_op import DaliOp
    from ..pipeline.sampling import epoch_order

    order = epoch_order(len(listing), spec.seed, 0, spec.loader.shuffle).tolist()
    decode_device = "mixed" if gpu else "cpu"

    @pipeline_def(batch_size=spec.batch_size, num_threads=threads, device_id=baseline_device(gpu),
                  prefetch_queue_depth=spec.loader.prefetch)
    def plain():
        encoded, labels = fn.readers.file(files=[listing.paths[i] for i in order], labels=order,
                                          random_shuffle=False, name="Reader")
        ctx = graph_context(plan, "gpu" if gpu else "cpu")
        first = plan.steps[0] if plan.steps else None
        images = facet(first.op, DaliBaseline).dali_baseline_decode(first, encoded, decode_device, ctx) \
            if first and isinstance(first.op, DaliOp) else None
        start = 0 if images is None else 1  # the decoder did the first step (a random resized crop's window)
        if images is None:
            images = fn.decoders.image(encoded, device=decode_device, output_type=types.RGB)
        for ctx.position, step in enumerate(plan.steps):
            if ctx.position >= start:
                if not isinstance(step.op, DaliOp):  # it runs in torch after the bridge's graph
                    raise BenchError(f"no hand-written DALI equivalent for step {step.name!r}")
                try:
                    images = facet(step.op, DaliBaseline).dali_baseline(step, images, ctx)
                except NotImplementedError as exc:
                    raise BenchError(f"no hand-written DALI equivalent for step {step.name!r}") from exc
        return facet(plan.finish_step.op, DaliBaseline).dali_baseline(plan.finish_step, images, ctx), labels

    return plain()


def dali_baseline(spec, listing, plan, threads: int, gpu: bool):
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    pipe = dali_baseline_pipeline(spec, listing, plan, threads, gpu)
    pipe.build()
    policy = {"partial": LastBatchPolicy.PARTIAL, "drop": LastBatchPolicy.DROP,
              "pad": LastBatchPolicy.FILL}[spec.loader.last_batch]
    iterator = DALIGenericIterator([pipe], ["image", "label"], reader_name="Reader", last_batch_policy=policy,
                                   auto_reset=True)

    def stream() -> Iterator[tuple[Any, np.ndarray]]:
        while True:
            for (batch,) in iterator:
                yield batch["image"], batch["label"].reshape(-1).cpu().numpy()

    return stream(), lambda: None


def ceiling(spec, listing, threads: int):
    """Read + full decode of the same samples, in the bridge's order, on ``threads`` threads."""
    from concurrent.futures import ThreadPoolExecutor

    import torch
    from torchvision.io import ImageReadMode, decode_image

    from ..pipeline.sampling import epoch_order
    from ..data.shards.order import windows_of

    def decode(index: int):
        return decode_image(torch.frombuffer(bytearray(listing.read(index)), dtype=torch.uint8),
                            mode=ImageReadMode.RGB)

    pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="decode")

    def batches() -> Iterator[list[int]]:
        epoch = 0
        while True:
            order = epoch_order(len(listing), spec.seed, epoch, spec.loader.shuffle,
                                windows_of(listing, spec.loader)).tolist()
            for start in range(0, len(order), spec.batch_size):
                yield order[start:start + spec.batch_size]
            epoch += 1

    def stream() -> Iterator[tuple[Any, np.ndarray]]:
        pending = []  # two batches in flight keep every thread busy across batch boundaries
        for chunk in batches():
            pending.append((chunk, [pool.submit(decode, i) for i in chunk]))
            if len(pending) < 2:
                continue
            done, futures = pending.pop(0)
            images = [f.result() for f in futures]
            yield images, np.asarray(done, dtype=np.int64)

    return stream(), lambda: pool.shutdown(wait=False, cancel_futures=True)


