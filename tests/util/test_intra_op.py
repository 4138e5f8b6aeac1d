"""One intra-op thread for the calling thread alone (intra_op.py): what a DataLoader worker
process gets, given to the loader's own threads without touching any other thread's count."""
from __future__ import annotations

import threading

import pytest
import torch

from dali_bridge.util.intra_op import openmp_runtime, single_intra_op_thread

needs_openmp = pytest.mark.skipif(openmp_runtime() is None,
                                  reason="torch here does not parallelise with an OpenMP runtime found loaded")


def in_thread(work):
    found = {}
    thread = threading.Thread(target=lambda: found.setdefault("value", work()))
    thread.start()
    thread.join()
    return found["value"]


@needs_openmp
@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one intra-op thread is already the default here")
def test_the_calling_thread_runs_on_one_thread_and_every_other_thread_keeps_its_count():
    default = torch.get_num_threads()

    def set_then_compute() -> tuple[bool, int]:
        done = single_intra_op_thread()
        torch.ones(1 << 20).mul(2).sum()  # a kernel large enough to split: the count survives it
        return done, torch.get_num_threads()

    assert in_thread(set_then_compute) == (True, 1)
    assert torch.get_num_threads() == default               # this thread
    assert in_thread(torch.get_num_threads) == default      # a thread started afterwards


def test_without_an_openmp_runtime_nothing_changes(monkeypatch):
    monkeypatch.setattr(torch.__config__, "parallel_info", lambda: "ATen parallel backend: native thread pool")
    openmp_runtime.cache_clear()
    try:
        default = torch.get_num_threads()
        assert in_thread(single_intra_op_thread) is False
        assert in_thread(torch.get_num_threads) == default
    finally:
        openmp_runtime.cache_clear()


@needs_openmp
@pytest.mark.skipif(torch.get_num_threads() < 2, reason="one intra-op thread is already the default here")
def test_one_intra_op_thread_here_lasts_for_the_block_and_restores_the_threads_count():
    from dali_bridge.util.intra_op import one_intra_op_thread_here

    def inside_then_after() -> tuple[int, int, int]:
        before = torch.get_num_threads()
        with one_intra_op_thread_here():
            inside = torch.get_num_threads()
            torch.ones(1 << 20).mul(2).sum()
        return before, inside, torch.get_num_threads()

    before, inside, after = in_thread(inside_then_after)
    assert inside == 1 and after == before == torch.get_num_threads()
    with pytest.raises(ZeroDivisionError), one_intra_op_thread_here():  # restored when the block raises too
        1 / 0
    assert torch.get_num_threads() == before
