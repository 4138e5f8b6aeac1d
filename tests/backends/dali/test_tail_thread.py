"""dali-cpu's tail thread: the torch tail (and the finish) of batch k runs beside DALI's run of
batch k+1, with the order, the errors and the end of an epoch as without it.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.backends import backend_params
from dali_bridge import build_loader
from dali_bridge.backends.dali import executor as dali_backend
from dali_bridge.backends.dali import tail_runner
from dali_bridge.backends.dali.outputs import as_chw
from dali_bridge.backends.dali.tail_runner import TailRunner
from tests.helpers.hostile import break_file, write_image_folder

DALI_CPU = backend_params(["dali-cpu"])
BOTH = backend_params(["dali-cpu", "torchvision"])


def tail_pipeline(root: Path, *, on_error: str = "skip") -> dict[str, Any]:
    """Three batches of four through a torch tail (trivial_augment_wide after the resize), in threads
    (``loader.executor: threads``; test_tail_processes.py pins the processes to these batches)."""
    return {"version": 1, "name": "tail-thread", "source": {"type": "folder", "root": str(root)}, "batch_size": 4,
            "seed": 3, "ops": [{"random_resized_crop": {"size": 24}}, {"trivial_augment_wide": {}},
                               {"normalize": {"dtype": "uint8"}}],
            "outputs": ["image", "label", "index"],
            "loader": {"workers": 1, "on_error": on_error, "shuffle": True, "executor": "threads"}}


def epoch(loader) -> list[tuple[list[int], torch.Tensor]]:
    return [(index.tolist(), image.clone()) for image, _, index in loader]


@pytest.mark.parametrize("backend", DALI_CPU)
def test_dali_runs_the_next_batch_while_the_tail_thread_converts_this_one(tmp_path, monkeypatch, backend):
    write_image_folder(tmp_path / "data", classes=2, per_class=6)
    runs, tails, second_run = [], [], threading.Event()
    real_next, real_tail = dali_backend.DaliExecutor._next_batch, TailRunner.run

    def next_batch(self, pipe):
        runs.append(threading.current_thread().name)
        if len(runs) == 2:
            second_run.set()
        return real_next(self, pipe)

    def run_tail(self, outputs, tail):
        # The first batch's tail waits for DALI's next run: without the overlap it would wait in vain.
        overlapped = second_run.wait(timeout=60) if not tails else True
        tails.append((threading.current_thread().name, overlapped))
        return real_tail(self, outputs, tail)

    monkeypatch.setattr(dali_backend.DaliExecutor, "_next_batch", next_batch)
    monkeypatch.setattr(TailRunner, "run", run_tail)
    loader = build_loader(tail_pipeline(tmp_path / "data"), backend)
    assert len(epoch(loader)) == 3
    assert tails[0] == ("dali-bridge-tail_0", True)
    assert {name for name, _ in tails} == {"dali-bridge-tail_0"} and set(runs) == {threading.main_thread().name}
    loader.close()


@pytest.mark.parametrize("backend", DALI_CPU)
def test_the_tail_threads_batches_come_in_order_with_torchvisions_pixels_epoch_after_epoch(tmp_path, backend):
    write_image_folder(tmp_path / "data", classes=2, per_class=6)
    spec = tail_pipeline(tmp_path / "data")
    reference = build_loader(spec, "torchvision")
    loader = build_loader(spec, backend)
    for number in range(2):  # the end of the first epoch rewound the pipeline and the thread's queue
        reference.set_epoch(number)
        loader.set_epoch(number)
        expected, got = epoch(reference), epoch(loader)
        assert [index for index, _ in got] == [index for index, _ in expected]
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, expected))
    reference.close()
    loader.close()


@pytest.mark.parametrize("backend", DALI_CPU)
@pytest.mark.parametrize("failing", [1, 2], ids=["middle-batch", "last-batch"])
def test_a_tail_failure_in_the_thread_blames_that_batch_and_is_raised_as_it_is(tmp_path, monkeypatch, backend,
                                                                               failing):
    write_image_folder(tmp_path / "data", classes=2, per_class=6)
    searched = []
    monkeypatch.setattr(dali_backend.DaliExecutor, "_find_culprits", lambda self, task: searched.append(task) or [])
    real_tail, calls = TailRunner.run, []

    class TailFailure(Exception):
        pass

    def run_tail(self, outputs, tail):
        calls.append(threading.current_thread().name)
        if len(calls) == failing + 1:
            raise TailFailure(f"the tail's kernel failed on batch {failing}")
        return real_tail(self, outputs, tail)

    monkeypatch.setattr(TailRunner, "run", run_tail)
    threads = {"workers": 1, "shuffle": False, "executor": "threads"}
    loader = build_loader({**tail_pipeline(tmp_path / "data"), "loader": threads}, backend)
    seen = []
    with pytest.raises(TailFailure, match=f"batch {failing}"):
        for _, _, index in loader:
            seen.append(index.tolist())
    assert seen == [list(range(4 * n, 4 * n + 4)) for n in range(failing)]
    assert loader.state_dict()["batch"] == failing and searched == []   # DALI did not fail: no culprit search
    assert set(calls) == {"dali-bridge-tail_0"}
    loader.close()


@pytest.mark.parametrize("backend", BOTH)
def test_a_dali_failure_behind_a_converting_batch_yields_that_batch_first_then_skips_the_culprit(
        tmp_path, backend):
    files = write_image_folder(tmp_path / "data", classes=2, per_class=6)
    break_file(files[6], "bad_huffman_table")   # passes the header checks: only the decoder fails
    spec = {**tail_pipeline(tmp_path / "data"), "loader": {"workers": 1, "on_error": "skip", "shuffle": False}}
    loader = build_loader(spec, backend)
    assert [index.tolist() for _, _, index in loader] == [[0, 1, 2, 3], [4, 5, 7], [8, 9, 10, 11]]
    assert [item.index for item in loader.skipped] == [6]
    loader.close()


@pytest.mark.parametrize("backend", DALI_CPU)
def test_leaving_an_epoch_early_waits_for_the_tail_thread_and_close_stops_it(tmp_path, backend):
    write_image_folder(tmp_path / "data", classes=2, per_class=6)
    spec = tail_pipeline(tmp_path / "data")
    before = set(threading.enumerate())
    loader = build_loader(spec, backend)
    full = epoch(loader)
    loader.set_epoch(0)
    for _, _, _ in loader:
        break   # the second batch is converting in the thread when the consumer leaves
    threads = [t for t in set(threading.enumerate()) - before if t.name.startswith("dali-bridge-tail")]
    assert len(threads) == 1
    loader.set_epoch(0)
    again = epoch(loader)   # epoch 0 again from its start, on a rebuilt pipeline
    assert [index for index, _ in again] == [index for index, _ in full]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(again, full))
    loader.close()
    threads[0].join(timeout=30)
    assert not threads[0].is_alive()


@pytest.mark.parametrize("backend", DALI_CPU)
def test_with_two_workers_the_tail_runs_in_two_chunks_at_once_beside_one_dali_thread_with_the_same_pixels(
        tmp_path, monkeypatch, backend):
    write_image_folder(tmp_path / "data", classes=2, per_class=7)   # 14 samples: a partial batch of 2 too
    real_run_tail, chunks = tail_runner.run_tail, []

    def run_tail(steps, images, tail, **kwargs):
        chunks.append((threading.current_thread().name, len(tail)))
        return real_run_tail(steps, images, tail, **kwargs)

    monkeypatch.setattr(tail_runner, "run_tail", run_tail)
    spec = tail_pipeline(tmp_path / "data")
    epochs = {}
    for workers in (1, 2):
        chunks.clear()
        with build_loader({**spec, "loader": {**spec["loader"], "workers": workers}}, backend) as loader:
            epochs[workers] = epoch(loader)
            assert loader._executor.pipe.num_threads == 1   # DALI's half of the threads (host_tail_split)
        names = {name.rsplit("_", 1)[0] for name, _ in chunks}
        if workers == 1:
            assert names == {"dali-bridge-tail"} and [size for _, size in chunks] == [4, 4, 4, 2]
        else:  # each batch halved: one half in the tail thread, the other in a helper beside it
            assert names == {"dali-bridge-tail", "dali-bridge-tail-chunk"}
            assert sorted(size for _, size in chunks) == [1, 1, 2, 2, 2, 2, 2, 2]
    assert [index for index, _ in epochs[2]] == [index for index, _ in epochs[1]]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(epochs[2], epochs[1]))


@pytest.mark.parametrize("backend", DALI_CPU)
def test_a_host_tail_runs_torchvisions_per_sample_kernels_with_the_batch_kernels_pixels(tmp_path, monkeypatch,
                                                                                      backend):
    # On the CPU the batch kernels save no launches and cost about twice torchvision's own.
    from dali_bridge.ops.registry import OPS

    write_image_folder(tmp_path / "data", classes=2, per_class=6)
    batch_kernels = []
    policy = type(OPS["trivial_augment_wide"])
    real_batch_kernel = policy.batch_kernel

    def batch_kernel(self, images, concrete, params):
        batch_kernels.append(len(concrete))
        return real_batch_kernel(self, images, concrete, params)

    monkeypatch.setattr(policy, "batch_kernel", batch_kernel)
    spec = {**tail_pipeline(tmp_path / "data"), "parity": "fast"}   # fast: the tail is the policy on one size
    epochs = {}
    for batched in (False, True):
        batch_kernels.clear()
        with build_loader(spec, backend) as loader:
            if batched:
                loader._executor.tail.batched = True   # the GPU's kernels, on the host
            epochs[batched] = epoch(loader)
        assert bool(batch_kernels) == batched
    assert [index for index, _ in epochs[False]] == [index for index, _ in epochs[True]]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(epochs[False], epochs[True]))


@pytest.mark.parametrize("backend", DALI_CPU)
def test_the_tail_threads_run_torch_on_one_intra_op_thread_and_leave_the_consumers_count(tmp_path, monkeypatch,
                                                                                          backend):
    write_image_folder(tmp_path / "data", classes=2, per_class=4)
    real_run_tail, counts = tail_runner.run_tail, {}

    def run_tail(steps, images, tail, **kwargs):
        counts[threading.current_thread().name.rsplit("_", 1)[0]] = torch.get_num_threads()
        return real_run_tail(steps, images, tail, **kwargs)

    monkeypatch.setattr(tail_runner, "run_tail", run_tail)
    spec = tail_pipeline(tmp_path / "data")
    consumer = torch.get_num_threads()
    with build_loader({**spec, "loader": {**spec["loader"], "workers": 2}}, backend) as loader:
        epoch(loader)
    assert counts == {"dali-bridge-tail": 1, "dali-bridge-tail-chunk": 1}
    assert torch.get_num_threads() == consumer


def test_a_host_tail_takes_half_the_loaders_threads_from_dali_and_show_says_so(tmp_path, capsys):
    from dali_bridge.backends.device import describe_dali_threads, host_tail_split
    from dali_bridge.cli.main import main

    assert [host_tail_split(threads) for threads in (0, 1, 2, 3, 4, 8, 16)] == [
        (1, 1), (1, 1), (1, 2), (2, 3), (2, 4), (4, 4), (8, 4)]
    assert describe_dali_threads(6, auto_cores=2, host_tail=True) == (
        "DALI threads (loader.workers 6): dali 6, dali-cpu 3, and 4 torch tail worker processes after it "
        "(half the threads go to DALI)")
    assert "and 4 torch tail threads after it" in describe_dali_threads(6, auto_cores=2, host_tail=True,
                                                                        tail_in="threads")
    assert describe_dali_threads(6, auto_cores=2).endswith("dali-cpu 6")   # no tail: every thread to DALI
    write_image_folder(tmp_path / "data", classes=2, per_class=1)
    path = tmp_path / "tail.yaml"
    import yaml
    path.write_text(yaml.safe_dump({**tail_pipeline(tmp_path / "data"), "loader": {"workers": 2}}))
    assert main(["show", str(path)]) == 0
    assert "dali-cpu 1, and 2 torch tail worker processes after it" in capsys.readouterr().out


@pytest.mark.parametrize("backend", DALI_CPU)
def test_the_host_tail_reads_each_image_as_torchvisions_decoder_lays_it_out(tmp_path, monkeypatch, backend):
    # A CHW view of HWC memory: torchvision's uint8 resize and the PIL conversions take their fast paths,
    # as on the torchvision backend, and no transpose runs in DALI or before PIL.
    from torchvision.io import decode_image

    write_image_folder(tmp_path / "data", classes=2, per_class=2)
    real_run_tail, seen = tail_runner.run_tail, []

    def run_tail(steps, images, tail, **kwargs):
        seen.extend((tuple(image.shape), image.stride()) for image in images)
        return real_run_tail(steps, images, tail, **kwargs)

    monkeypatch.setattr(tail_runner, "run_tail", run_tail)
    with build_loader(tail_pipeline(tmp_path / "data"), backend) as loader:
        epoch(loader)
    decoded = decode_image(str(next((tmp_path / "data").rglob("*.jpg"))))
    assert decoded.stride()[0] == 1   # channels last in memory
    assert seen and all(shape[0] == 3 and stride == (1, shape[2] * 3, 3) for shape, stride in seen)


def test_a_gpu_tail_gets_the_batch_chw_contiguous_and_a_host_tail_a_view():
    hwc = torch.arange(2 * 4 * 5 * 3, dtype=torch.uint8).reshape(2, 4, 5, 3)
    host = as_chw(hwc)
    assert host.shape == (2, 3, 4, 5) and host.data_ptr() == hwc.data_ptr() and torch.equal(host[1, 2], hwc[1, ..., 2])
    device = as_chw(torch.empty((2, 4, 5, 3), dtype=torch.uint8, device="meta"))  # stands for CUDA
    assert device.shape == (2, 3, 4, 5) and device.is_contiguous()
    assert as_chw(hwc[0]).shape == (3, 4, 5)   # one image of a batch whose sizes differ


@pytest.mark.parametrize("backend", DALI_CPU)
@pytest.mark.parametrize("policy, contiguous", [({"trivial_augment_wide": {}}, True),
                                                ({"rand_augment": {"variant": "timm"}}, False)])
def test_after_the_resize_torch_kernels_get_chw_memory_and_pil_kernels_keep_the_hwc_views(tmp_path, monkeypatch,
                                                                                         backend, policy, contiguous):
    # torchvision's kernels after the resize are faster on CHW memory; a PIL kernel converts from HWC memory.
    from dali_bridge.pipeline.plan import build_plan
    from dali_bridge.spec.pipeline import coerce_spec

    write_image_folder(tmp_path / "data", classes=2, per_class=2)
    spec = tail_pipeline(tmp_path / "data")
    spec["ops"][1] = policy
    kind, seen = type(build_plan(coerce_spec(spec)).steps[1].op), []
    real_kernel = kind.torchvision_kernel

    def kernel(self, image, concrete, params):
        seen.append(image.is_contiguous())
        return real_kernel(self, image, concrete, params)

    monkeypatch.setattr(kind, "torchvision_kernel", kernel)
    with build_loader(spec, backend) as loader:
        first = epoch(loader)
    assert seen and set(seen) == {contiguous}
    monkeypatch.setattr(kind, "torchvision_kernel", real_kernel)
    with build_loader(spec, "torchvision") as loader:   # the same pixels either way
        assert all(torch.equal(a, b) for (_, a), (_, b) in zip(epoch(loader), first))


@pytest.mark.parametrize("backend", DALI_CPU)
def test_an_epoch_left_after_the_loader_closed_ends_though_close_cancelled_its_queued_conversion(
        tmp_path, monkeypatch, backend):
    """``loader.close()`` while an epoch is suspended, then the epoch dropped (``batches = iter(loader)``
    again, ``del``): close's shutdown cancelled the conversion still queued in the tail thread, and such a
    future never counts as done, so leaving the epoch must not wait for it."""
    write_image_folder(tmp_path / "data", classes=2, per_class=6)
    loader = build_loader(tail_pipeline(tmp_path / "data"), backend)
    pool = loader._executor.tail._thread
    release, queued, started, converting = threading.Event(), threading.Event(), threading.Event(), []
    real_convert, real_start = dali_backend.DaliExecutor._convert, dali_backend.DaliExecutor._start_converting
    real_shutdown = pool.shutdown

    def convert(self, *args):
        if not started.is_set():
            started.set()
            assert release.wait(timeout=60)   # the first batch converts until close has cancelled the second
        return real_convert(self, *args)

    def start_converting(self, outputs, batch):
        pending = real_start(self, outputs, batch)
        converting.append(pending)
        if len(converting) == 2:
            queued.set()
        return pending

    def shutdown(wait=True, *, cancel_futures=False):
        real_shutdown(wait=False, cancel_futures=cancel_futures)   # the second batch's conversion is cancelled here
        release.set()
        real_shutdown(wait=wait)

    monkeypatch.setattr(dali_backend.DaliExecutor, "_convert", convert)
    monkeypatch.setattr(dali_backend.DaliExecutor, "_start_converting", start_converting)
    monkeypatch.setattr(pool, "shutdown", shutdown)
    batches = iter(loader)
    first = threading.Thread(target=next, args=(batches,), daemon=True)
    first.start()
    assert queued.wait(timeout=60) and started.wait(timeout=60)
    loader.close()
    first.join(timeout=60)
    assert len(converting[0].result().indices) == 4 and converting[1].cancelled()
    leaving = threading.Thread(target=batches.close, daemon=True)
    leaving.start()
    leaving.join(timeout=60)
    assert not leaving.is_alive(), "leaving the epoch waits for a conversion its pool cancelled"


def test_the_tail_written_into_given_memory_gives_the_stacked_batchs_pixels():
    # A tail worker process writes its rows of the shared batch so: no stacked batch, no second copy.
    from dali_bridge.backends.dali.tail import run_tail
    from dali_bridge.pipeline.plan import build_plan
    from dali_bridge.spec.pipeline import spec_from_dict

    spec = spec_from_dict({"version": 1, "name": "tail-out", "source": {"type": "folder", "root": "."}, "batch_size": 3,
                      "ops": [{"random_resized_crop": {"size": 12}}, {"horizontal_flip": 1.0},
                              {"trivial_augment_wide": {}}],
                      "outputs": ["image", "label"]})
    plan = build_plan(spec)
    generator = torch.Generator().manual_seed(1)
    images = [torch.randint(0, 256, (20, 30, 3), dtype=torch.uint8, generator=generator).permute(2, 0, 1)
              for _ in range(3)]
    tail = [[step.op.sample(step.params, np.full(step.op.draws, 0.3 + 0.2 * n), 20, 30) for step in plan.steps]
            for n in range(3)]
    tail = [[(concrete, (20, 30)) for concrete in sample] for sample in tail]
    stacked = run_tail(plan.steps, images, tail, batched=False, contiguous_after_first=True)
    out = torch.zeros(4, 3, 12, 12, dtype=torch.uint8)
    written = run_tail(plan.steps, images, tail, batched=False, contiguous_after_first=True, out=out[:3])
    assert written.data_ptr() == out.data_ptr()
    assert torch.equal(out[:3], stacked) and not out[3].any()


def test_the_tails_chw_copy_of_an_image_in_hwc_memory_is_its_contiguous_copy():
    from dali_bridge.backends.dali.tail import chw_copy

    image = torch.randint(0, 256, (7, 9, 3), dtype=torch.uint8).permute(2, 0, 1)
    copy = chw_copy(image)
    assert copy.is_contiguous() and torch.equal(copy, image) and copy.data_ptr() != image.data_ptr()
