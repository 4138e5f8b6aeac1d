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

from .plan import Plan
from .spec import PipelineSpec, Problem, SpecError

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
_ITEM_BYTES = {"float32": 4, "float16": 2, "uint8": 1}


@dataclass(frozen=True)
class HostLimits:
    """The host facts the checks use: usable cores, the soft open-file limit, memory available (bytes;
    None when unknown)."""
    cores: int
    open_files: int
    memory_available: int | None


def _memory_available() -> int | None:
    """MemAvailable from /proc/meminfo, lowered to a cgroup v2 memory limit when one is set."""
    found: list[int] = []
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as handle:
            limit = handle.read().strip()
        with open("/sys/fs/cgroup/memory.current", encoding="ascii") as handle:
            used = int(handle.read().strip())
        if limit.isdigit():
            found.append(max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def host_limits() -> HostLimits:
    """This process's limits now."""
    from .backends.base import default_workers

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    open_files = soft if soft != resource.RLIM_INFINITY else 1 << 20
    return HostLimits(cores=default_workers(), open_files=open_files, memory_available=_memory_available())


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if count < 1024 or unit == "PiB":
            return f"{count:.1f} {unit}" if unit != "B" else f"{int(count)} B"
        count /= 1024
    return f"{count:.1f} PiB"


def loader_limit_problems(spec: PipelineSpec, plan: Plan, *, backend: str, host: HostLimits) -> list[Problem]:
    """Every ``loader`` setting the host cannot honour, as problems naming the bound and its reason."""
    problems: list[Problem] = []
    workers = host.cores if spec.loader.workers is None else spec.loader.workers
    prefetch = spec.loader.prefetch
    worker_bound = max(MIN_WORKER_BOUND, WORKERS_PER_CORE * host.cores)
    if workers > worker_bound:
        what = "threads" if backend.startswith("dali") else "worker processes"
        problems.append(Problem(spec.origin, "loader.workers",
                                f"{workers} {what} on {host.cores} core(s): at most {worker_bound} "
                                f"(max({MIN_WORKER_BOUND}, {WORKERS_PER_CORE} per core)); more only queue for "
                                f"the same cores — use 'auto' ({host.cores} here)"))
    processes = workers if backend == "torchvision" else 0
    descriptors = processes * (FDS_PER_WORKER + prefetch) + FDS_RESERVED
    if processes and descriptors > host.open_files:
        problems.append(Problem(spec.origin, "loader", f"workers {workers} x (prefetch {prefetch} + "
                                f"{FDS_PER_WORKER}) + {FDS_RESERVED} = {descriptors} open files needed, over this "
                                f"process's limit of {host.open_files} (ulimit -n): lower workers or prefetch, "
                                f"or raise the limit"))
    item = _ITEM_BYTES[plan.finish.dtype] if backend != "torchvision" else 1  # workers hold uint8 batches
    batch_bytes = math.prod(plan.output_shape(spec.batch_size)) * item
    # torchvision: each worker cycles through prefetch + 2 buffers; DALI: its prefetch queue plus
    # the batch being handed over.
    slots = max(1, workers) * (prefetch + 2) if backend == "torchvision" else prefetch + 1
    needed = slots * batch_bytes
    if host.memory_available is not None and needed > MEMORY_SHARE * host.memory_available:
        per_slot = batch_bytes * (max(1, workers) if backend == "torchvision" else 1)
        fit = int(MEMORY_SHARE * host.memory_available // per_slot) - (2 if backend == "torchvision" else 1)
        advice = f"lower prefetch (up to {fit} fits)," if fit >= 1 else "even prefetch 1 does not fit: lower"
        problems.append(Problem(spec.origin, "loader.prefetch",
                                f"{slots} batch buffers of {_size(batch_bytes)} "
                                f"({'x'.join(map(str, plan.output_shape(spec.batch_size)))} "
                                f"{'uint8' if item == 1 else plan.finish.dtype}) need {_size(needed)}, over half of "
                                f"the {_size(host.memory_available)} of memory available: {advice} "
                                f"batch_size or workers"))
    return problems


def check_loader_limits(spec: PipelineSpec, plan: Plan, *, backend: str, host: HostLimits | None = None) -> None:
    """Raise :class:`~dali_bridge.spec.SpecError` if the loader settings exceed what ``host`` (default:
    this host now) can give: workers per core, open files, memory for prefetched batches."""
    problems = loader_limit_problems(spec, plan, backend=backend, host=host or host_limits())
    if problems:
        raise SpecError(problems, spec.origin)
