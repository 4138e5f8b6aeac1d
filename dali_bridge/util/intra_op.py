"""One intra-op thread for the calling thread alone: what DataLoader gives each worker process.

A thread that is itself a unit of parallelism — a DALI tail thread, a ``loader.executor: threads``
sample thread — runs torch's CPU kernels with one thread, as DataLoader's worker processes do
(``torch.set_num_threads(1)`` there): a kernel that splits its work over OpenMP threads of its own
on top of the loader's threads oversubscribes the cores (docs/performance.md).

``torch.set_num_threads`` cannot do this: it also sets the process-wide count that every thread
adopts on its first parallel kernel (the training loop's own thread included, if it has not run
one yet) and MKL's. OpenMP's own ``omp_set_num_threads`` sets the calling thread's count only;
torch reads that count (``omp_get_max_threads``) for each kernel. ATen initialises a thread's count
on its first use, so it is made to do that first, else it would overwrite the one set here.
"""
from __future__ import annotations

import ctypes
from contextlib import contextmanager
from functools import lru_cache
from typing import Iterator

import torch

__all__ = ["single_intra_op_thread", "one_intra_op_thread_here"]

# The OpenMP runtimes torch's wheels link (GNU's on Linux, LLVM's and Intel's elsewhere).
_RUNTIMES = ("libgomp", "libomp", "libiomp5")


def single_intra_op_thread() -> bool:
    """Run torch's CPU kernels called from this thread on one thread; other threads keep theirs.
    False (nothing changed) where torch does not parallelise with an OpenMP runtime found loaded."""
    runtime = openmp_runtime()
    if runtime is None:
        return False
    torch.get_num_threads()  # ATen's per-thread initialisation, before the count is set
    runtime.omp_set_num_threads(1)
    return torch.get_num_threads() == 1


@contextmanager
def one_intra_op_thread_here() -> Iterator[None]:
    """Within the block, this thread's torch kernels run on one thread; its count is restored after.

    For work on the consumer's thread that is a stream of small kernels (the stage after the finish):
    each would otherwise fork and join an OpenMP team whose threads then spin, waiting for the next,
    on cores the loader's own threads are using."""
    runtime = openmp_runtime()
    if runtime is None:
        yield
        return
    before = torch.get_num_threads()  # also ATen's per-thread initialisation, before the count is set
    runtime.omp_set_num_threads(1)
    try:
        yield
    finally:
        runtime.omp_set_num_threads(before)


@lru_cache(maxsize=1)
def openmp_runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime torch loaded (opened again by its path: the same library), or None."""
    if "OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:  # not Linux: no map of loaded libraries to find it in
        return None
    found = sorted(path for path in paths if path.rsplit("/", 1)[-1].startswith(_RUNTIMES))
    if not found:
        return None
    runtime = ctypes.CDLL(found[0])
    runtime.omp_set_num_threads.argtypes = [ctypes.c_int]
    return runtime
