"""Where batches land on a GPU host: CUDA ordinals, DALI's thread count, copies off DALI's memory.

Pure decisions on plain inputs (a local rank and a device count, a tensor and a target) so each
one is tested on a CPU-only host with fakes; the executors call them.
"""
from __future__ import annotations

import os
import weakref
from collections import deque
from pathlib import Path
from typing import Any, Callable, Sequence
from ..util.messages import package_log

import torch

log = package_log()

# DALI threads per process on a GPU host when the spec says ``workers: auto``: every core of the
# local rank's share (the mixed decoder's Huffman stage runs on these threads), as far as the
# decoder's per-thread paddings (one device buffer and two pinned host buffers per thread, DALI's
# docs) stay within these shares of the GPU's memory and of the host's memory per local rank.
# device_check.sh benches DALI's threads at a few settings, so the figures can move the rule.
GPU_PADDING_SHARE = 1 / 20
HOST_PADDING_SHARE = 1 / 8

# The mixed decoder's memory hints, as in NVIDIA's ResNet-50 example: bytes preallocated per
# thread on the device and in pinned host memory so the first batches do not reallocate.
DECODER_DEVICE_MEMORY_PADDING = 211025920
DECODER_HOST_MEMORY_PADDING = 140544512

# Share of the mixed decoder's work given to the nvJPEG hardware engine (A100, H100/H200) where
# the GPU has one: NVIDIA's default. It stays the same under ``parity: exact``: the hardware and
# the CUDA decoder's outputs against libjpeg-turbo are to be measured on a GPU (device_check.sh
# reports both) before either is preferred. Read at build time, so a check can vary it.
HW_DECODER_LOAD = 0.65


def mixed_decoder_arguments() -> dict[str, Any]:
    """Arguments of the ``mixed`` (nvJPEG) decoder beyond its device and output type."""
    return dict(jpeg_fancy_upsampling=True,  # libjpeg-turbo's chroma upsampling (DALI's default differs)
                hw_decoder_load=HW_DECODER_LOAD,
                # Per-thread preallocations, as NVIDIA's ResNet-50 example: see dali_threads.
                device_memory_padding=DECODER_DEVICE_MEMORY_PADDING,
                host_memory_padding=DECODER_HOST_MEMORY_PADDING)


_logged_mappings: set[tuple[int, int]] = set()


def cuda_ordinal(local_rank: int, device_count: int) -> int:
    """The CUDA device this local rank uses among the ``device_count`` visible ones.

    A job that gives each rank its own GPU through ``CUDA_VISIBLE_DEVICES`` (SLURM does) runs
    ``LOCAL_RANK=3`` with one visible device: ``cuda:3`` does not exist there, ``cuda:0`` is its GPU.
    So the local rank wraps onto the visible devices, and the mapping is logged once when it wraps.
    """
    if device_count < 1:
        raise ValueError(f"no visible CUDA device for local rank {local_rank}")
    ordinal = local_rank % device_count
    if ordinal != local_rank and (local_rank, device_count) not in _logged_mappings:
        _logged_mappings.add((local_rank, device_count))
        log.info("LOCAL_RANK %d with %d visible CUDA device(s): using cuda:%d (local rank modulo the device count)",
                 local_rank, device_count, ordinal)
    return ordinal


def visible_cuda_devices() -> int:
    """CUDA devices this process sees (0 when torch cannot use CUDA)."""
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken driver: as if no device, the backend probe says why
        return 0


def gpu_target(device: str | torch.device | None, local_rank: int) -> torch.device:
    """The CUDA device a GPU executor works on: an explicit ``cuda:N`` decides; a bare ``cuda``
    means torch's current device; anything else (``None``, ``cpu``) the local rank's GPU."""
    if device is not None:
        device = torch.device(device)
        if device.type == "cuda":
            return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())
    return torch.device("cuda", cuda_ordinal(local_rank, max(visible_cuda_devices(), 1)))


