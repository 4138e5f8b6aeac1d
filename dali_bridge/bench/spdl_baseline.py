"""The SPDL baseline: a loader written as SPDL's own examples write one (Meta's thread-pool
data loading, ``spdl.pipeline.PipelineBuilder``), in the bench's two configurations:

* ``spdl``: ``spdl.io`` demuxes and decodes each file with FFmpeg and does the geometry in
  FFmpeg's filter graph (crop, scale, flip), all with the GIL released, on ``threads`` threads;
  ``spdl.io.convert_frames`` packs each batch and the finish (``ToDtype`` + ``Normalize``) runs on
  the whole batch. The random parameters are the baseline's own (torchvision's random resized crop
  algorithm on numpy's generator), as the DALI baseline uses DALI's. It expresses pipelines of
  ``random_resized_crop``, ``resize``, ``center_crop`` and ``horizontal_flip``; ``spdl.io`` needs
  FFmpeg's shared libraries (Debian: libavutil, libavcodec, libavformat, libavfilter, libswscale)
  and falls back to the next configuration where they do not load, saying so in the table.
* ``spdl-torchvision``: the naive pipeline: the same stages calling ``torchvision.io.decode_image``
  and the ``transforms.v2`` Compose of the hand-written torchvision baseline in SPDL's threads.

Batches run on across epoch ends (the source is the bridge's epoch orders, one after the other):
what is measured is throughput, as for the other baselines.
"""
from __future__ import annotations

import functools
from typing import Any, Iterator

import numpy as np

from .results import BenchError
from ..ops.facets import SpecRules, facet

_FILTER_STEPS = ("random_resized_crop", "resize", "center_crop", "horizontal_flip")


