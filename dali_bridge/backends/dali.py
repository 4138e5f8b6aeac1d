"""The DALI backend: the plan compiled once into a DALI pipeline, fed in the bridge's order.

One graph builder serves ``dali`` (nvJPEG ``mixed`` decode, ops on the GPU) and ``dali-cpu``
(every op on the CPU); the only difference is the device each stage gets from
:func:`dali_bridge.plan.placement`. Samples enter through an external source in the order and
with the geometry the loader decided: the feeder reads each file, probes its size, and computes
torchvision-exact crop windows, resize sizes and flips, which DALI applies as per-sample
arguments (ROI decode of the crop window, then resize) — DALI draws no randomness of its own.
"""
from __future__ import annotations

import io
import logging
import threading
from collections import deque
from typing import Any, Iterator

import numpy as np
import torch

from ..images import ImageError, SampleError, decode_rgb, probe, read_bytes
from ..loader import RawBatch, SkippedSample, Topology, default_workers
from ..plan import Plan, fused_mirror, placement, roi_decode
from ..sampling import BatchTask, Crop, Flip, Resize, draws, sample_geometry
from ..sources import Listing
from ..spec import PipelineSpec

log = logging.getLogger("dali_bridge")

_INTERP = {"nearest": "INTERP_NN", "bilinear": "INTERP_LINEAR", "bicubic": "INTERP_CUBIC"}
_DTYPES = {"float32": "FLOAT", "float16": "FLOAT16", "uint8": "UINT8"}


def _placeholder_jpeg() -> bytes:
    """A tiny valid JPEG fed when every sample of a batch was skipped (DALI needs >= 1 sample)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, "JPEG")
    return buffer.getvalue()


class _Feeder:
    """The external source: yields the inputs of each batch in the loader's order.

    DALI calls it ahead of consumption (prefetch); ``pending`` keeps, in order, which samples
    each fed batch holds so outputs can be matched to indices. Thread-safe: DALI may call from
    its own thread.
    """

    def __init__(self, spec: PipelineSpec, listing: Listing, plan: Plan):
        self.spec, self.listing, self.plan = spec, listing, plan
        self.tasks: list[BatchTask] = []
        self.position = 0
        self.stopped = True
        self.pending: deque = deque()
        self.bad: dict[int, str] = {}   # sample index → reason, found by a failed DALI run
        self.lock = threading.Lock()
        self._placeholder: bytes | None = None

    def start(self, tasks: list[BatchTask]) -> None:
        with self.lock:
            self.tasks, self.position, self.stopped = tasks, 0, False
            self.pending.clear()

    def stop(self) -> None:
        with self.lock:
            self.stopped = True

    def __iter__(self) -> "_Feeder":
        return self

    def __next__(self) -> list[list[np.ndarray]]:
        with self.lock:
            if self.stopped or self.position >= len(self.tasks):
                raise StopIteration
            task = self.tasks[self.position]
            self.position += 1
        inputs, meta = self.prepare(task)
        with self.lock:
            self.pending.append(meta)
        return inputs

    def prepare(self, task: BatchTask) -> tuple[list[list[np.ndarray]], dict[str, Any]]:
        """Read, probe and compute geometry for one batch; apply the error policy to failures."""
        sample_draws = draws(self.plan, self.spec.seed, task.epoch, task.indices)
        encoded: list[np.ndarray] = []
        geometry: list[list] = []
        kept: list[int] = []
        skipped: list[SkippedSample] = []
        for row, index in enumerate(task.indices.tolist()):
            path = self.listing.paths[index]
            try:
                if index in self.bad:
                    raise ImageError(self.bad[index])
                data = read_bytes(path)
                height, width = probe(data)
            except ImageError as exc:
                if self.spec.loader.on_error == "raise":
                    raise SampleError(index, path, str(exc)) from None
                skipped.append(SkippedSample(index, path, task.epoch, str(exc)))
                continue
            encoded.append(np.frombuffer(data, dtype=np.uint8))
            geometry.append(sample_geometry(self.plan, height, width, {k: v[row] for k, v in sample_draws.items()}))
            kept.append(row)
        meta = {"task": task, "rows": kept, "skipped": skipped, "placeholder": not kept}
        if not kept:  # DALI cannot run an empty batch: feed one placeholder and drop its output
            if self._placeholder is None:
                self._placeholder = _placeholder_jpeg()
            encoded = [np.frombuffer(self._placeholder, dtype=np.uint8)]
            geometry = [sample_geometry(self.plan, 8, 8, {k: v[0] for k, v in sample_draws.items()})]
        return [encoded] + _geometry_columns(geometry), meta


def _geometry_columns(per_sample: list[list]) -> list[list[np.ndarray]]:
    """Per-sample op lists → one input column per DALI argument, in graph order."""
    columns: list[list[np.ndarray]] = []
    for position in range(len(per_sample[0])):
        ops = [sample[position] for sample in per_sample]
        if isinstance(ops[0], Crop):
            columns.append([np.array([op.top, op.left], dtype=np.int32) for op in ops])
            columns.append([np.array([op.height, op.width], dtype=np.int32) for op in ops])
        elif isinstance(ops[0], Resize):
            columns.append([np.array(op.height, dtype=np.float32) for op in ops])
            columns.append([np.array(op.width, dtype=np.float32) for op in ops])
        elif isinstance(ops[0], Flip):
            columns.append([np.array(int(op.apply), dtype=np.int32) for op in ops])
    return columns


def _geometry_template(plan: Plan) -> list[tuple[str, Any]]:
    """The shape of every sample's geometry list, from a probe image (it never depends on the sample)."""
    zero_draws = {pos: np.zeros(32) for pos in range(len(plan.steps))}
    return [(type(op).__name__, op) for op in sample_geometry(plan, 64, 64, zero_draws)]


