"""What the host can give a loader: cores, open files and memory, checked before anything starts.

A pipeline file is valid anywhere; whether its ``loader`` settings fit is a property of the host
it runs on, so these checks run when a loader is built (:func:`check_loader_limits`), each
problem naming the key, the bound and the host fact it comes from. Without them ``workers:
40000`` forks until the process table or the open-file limit gives out, and ``prefetch: 20000``
allocates buffers until memory does.
"""
from __future__ import annotations

import math
import resource
from dataclasses import dataclass

from ..util.dtypes import item_bytes
from ..util.checks import shown
from ..pipeline.plan import Plan
from ..spec.pipeline import PipelineSpec
from ..spec.problems import Problem, SpecError
from ..ops.base import Category
from ..ops.facets import Sizing, facet

# Workers beyond this many per core only queue for the same cores (reading from slow storage
# may want a few per core, not hundreds).
WORKERS_PER_CORE = 8
MIN_WORKER_BOUND = 32
# Descriptors the main process holds per DataLoader worker (its queues and process handle, as
# measured: 5-6), plus one per batch in flight (shared memory travels as a descriptor), plus
# what the process itself needs (shards kept open, logs, DALI).
FDS_PER_WORKER = 6
FDS_RESERVED = 256
# Output buffers may take at most this share of the memory available.
MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class HostLimits:
    """The host facts the checks use: usable cores, the soft open-file limit, memory available (bytes;
    None when unknown) and where that figure comes from (``memory_bound``, quoted in messages)."""
    cores: int
    open_files: int
    memory_available: int | None
    memory_bound: str = "memory available"


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _cgroup_headroom() -> int | None:
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as handle:
            limit = handle.read().strip()
        with open("/sys/fs/cgroup/memory.current", encoding="ascii") as handle:
            used = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    return max(0, int(limit) - used) if limit.isdigit() else None


def _process_status() -> dict[str, int]:
    """This process's ``/proc/self/status`` sizes in bytes (VmSize, VmData, ...); empty when unreadable."""
    sizes: dict[str, int] = {}
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                key, _, rest = line.partition(":")
                fields = rest.split()
                if len(fields) == 2 and fields[1] == "kB" and fields[0].isdigit():
                    sizes[key] = int(fields[0]) * 1024
    except OSError:
        pass
    return sizes


# A process limit and the /proc/self/status size it caps: ``ulimit -v`` (RLIMIT_AS) caps the address
# space, RLIMIT_DATA the data segments; an allocation past either fails however much memory is free.
_RLIMITS = (("RLIMIT_AS", "ulimit -v", "VmSize"), ("RLIMIT_DATA", "ulimit -d", "VmData"))


def _rlimit_headroom() -> list[tuple[int, str]]:
    """(bytes this process may still allocate, which limit) for each soft RLIMIT_AS / RLIMIT_DATA set."""
    found, status = [], None
    for name, shell, used_key in _RLIMITS:
        soft, _ = resource.getrlimit(getattr(resource, name))
        if soft == resource.RLIM_INFINITY:
            continue
        status = _process_status() if status is None else status
        found.append((max(0, soft - status.get(used_key, 0)), f"{name} ({shell}) headroom"))
    return found


def _memory_available() -> tuple[int | None, str]:
    """The least of MemAvailable, the cgroup v2 limit's headroom and the process limits' headroom,
    and which it is."""
    found = [(value, what) for value, what in ((_meminfo_available(), "memory available"),
                                               (_cgroup_headroom(), "cgroup memory.max headroom")) if value is not None]
    found += _rlimit_headroom()
    return min(found) if found else (None, "memory available")


def host_limits() -> HostLimits:
    """This process's limits now."""
    from ..backends.base import default_workers

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    open_files = soft if soft != resource.RLIM_INFINITY else 1 << 20
    memory, bound = _memory_available()
    return HostLimits(cores=default_workers(), open_files=open_files, memory_available=memory, memory_bound=bound)


def _size(count: float) -> str:
    if count >= 1024 ** 6:  # a count too large for a float (prefetch: 10^400) is still a message
        return "more than 1024 PiB"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if count < 1024 or unit == "PiB":
            return f"{count:.1f} {unit}" if unit != "B" else f"{int(count)} B"
        count /= 1024
    return f"{count:.1f} PiB"