@functools.lru_cache(maxsize=1)
def spdl_io_problem() -> str | None:
    """Why ``spdl.io`` cannot decode here (not installed, FFmpeg's libraries missing), or None."""
    import io

    from PIL import Image

    try:
        import spdl.io
    except ImportError as exc:
        return f"spdl is not installed ({exc}): pip install dali-bridge[bench]"
    sample = io.BytesIO()
    Image.new("RGB", (16, 16)).save(sample, "JPEG")
    try:
        spdl.io.decode_packets(spdl.io.demux_image(sample.getvalue()))
    except Exception as exc:  # spdl.io loads FFmpeg on first use and raises what the loader said
        return (f"spdl.io cannot load FFmpeg ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                f"install FFmpeg's shared libraries (Debian: libavutil libavcodec libavformat libavfilter libswscale)")
    return None


def spdl_configuration(name: str, threads: int) -> str:
    """What the ``spdl`` or ``spdl-torchvision`` baseline runs here, for the bench table."""
    threads_text = f"{threads} thread{'s' if threads != 1 else ''}"
    naive = f"SPDL {_spdl_version()} pipeline calling torchvision.io decode + transforms.v2 in {threads_text}"
    if name == "spdl-torchvision":
        return naive
    problem = spdl_io_problem()
    if problem is not None:
        return f"{naive} (spdl.io unavailable: {problem})"
    return (f"SPDL {_spdl_version()} pipeline: spdl.io FFmpeg decode + crop/scale/flip filters in {threads_text}, "
            f"convert_frames + normalise per batch")


def _spdl_version() -> str:
    try:
        from importlib.metadata import version
        return version("spdl")
    except Exception:
        return "(not installed)"


def filter_steps(plan) -> list:
    """The plan's steps as FFmpeg filters express them; :class:`BenchError` naming the first that is not."""
    for step in plan.steps:
        if step.name not in _FILTER_STEPS:
            raise BenchError(f"no spdl.io filter equivalent for step {step.name!r} (the spdl baseline does "
                             f"{', '.join(_FILTER_STEPS)}); the spdl-torchvision baseline runs any pipeline")
    for _, step in plan.post_finish:
        raise BenchError(f"no spdl.io equivalent for {step.name!r} after the finish; use spdl-torchvision")
    return list(plan.steps)


def sample_filter(steps: list, height: int, width: int, rng: np.random.Generator) -> str:
    """The FFmpeg filter chain of one sample of (height, width) pixels: each step's own parameters
    (:meth:`~dali_bridge.ops.base.Op.sample`) from the baseline's own draws, as filters."""
    from ..ops.geometry import Crop, Flip, Resize

    parts = []
    for step in steps:
        count = facet(step.op, SpecRules).draw_count(step.params)
        concrete = step.op.sample(step.params, rng.random(count) if count else None, height, width)
        for item in concrete:
            if isinstance(item, Crop):
                if item.top < 0 or item.left < 0 or item.top + item.height > height or item.left + item.width > width:
                    raise BenchError(f"the spdl baseline cannot pad: {step.name} {item.height}x{item.width} of a "
                                     f"{height}x{width} image")
                parts.append(f"crop={item.width}:{item.height}:{item.left}:{item.top}")
            elif isinstance(item, Resize):
                parts.append(f"scale={item.width}:{item.height}:flags=bilinear")
            elif isinstance(item, Flip) and item.apply:
                parts.append("hflip")
            if isinstance(item, (Crop, Resize)):
                height, width = item.height, item.width
    return ",".join(parts + ["format=pix_fmts=rgb24"])


def _epoch_orders(listing, spec) -> Iterator[int]:
    from ..pipeline.sampling import epoch_order

    epoch = 0
    while True:
        yield from epoch_order(len(listing), spec.seed, epoch, spec.loader.shuffle).tolist()
        epoch += 1


def _spdl_io_stages(spec, listing, plan):
    """(decode one index, batch of decoded items) for the ``spdl.io`` configuration."""
    import threading

    import spdl.io

    steps = filter_steps(plan)
    finish = plan.finish_step.op.torchvision_transforms(plan.finish_step.params)
    local = threading.local()

    def decode(index: int):
        rng = getattr(local, "rng", None)
        if rng is None:
            rng = local.rng = np.random.default_rng([spec.seed, threading.get_ident()])
        packets = spdl.io.demux_image(listing.paths[index])
        codec = packets.codec
        frames = spdl.io.decode_packets(packets, filter_desc=sample_filter(steps, codec.height, codec.width, rng))
        return frames, index

    def collate(items: list) -> tuple[Any, np.ndarray]:
        buffer = spdl.io.convert_frames([frames for frames, _ in items])
        images = spdl.io.to_torch(buffer).permute(0, 3, 1, 2)  # NHWC uint8 → NCHW
        for transform in finish:
            images = transform(images)
        return images, np.asarray([index for _, index in items], dtype=np.int64)

    return decode, collate


def _torchvision_stages(listing, plan):
    """(decode one index, batch of decoded items) for the naive configuration: the hand-written
    torchvision baseline's decode and Compose per sample, its MixUp/CutMix on the batch."""
    import torch
    from torchvision.io import ImageReadMode, decode_image

    from .baseline_transforms import torchvision_baseline_transform, torchvision_batch_transform

    transform = torchvision_baseline_transform(plan)
    mix = torchvision_batch_transform(plan, len(listing.classes))
    labels = torch.as_tensor(listing.labels)

    def decode(index: int):
        return transform(decode_image(listing.paths[index], mode=ImageReadMode.RGB)), index

    def collate(items: list) -> tuple[Any, np.ndarray]:
        images, indices = torch.stack([image for image, _ in items]), [index for _, index in items]
        if mix is not None:
            images, _ = mix(images, labels[indices])
        return images, np.asarray(indices, dtype=np.int64)

    return decode, collate


def spdl_baseline(spec, listing, plan, threads: int, *, name: str, cuda: bool = False):
    """The stream of (images, indices) of the ``spdl`` or ``spdl-torchvision`` baseline, and its closer;
    with ``cuda`` each batch is copied to the GPU, as the hand-written torchvision baseline's is."""
    try:
        from spdl.pipeline import PipelineBuilder
    except ImportError as exc:
        raise BenchError(f"the {name} baseline needs spdl: pip install dali-bridge[bench] ({exc})") from None
    if name == "spdl" and spdl_io_problem() is None:
        decode, collate = _spdl_io_stages(spec, listing, plan)
    else:
        decode, collate = _torchvision_stages(listing, plan)
    concurrency = max(1, threads)
    pipeline = (PipelineBuilder()
                .add_source(_epoch_orders(listing, spec))
                .pipe(decode, concurrency=concurrency, output_order="input")
                .aggregate(spec.batch_size)
                .pipe(collate)
                .add_sink(spec.loader.prefetch)
                .build(num_threads=concurrency))
    pipeline.start()

    def stream() -> Iterator[tuple[Any, np.ndarray]]:
        for images, indices in pipeline.get_iterator():
            yield (images.to("cuda", non_blocking=True) if cuda else images), indices

    return stream(), pipeline.stop