def build_pipeline(spec: PipelineSpec, plan: Plan, feeder: _Feeder, *, gpu: bool, device_id: int | None,
                   threads: int):
    """Compile the plan into a DALI pipeline (stage devices from ``placement``)."""
    from nvidia.dali import fn, pipeline_def, types

    stages = {stage.stage: stage for stage in placement(plan, "dali" if gpu else "dali-cpu")}
    op_device = "gpu" if gpu else "cpu"
    template = _geometry_template(plan)
    steps = [step for step in plan.steps for _ in range(2 if step.kind == "random_resized_crop" else 1)]
    column_types = [types.UINT8]
    for name, _ in template:
        column_types += {"Crop": [types.INT32, types.INT32], "Resize": [types.FLOAT, types.FLOAT],
                         "Flip": [types.INT32]}[name]

    @pipeline_def(batch_size=spec.batch_size, num_threads=threads, device_id=device_id,
                  prefetch_queue_depth=spec.loader.prefetch, py_start_method="spawn")
    def graph():
        columns = list(fn.external_source(source=feeder, num_outputs=len(column_types), dtype=column_types,
                                          batch=True, no_copy=False))
        encoded = columns.pop(0)
        decode = stages["decode"]
        decoder_args: dict[str, Any] = dict(device=decode.device, output_type=types.RGB)
        if decode.device == "mixed":
            # libjpeg-turbo-compatible chroma upsampling (DALI's default differs); memory hints as NVIDIA's RN50.
            decoder_args.update(jpeg_fancy_upsampling=True, hw_decoder_load=0.65,
                                device_memory_padding=211025920, host_memory_padding=140544512)
        first = 0
        if roi_decode(plan):
            anchor, shape = columns.pop(0), columns.pop(0)
            images = fn.decoders.image_slice(encoded, anchor, shape, axis_names="HW", normalized_anchor=False,
                                             normalized_shape=False, **decoder_args)
            first = 1
        else:
            images = fn.decoders.image(encoded, **decoder_args)
        if gpu and decode.device == "cpu":
            images = images.gpu()
        mirror = None
        for n, ((name, _), step) in enumerate(zip(template, steps)):
            if n < first:
                continue
            if name == "Crop":
                anchor, shape = columns.pop(0), columns.pop(0)
                images = fn.slice(images, anchor, shape, axis_names="HW", normalized_anchor=False,
                                  normalized_shape=False, out_of_bounds_policy="pad", fill_values=0,
                                  device=op_device)
            elif name == "Resize":
                resize_y, resize_x = columns.pop(0), columns.pop(0)
                images = fn.resize(images, resize_x=resize_x, resize_y=resize_y,
                                   interp_type=getattr(types, _INTERP[step.params["interpolation"]]),
                                   antialias=step.params["antialias"], device=op_device)
            elif name == "Flip":
                flip = columns.pop(0)
                if n == len(template) - 1 and fused_mirror(plan):
                    mirror = flip
                else:
                    images = fn.flip(images, horizontal=flip, device=op_device)
        finish = plan.finish
        cmn_args: dict[str, Any] = dict(dtype=getattr(types, _DTYPES[finish.dtype]), output_layout=finish.layout,
                                        device=op_device)
        if not finish.identity:
            cmn_args.update(mean=[m * 255.0 for m in finish.mean], std=[s * 255.0 for s in finish.std])
        if mirror is not None:
            cmn_args["mirror"] = mirror
        images = fn.crop_mirror_normalize(images, **cmn_args)
        return images

    pipe = graph()
    pipe.build()
    return pipe