def cores_per_local_rank() -> int:
    """Cores this process may use, shared among the job's processes on this node (``workers: auto``)."""
    from .base import default_workers

    return default_workers()


def local_ranks() -> int:
    """The job's processes on this node, as ``workers: auto`` reads them (``LOCAL_WORLD_SIZE``, else 1)."""
    from .base import worker_share

    return worker_share().local_world_size


def host_memory() -> int | None:
    """This host's physical memory in bytes (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def gpu_memory(device: int | None = None) -> int | None:
    """Total memory of CUDA device ``device`` (the current one by default) in bytes; None without CUDA."""
    if not visible_cuda_devices():
        return None
    try:
        return torch.cuda.get_device_properties(torch.cuda.current_device() if device is None else device).total_memory
    except Exception:  # a broken driver: the bound is left out, the backend probe says why
        return None


def gpu_thread_bounds(cores: int, *, host_bytes: int | None, gpu_bytes: int | None, ranks: int) -> dict[str, int]:
    """What bounds DALI's GPU threads under ``auto``: the cores per local rank, and the threads whose
    decoder paddings fit the shares of GPU memory and of host memory per local rank (when known)."""
    bounds = {"cores per local rank": max(1, cores)}
    if gpu_bytes:
        bounds["GPU memory"] = int(gpu_bytes * GPU_PADDING_SHARE // DECODER_DEVICE_MEMORY_PADDING)
    if host_bytes:
        per_rank = host_bytes * HOST_PADDING_SHARE / max(1, ranks)
        bounds["host memory"] = int(per_rank // (2 * DECODER_HOST_MEMORY_PADDING))
    return bounds


def dali_threads(workers: int | None, *, gpu: bool, auto_cores: int, device: int | None = None) -> int:
    """DALI's ``num_threads``: the spec's ``loader.workers`` when set (at least 1: DALI always
    needs a thread); under ``auto`` the CPU pipeline gets ``auto_cores``, the GPU one the least of
    :func:`gpu_thread_bounds` on this host (``device``: the GPU it runs on)."""
    if workers is not None:
        return max(1, workers)
    if gpu:
        bounds = gpu_thread_bounds(cores_per_local_rank(), host_bytes=host_memory(), gpu_bytes=gpu_memory(device),
                                   ranks=local_ranks())
        return max(1, min(bounds.values()))
    return max(1, auto_cores)


# The most threads a host torch tail splits a batch over (a chunk each): past a few, each chunk's own
# call per operation drawn costs more than another thread gains.
MOST_TAIL_THREADS = 4


def host_tail_split(threads: int) -> tuple[int, int]:
    """(DALI's threads, the torch tail's threads) for ``dali-cpu`` with a tail on the host, out of the
    loader's ``threads``: DALI gets half, rounded up, the tail up to :data:`MOST_TAIL_THREADS`.

    The tail runs in threads beside DALI's (with the consumer's thread, that is more threads than
    cores), and each of its kernels takes the GIL to start and end: with every core given to DALI as
    well, the threads spent much of their time waiting for it and left part of the cores idle
    (docs/performance.md). The tail costs about as much CPU per image as DALI's decode, or more."""
    threads = max(1, threads)
    return max(1, (threads + 1) // 2), min(threads, MOST_TAIL_THREADS)


def describe_gpu_threads(device: int | None = None) -> str:
    """The GPU thread default and what decided it, e.g. ``16 (the least of: cores per local rank 16, ...)``."""
    bounds = gpu_thread_bounds(cores_per_local_rank(), host_bytes=host_memory(), gpu_bytes=gpu_memory(device),
                               ranks=local_ranks())
    return (f"{max(1, min(bounds.values()))} (the least of: "
            + ", ".join(f"{name} {value}" for name, value in bounds.items()) + ")")


def describe_dali_threads(workers: int | None, *, auto_cores: int, host_tail: bool = False,
                          tail_in: str = "processes") -> str:
    """One line for ``show``: the threads each DALI backend gets with this ``loader.workers``
    (``host_tail``: the pipeline has a torch tail, which ``dali-cpu`` runs in worker processes of its
    own, or threads: ``tail_in``, as ``loader.executor`` says)."""
    cpu_threads = dali_threads(workers, gpu=False, auto_cores=auto_cores)
    cpu = f"{cpu_threads}"
    if host_tail:
        graph, tail = host_tail_split(cpu_threads)
        cpu = (f"{graph}, and {tail} torch tail {'worker processes' if tail_in == 'processes' else 'threads'} "
               f"after it (half the threads go to DALI)")
    if workers is not None:
        return f"DALI threads (loader.workers {workers}): dali {max(1, workers)}, dali-cpu {cpu}"
    return f"DALI threads (workers auto): dali {describe_gpu_threads()}, dali-cpu {cpu}"


class InFlightCopies:
    """Sources of device-to-device copies still running, kept referenced until their event fires.

    DALI's output memory is not torch's: the caching allocator cannot delay its reuse, so the
    tensor viewing it must live until the copy reading it has finished on the GPU. Finished
    copies are dropped by polling their events (``query`` never blocks the host).
    """

    def __init__(self) -> None:
        self.pending: deque[tuple[Any, torch.Tensor]] = deque()

    def hold(self, event: Any, source: torch.Tensor) -> None:
        self.pending.append((event, source))

    def release_finished(self) -> None:
        while self.pending and self.pending[0][0].query():
            self.pending.popleft()

    def __len__(self) -> int:
        return len(self.pending)


class TailStream:
    """Where a GPU torch tail runs: a side stream of DALI's device, the one DALI binds its outputs
    to. The host queues the tail's kernels there and, where a kernel waits for the device (a small
    host-to-device copy inside torchvision's affine, say), waits only for DALI's and the tail's own
    work, never for the training step queued on the consumer's stream. The consumer's stream then
    waits for the tail's end (an event), and the output is recorded as used on it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def run(self, tail: Callable[[], torch.Tensor], inputs: Any, in_flight: "InFlightCopies") -> torch.Tensor:
        """``tail()`` on the side stream; ``inputs`` (DALI's outputs it reads) kept alive until it ran."""
        with torch.cuda.stream(self.stream):
            output = tail()
            done = torch.cuda.Event()
            done.record(self.stream)
        in_flight.hold(done, inputs)
        consumer = torch.cuda.current_stream(self.device)
        consumer.wait_event(done)
        if output.device.type == "cuda":
            output.record_stream(consumer)  # allocated on the side stream, used on the consumer's
        return output


def keep_alive(tensor: torch.Tensor, owner: Any) -> torch.Tensor:
    """Keep ``owner`` (the DALI outputs a zero-copy ``tensor`` views) referenced as long as ``tensor``
    lives. DALI orders its buffer's free when the TensorList dies; a consumer that fetches batch k+1
    before it computes on batch k (a look-ahead prefetcher) queues that work later, so the buffer
    must outlive the tensor, not the loader's handling of it."""
    weakref.finalize(tensor, _release, owner)
    return tensor


def _release(owner: Any) -> None:
    """The finalizer's reference to ``owner`` ends with it."""


def move_output(tensor: torch.Tensor, device: torch.device, in_flight: InFlightCopies) -> torch.Tensor:
    """``tensor`` (a view of DALI's output) on ``device``.

    To or from the CPU the copy blocks: PyTorch documents that a non-blocking device-to-host copy
    may be read before it lands, and DALI may reuse the source as soon as the view is dropped.
    Between two CUDA devices the copy is queued on the source device's current stream (where
    PyTorch runs peer copies) and the source is kept alive until an event recorded after it fires.
    """
    in_flight.release_finished()
    if tensor.device == device:
        return tensor
    if tensor.device.type != "cuda" or device.type != "cuda":
        return tensor.to(device, non_blocking=False)
    moved = tensor.to(device, non_blocking=True)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(tensor.device))
    in_flight.hold(event, tensor)
    return moved


def copy_batch_to_host(batch: torch.Tensor) -> torch.Tensor:
    """``batch`` (on a GPU) copied to the host, blocking: the one copy of a batch whose torch tail runs
    there (a PIL kernel). This function makes that copy and nothing else, because the device check
    excuses the host sync it causes, and no other (:func:`made_by_host_copy`)."""
    return batch.to("cpu", non_blocking=False)


def images_to_host(images: list[torch.Tensor]) -> list[torch.Tensor]:
    """Images of different sizes (on a GPU) on the host, in one copy for the batch: laid end to end on
    the GPU (a kernel there, no host wait), copied by :func:`copy_batch_to_host`, then viewed back as
    the images on the host. The same bytes as one copy each, with one host wait instead of one per image."""
    if not images:
        return []
    host = copy_batch_to_host(torch.cat([image.reshape(-1) for image in images]))
    return [part.view(image.shape) for part, image in zip(host.split([image.numel() for image in images]), images)]


def made_by_host_copy(frames: Sequence[Any]) -> bool:
    """Whether a host sync with this Python stack (``traceback.FrameSummary`` list, outermost first) is
    :func:`copy_batch_to_host`'s copy: the innermost of the bridge's frames is that function's code
    (its file and name, read from the function itself, so a rename or a move keeps the rule)."""
    code = copy_batch_to_host.__code__
    ours = [frame for frame in frames if "dali_bridge" in Path(frame.filename).parts]
    return bool(ours) and ours[-1].name == code.co_name and \
        os.path.realpath(ours[-1].filename) == os.path.realpath(code.co_filename)


def memory_snapshot(device: int | None = None) -> dict[str, int | None]:
    """This process's memory now, in bytes: GPU memory in use on ``device`` (the whole device, as
    the driver reports it: DALI's pools are not torch's, so torch's counters miss them), torch's
    own share of it, and host memory — resident, locked and pinned as Linux reports them (pinned
    CUDA host memory may not show in either; DALI's decoder paddings are counted by ``doctor``)."""
    figures: dict[str, int | None] = {"gpu_used": None, "gpu_total": None, "torch_allocated": None,
                                      "host_rss": None, "host_locked": None, "host_pinned": None}
    if visible_cuda_devices():
        index = torch.cuda.current_device() if device is None else device
        free, total = torch.cuda.mem_get_info(index)
        figures.update(gpu_used=total - free, gpu_total=total, torch_allocated=torch.cuda.memory_allocated(index))
    try:
        with open("/proc/self/status") as status:
            fields = dict(line.split(":", 1) for line in status if ":" in line)
    except OSError:
        return figures
    for key, name in (("host_rss", "VmRSS"), ("host_locked", "VmLck"), ("host_pinned", "VmPin")):
        if name in fields:
            figures[key] = int(fields[name].split()[0]) * 1024  # reported in kB
    return figures


def on_side_stream(stream: Any, make: Callable[[], Any]) -> tuple[Any, Any]:
    """What ``make()`` returns, its GPU work queued on ``stream`` (a finish off the consumer's stream,
    so the next batch's finish overlaps the training step), and the CUDA event that marks it done."""
    with torch.cuda.stream(stream):
        made = make()
        done = torch.cuda.Event()
        done.record(stream)
    return made, done


def ready_on_consumer(device: Any, image: torch.Tensor | list[torch.Tensor], done: Any) -> None:
    """Make the consumer's stream wait for ``done`` only, not for later work on the side stream, and
    mark each tensor of ``image`` (one, or one per view) as used there: allocated on the side stream,
    its memory must not be reused before the consumer is through with it."""
    consumer = torch.cuda.current_stream(device)
    consumer.wait_event(done)
    for tensor in image if isinstance(image, list) else [image]:
        tensor.record_stream(consumer)