# A shorter-side resize without ``max_size`` is sized for images up to this aspect ratio (longer side
# over shorter side; panoramas included): the image's own shape is not known before it is decoded.
SIZED_ASPECT = 4
# Bytes per pixel a per-sample step holds at its largest. Every step makes a uint8 RGB image (3).
# On torchvision a pixel op (colour, blur, the augment policies) works on float32 copies of the
# image in the layouts its kernels want: the peak memory over its input, measured on 2000 x 2000
# and 3000 x 3000 images, was up to 205 bytes a pixel (augmix; color_jitter and gaussian_blur
# about 150, trivial_augment_wide 170).
IMAGE_BYTES = 3
TORCHVISION_PIXEL_BYTES = 256


@dataclass(frozen=True)
class StepMemory:
    """The most one sample needs at one step of the plan: ``bytes``, the spec op (``op_index``), the
    image's (height, width) and what is counted (``held``: a message's words, ``{size}`` and ``{pixels}``
    to fill)."""
    bytes: int
    op_index: int | None
    size: tuple[int, int] | None
    held: str


def _step_image_size(step, current: tuple[int, int] | None) -> tuple[int, int] | None:
    """(height, width) of the image after ``step``, at most: a size the step sets (a shorter-side
    resize as side x ``max_size``, or side x :data:`SIZED_ASPECT` x side), else ``current``."""
    size = facet(step.op, Sizing).step_size(step.params)
    if size is None:
        return current
    if len(size) == 1:  # a shorter side
        request = facet(step.op, Sizing).resize_request(step.params)
        return size[0], (request.max_size if request else None) or SIZED_ASPECT * size[0]
    return size[0], size[1]


def largest_step_memory(plan: Plan, *, backend: str = "dali") -> StepMemory:
    """The step of the plan (before the finish) whose image needs the most memory per sample on
    ``backend``: each image a step makes, as uint8 RGB, and on torchvision a pixel op's float32
    working copies too (:data:`TORCHVISION_PIXEL_BYTES` a pixel). The decoded input is not counted: its size is
    the image's own, bounded by ``source.max_pixels``; nor are steps before the first that sets a size."""
    largest = StepMemory(0, None, None, "")
    current: tuple[int, int] | None = None
    for step in plan.steps:
        current = _step_image_size(step, current)
        if current is None:
            continue
        pixels = current[0] * current[1]
        if backend == "torchvision" and step.op.category is Category.PIXEL:
            memory = StepMemory(TORCHVISION_PIXEL_BYTES * pixels, step.op_index, current,
                                "needs {size} per image ({pixels} pixels, with the float32 copies torchvision's "
                                f"kernels work on: up to {TORCHVISION_PIXEL_BYTES} bytes a pixel)")
        else:
            memory = StepMemory(IMAGE_BYTES * pixels, step.op_index, current,
                                "makes images of {size} each (uint8 RGB, {pixels} pixels)")
        if memory.bytes > largest.bytes:
            largest = memory
    return largest


def largest_sample_image(plan: Plan) -> tuple[int, int | None]:
    """(bytes, op position) of the largest per-sample image the plan's steps make before the finish,
    as uint8 RGB (:func:`largest_step_memory` on DALI); (0, None) when no step sets a size."""
    largest = largest_step_memory(plan)
    return largest.bytes, largest.op_index


def loader_limit_problems(spec: PipelineSpec, plan: Plan, *, backend: str, host: HostLimits) -> list[Problem]:
    """Every ``loader`` setting the host cannot honour, as problems naming the bound and its reason."""
    problems: list[Problem] = []
    workers = host.cores if spec.loader.workers is None else spec.loader.workers
    prefetch = spec.loader.prefetch
    worker_bound = max(MIN_WORKER_BOUND, WORKERS_PER_CORE * host.cores)
    if workers > worker_bound:
        what = "threads" if backend.startswith("dali") else "worker processes"
        problems.append(Problem(spec.origin, "loader.workers",
                                f"{shown(workers)} {what} on {host.cores} core(s): at most {worker_bound} "
                                f"(max({MIN_WORKER_BOUND}, {WORKERS_PER_CORE} per core)); more only queue for "
                                f"the same cores — use 'auto' ({host.cores} here)"))
    processes = workers if backend == "torchvision" else 0
    descriptors = processes * (FDS_PER_WORKER + prefetch) + FDS_RESERVED
    if processes and descriptors > host.open_files:
        problems.append(Problem(spec.origin, "loader", f"workers {shown(workers)} x (prefetch {shown(prefetch)} "
                                f"+ {FDS_PER_WORKER}) + {FDS_RESERVED} = {shown(descriptors)} open files needed, over "
                                f"this process's limit of {host.open_files} (ulimit -n): lower workers or prefetch, "
                                f"or raise the limit"))
    memory = _memory_problem(spec, plan, backend=backend, host=host, workers=workers)
    return problems + ([memory] if memory else [])