class DaliExecutor:
    """Runs tasks through a DALI pipeline built once (rebuilt only after a failed batch)."""

    def __init__(self, spec: PipelineSpec, listing: Listing, plan: Plan, *, gpu: bool, topology: Topology,
                 device: str | torch.device | None = None):
        self.spec, self.listing, self.plan, self.gpu = spec, listing, plan, gpu
        self.threads = spec.loader.workers or default_workers()
        self.device_id = topology.local_rank if gpu else None
        if gpu:
            self.device = torch.device(device) if device is not None else torch.device("cuda", self.device_id)
        else:
            self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.feeder = _Feeder(spec, listing, plan)
        self.pipe = None
        self._open_runs = 0

    def _pipeline(self):
        if self.pipe is None:
            self.pipe = build_pipeline(self.spec, self.plan, self.feeder, gpu=self.gpu,
                                       device_id=self.device_id, threads=self.threads)
        return self.pipe

    def run(self, tasks: list[BatchTask]) -> Iterator[RawBatch]:
        position = 0
        while position < len(tasks):
            pipe = self._pipeline()
            self.feeder.start(tasks[position:])
            try:
                for _ in range(len(tasks) - position):
                    try:
                        (images,) = pipe.run()
                    except StopIteration:  # the feeder ended early: should not happen
                        raise RuntimeError("DALI pipeline ended before the epoch's batches were produced") from None
                    meta = self.feeder.pending.popleft()
                    position += 1
                    yield self._convert(images, meta)
            except (SampleError, GeneratorExit):
                self._discard()
                raise
            except Exception as exc:
                # DALI fails a whole batch for one undecodable sample: find it, then raise or skip it.
                task = tasks[position]
                self._discard()
                culprits = self._find_culprits(task)
                if not culprits:
                    raise
                index, reason = culprits[0]
                if self.spec.loader.on_error == "raise":
                    raise SampleError(index, self.listing.paths[index], reason) from exc
                self.feeder.bad.update(culprits)
                continue
            else:
                self._end_epoch()

    def _convert(self, images, meta: dict[str, Any]) -> RawBatch:
        task: BatchTask = meta["task"]
        rows = meta["rows"]
        if meta["placeholder"]:
            tensor = torch.empty((0,) + tuple(self.plan.output_shape(0)[1:]), dtype=_torch_dtype(self.plan.finish.dtype))
        else:
            tensor = torch.from_dlpack(images.as_tensor()).clone()  # DALI reuses its output buffers
        if tensor.device != self.device:
            tensor = tensor.to(self.device, non_blocking=True)
        return RawBatch(tensor, task.indices[rows], task.valid[rows], meta["skipped"])

    def _end_epoch(self) -> None:
        """Consume DALI's end-of-epoch signal and rewind for the next run."""
        self.feeder.stop()
        try:
            while True:
                self.pipe.run()
                self.feeder.pending.popleft()
        except StopIteration:
            pass
        self.pipe.reset()

    def _discard(self) -> None:
        """Throw the pipeline away after an error or an early exit (prefetched batches included)."""
        self.feeder.stop()
        pipe, self.pipe = self.pipe, None
        del pipe

    def _find_culprits(self, task: BatchTask) -> list[tuple[int, str]]:
        found = []
        for index in task.indices.tolist():
            try:
                decode_rgb(read_bytes(self.listing.paths[index]))
            except ImageError as exc:
                found.append((index, str(exc)))
        return found

    def close(self) -> None:
        self._discard()


def _torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "float16": torch.float16, "uint8": torch.uint8}[name]
