"""An ordered, bounded pool of threads in this process: the torchvision backend's executor under
``loader.executor: threads``.

The design of SPDL (arXiv 2504.20067): the per-sample work runs in threads of the main process —
torchvision's decoders and kernels release the GIL while they work — so nothing is pickled, no
batch crosses shared memory and no worker process starts (or dies on its own). Results come
back in the order of their items, with at most ``in_flight`` items submitted and not yet handed
over (DataLoader holds ``prefetch`` batches per worker process the same way).
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Iterable, Iterator


class OrderedPool:
    """``threads`` threads, started on first use and kept until :meth:`close` (as DataLoader's
    persistent workers are); :meth:`map` may be called again after a close (new threads).
    ``initializer()`` runs in each thread before its first item: per-thread state the work needs,
    such as the loader's CUDA device (``torch.cuda.set_device`` is per thread, and a new thread has
    GPU 0 current)."""

    def __init__(self, threads: int, *, name: str, initializer: Callable[[], None] | None = None):
        if threads < 1:
            raise ValueError(f"an OrderedPool needs at least 1 thread, not {threads}")
        self.threads, self.name, self.initializer = threads, name, initializer
        self._pool: ThreadPoolExecutor | None = None

    def map(self, work: Callable[[Any], Any], items: Iterable[Any], *, in_flight: int) -> Iterator[Any]:
        """``work(item)`` for each item in threads, yielded in the items' order. A failure is
        raised when its item's turn comes (the results before it yielded first). Leaving early
        (the consumer's ``close``, a failure) cancels the items not started and waits for those
        running, so no thread is still working for this iteration when it ends."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self.name, initializer=self.initializer)
        pool, pending = self._pool, deque()
        try:
            for item in items:
                pending.append(pool.submit(work, item))
                if len(pending) >= max(1, in_flight):
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            abandon(pending)

    def close(self) -> None:
        """Stop the threads: the items not started are cancelled, the running ones finish first."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def abandon(futures: Iterable[Future]) -> None:
    """Cancel what has not started and wait for what has. Only those: a future its pool cancelled in
    ``shutdown(cancel_futures=True)`` never counts as done, and waiting for it would never end."""
    wait([future for future in futures if not future.cancel()])