def _memory_problem(spec: PipelineSpec, plan: Plan, *, backend: str, host: HostLimits, workers: int) -> Problem | None:
    """Whether the batches in flight and the images the plan makes on the way fit half the memory.

    DALI runs each step on the whole batch and keeps ``prefetch`` + 1 batches in flight, so each
    holds a batch of its largest image; torchvision workers transform one sample at a time and
    hand over uint8 batches, ``prefetch`` + 2 per worker.
    """
    prefetch, batch = spec.loader.prefetch, spec.batch_size
    item = item_bytes(plan.finish.dtype) if backend != "torchvision" else 1  # workers hold uint8 batches
    batch_bytes = sum(math.prod(view.output_shape(batch)) for view in plan.view_plans) * item  # every view's batch
    largest = largest_step_memory(plan, backend=backend)
    step_bytes, position = largest.bytes, largest.op_index
    if backend == "torchvision":
        slots = max(1, workers) * (prefetch + 2)
        in_steps = max(1, workers) * step_bytes
        needed = slots * batch_bytes + in_steps
    else:
        slots = prefetch + 1
        in_steps = slots * batch * step_bytes
        needed = max(slots * batch_bytes, in_steps)
    if host.memory_available is None or needed <= MEMORY_SHARE * host.memory_available:
        return None
    available = f"over half of the {_size(host.memory_available)} of {host.memory_bound}"
    # The images on the way are to blame when they outweigh the batch buffers, unless the least
    # prefetch (1) would fit: then it is the prefetch (DALI holds a batch of them per batch in flight).
    least = (max(2 * batch_bytes, 2 * batch * step_bytes) if backend != "torchvision" else needed)
    if in_steps > slots * batch_bytes and position is not None and least > MEMORY_SHARE * host.memory_available:
        # a step before the finish: an op of the spec (with views, the first view's chain: the shared ops, its group's)
        chain = [*spec.ops, *(spec.views[0].ops if spec.views else ())]
        op = chain[position].name
        shared = len(spec.ops)
        where = f"ops[{position}]" if position < shared else f"views.{plan.group}.ops[{position - shared}]"
        if backend == "torchvision":
            holders = f"{shown(max(1, workers))} worker(s) holding one each, with their batch buffers,"
            lower = "workers"
        else:
            holders = f"{shown(slots)} batches of {shown(batch)} in flight (prefetch {shown(prefetch)} + 1)"
            lower = "batch_size or prefetch"
        return Problem(spec.origin, f"{where}.{op}",
                       f"{largest.held.format(size=_size(step_bytes), pixels='x'.join(map(shown, largest.size)))}"
                       f" on the way to the output, and "
                       f"{holders} need {_size(needed)}, {available}: make the images smaller earlier (crop "
                       f"before a large resize), or lower {lower}")
    per_slot = batch_bytes * max(1, workers) if backend == "torchvision" else max(batch_bytes, batch * step_bytes)
    fit = int(MEMORY_SHARE * host.memory_available) // per_slot - (2 if backend == "torchvision" else 1)
    advice = f"lower prefetch (up to {fit} fits)," if fit >= 1 else "even prefetch 1 does not fit: lower"
    # a batch's images: one tensor, or with views each view's (``+``)
    shapes = " + ".join("x".join(map(shown, view.output_shape(batch))) for view in plan.view_plans)
    return Problem(spec.origin, "loader.prefetch",
                   f"{shown(slots)} batch buffers of {_size(batch_bytes)} "
                   f"({shapes} "
                   f"{'uint8' if item == 1 else plan.finish.dtype}) need {_size(needed)}, {available}: {advice} "
                   f"batch_size or workers")


def check_loader_limits(spec: PipelineSpec, plan: Plan, *, backend: str, host: HostLimits | None = None) -> None:
    """Raise :class:`~dali_bridge.spec.problems.SpecError` if the loader settings exceed what ``host`` (default:
    this host now) can give: workers per core, open files, memory for prefetched batches."""
    problems = loader_limit_problems(spec, plan, backend=backend, host=host or host_limits())
    if problems:
        raise SpecError(problems, spec.origin)
