"""The GPU path's decisions, run on a CPU host with fakes standing in for CUDA and for DALI's GPU.

What only a GPU can show (pixels from nvJPEG, streams really overlapping) is in test_gpu.py; here
are the device choices, copies, orderings and error policies that decide what reaches the user.
"""
from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.paths import TRAIN
from dali_bridge.backends.dali import executor as dali_backend
from dali_bridge.backends import device as device_module
from dali_bridge.backends.base import BatchOutcome, Topology
from dali_bridge.backends.dali.feed import BatchFeed
from dali_bridge.backends.device import InFlightCopies, cuda_ordinal, dali_threads, move_output
from dali_bridge.backends.finishing import finish_batch
from dali_bridge.backends.torchvision import TorchvisionExecutor, prefetched
from dali_bridge.errors import SampleError
from dali_bridge.loader.loader import Loader
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.data.sources.local import list_source
from dali_bridge.spec.pipeline import coerce_spec
from tests.helpers.hostile import break_file, write_image_folder

SIZE = 24


def small_spec(root: Path, *, on_error: str = "raise", workers: int | None = 1, **extra: Any):
    overrides = {"source": {"type": "folder", "root": str(root)}, "batch_size": 4, "seed": 3,
                 "ops.0.random_resized_crop.size": SIZE, "ops.2": {"normalize": {"dtype": "uint8"}},
                 "outputs": ["image", "label", "index", "valid"], "loader.on_error": on_error,
                 "loader.shuffle": False, "loader.workers": workers, **extra}
    return coerce_spec(TRAIN, overrides)


def fake_cuda_host(monkeypatch, devices: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: devices)


def dali_executor(spec, *, device: str | None = None, local_rank: int = 0):
    listing = list_source(spec.source)
    plan = build_plan(spec)
    executor = dali_backend.DaliExecutor(spec, listing, plan, gpu=True, topology=Topology(0, 1, local_rank),
                                         device=device)
    return executor, listing, plan


# ---------------------------------------------------------------------------------------------
# Copies off DALI's GPU memory


class FakeCudaTensor:
    """A CUDA tensor as ``move_output`` sees it: a device and ``to``, which records how it was called."""

    def __init__(self, index: int = 0):
        self.device = torch.device("cuda", index)
        self.calls: list[tuple[torch.device, bool]] = []

    def to(self, device: torch.device, non_blocking: bool = False) -> str:
        self.calls.append((torch.device(device), non_blocking))
        return f"copy on {device}"


class FakeEvent:
    def __init__(self) -> None:
        self.recorded_on: Any = None
        self.done = False

    def record(self, stream: Any) -> None:
        self.recorded_on = stream

    def query(self) -> bool:
        return self.done


def test_gpu_output_for_a_cpu_target_is_copied_blocking():
    source = FakeCudaTensor()
    in_flight = InFlightCopies()
    assert move_output(source, torch.device("cpu"), in_flight) == "copy on cpu"
    assert source.calls == [(torch.device("cpu"), False)]
    assert len(in_flight) == 0


def test_dali_executor_copies_its_gpu_batch_to_a_cpu_target_blocking(tmp_path, monkeypatch):
    write_image_folder(tmp_path / "data", classes=2, per_class=2)
    fake_cuda_host(monkeypatch, 1)
    executor, _, _ = dali_executor(small_spec(tmp_path / "data"), device="cpu")
    source = FakeCudaTensor()
    monkeypatch.setattr(torch, "from_dlpack", lambda _: source)
    task = Loader(executor.spec, executor.listing, executor.plan, executor, "dali", Topology(0, 1, 0)).tasks(0)[0]
    executor._convert([FakeTensorList(None)], BatchFeed(BatchOutcome(task, [0, 1, 2, 3]), tail=[]))
    assert source.calls == [(torch.device("cpu"), False)]


def test_device_to_device_copy_is_non_blocking_and_keeps_its_source_until_the_copy_is_done(monkeypatch):
    events: list[FakeEvent] = []

    def make_event() -> FakeEvent:
        events.append(FakeEvent())
        return events[-1]

    monkeypatch.setattr(torch.cuda, "Event", make_event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"current stream of {device}")
    source = FakeCudaTensor(0)
    in_flight = InFlightCopies()
    move_output(source, torch.device("cuda", 1), in_flight)
    assert source.calls == [(torch.device("cuda", 1), True)]
    assert events[0].recorded_on == f"current stream of {torch.device('cuda', 0)}"   # after the copy, where it runs
    assert len(in_flight) == 1                         # the source stays referenced while the copy runs
    move_output(FakeCudaTensor(1), torch.device("cuda", 1), in_flight)
    assert len(in_flight) == 1                         # not done yet: still held
    events[0].done = True
    move_output(FakeCudaTensor(1), torch.device("cuda", 1), in_flight)
    assert len(in_flight) == 0                         # done: released


# ---------------------------------------------------------------------------------------------
# Which GPU: LOCAL_RANK on the visible devices, an explicit cuda:N


def test_local_rank_wraps_onto_the_visible_devices_and_says_so_once(caplog):
    with caplog.at_level(logging.INFO, logger="dali_bridge"):
        assert cuda_ordinal(3, 1) == 0
        assert cuda_ordinal(3, 1) == 0
        assert cuda_ordinal(5, 4) == 1
        assert cuda_ordinal(2, 8) == 2
    lines = [r.getMessage() for r in caplog.records if "LOCAL_RANK" in r.getMessage()]
    assert lines == ["LOCAL_RANK 3 with 1 visible CUDA device(s): using cuda:0 (local rank modulo the device count)",
                     "LOCAL_RANK 5 with 4 visible CUDA device(s): using cuda:1 (local rank modulo the device count)"]


def test_dali_executor_with_local_rank_beyond_the_visible_devices_uses_the_one_it_sees(tmp_path, monkeypatch):
    write_image_folder(tmp_path / "data", classes=2, per_class=2)
    fake_cuda_host(monkeypatch, 1)                     # CUDA_VISIBLE_DEVICES=3 under SLURM: one device
    executor, _, _ = dali_executor(small_spec(tmp_path / "data"), local_rank=3)
    assert executor.device_id == 0 and executor.device == torch.device("cuda", 0)


@pytest.mark.parametrize("device,device_id", [("cuda:1", 1), ("cpu", 0)])
def test_an_explicit_cuda_device_decides_where_dali_runs(tmp_path, monkeypatch, device, device_id):
    write_image_folder(tmp_path / "data", classes=2, per_class=2)
    fake_cuda_host(monkeypatch, 2)
    executor, _, _ = dali_executor(small_spec(tmp_path / "data"), device=device, local_rank=0)
    assert executor.device_id == device_id             # cuda:1: DALI works there, no copy per batch
    assert executor.device == torch.device(device)


def test_a_bare_cuda_device_means_torchs_current_device_for_dali_and_the_batches(tmp_path, monkeypatch):
    write_image_folder(tmp_path / "data", classes=2, per_class=2)
    fake_cuda_host(monkeypatch, 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    executor, _, _ = dali_executor(small_spec(tmp_path / "data"), device="cuda", local_rank=0)
    # An index, so a batch on cuda:1 counts as already on the target: no copy.
    assert executor.device_id == 1 and executor.device == torch.device("cuda", 1)


# ---------------------------------------------------------------------------------------------
# DALI's threads on a GPU host


def fake_cores(monkeypatch, cores: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)


GIB = 2**30


def fake_memory(monkeypatch, *, host_gib: float | None, gpu_gib: float | None) -> None:
    monkeypatch.setattr(device_module, "host_memory", lambda: host_gib and int(host_gib * GIB))
    monkeypatch.setattr(device_module, "gpu_memory", lambda device=None: gpu_gib and int(gpu_gib * GIB))


@pytest.mark.parametrize("cores,local_world,host_gib,gpu_gib,expected", [
    (16, 1, 128, 141, 16),     # one H200, 16 cores: every core (the Huffman stage runs on them)
    (224, 8, 2048, 80, 20),    # 8 x A100 80 GB, 28 cores a rank: the GPU's share of paddings bounds it
    (224, 8, 256, 141, 15),    # little host memory for 8 ranks: the pinned paddings bound it
    (16, 8, 128, 141, 2),      # 2 cores a rank
    (8, 1, None, None, 8),     # memory unknown: the cores decide
])
def test_gpu_dali_threads_default_to_the_cores_per_local_rank_within_memory(monkeypatch, cores, local_world,
                                                                            host_gib, gpu_gib, expected):
    fake_cores(monkeypatch, cores)
    fake_memory(monkeypatch, host_gib=host_gib, gpu_gib=gpu_gib)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local_world))
    assert dali_threads(None, gpu=True, auto_cores=cores) == expected
    assert dali_threads(12, gpu=True, auto_cores=cores) == 12        # an explicit loader.workers decides
    assert dali_threads(None, gpu=False, auto_cores=cores) == cores   # dali-cpu: every core it is given


def test_dali_gpu_executor_takes_the_thread_default_of_its_own_gpu(tmp_path, monkeypatch):
    write_image_folder(tmp_path / "data", classes=2, per_class=2)
    fake_cuda_host(monkeypatch, 8)
    fake_cores(monkeypatch, 224)
    asked = []
    monkeypatch.setattr(device_module, "host_memory", lambda: 2048 * GIB)
    monkeypatch.setattr(device_module, "gpu_memory", lambda device=None: asked.append(device) or 80 * GIB)
    monkeypatch.setattr(dali_backend, "default_workers", lambda: 224)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    executor, _, _ = dali_executor(small_spec(tmp_path / "data", workers=None), local_rank=5)
    assert executor.threads == 20 and asked == [5]


def test_doctor_and_show_print_the_gpu_thread_default_and_what_bounds_it(monkeypatch, capsys):
    from dali_bridge.loader.select import probe
    from dali_bridge.cli.main import main
    from dali_bridge.tools.doctor import report

    fake_cores(monkeypatch, 224)
    fake_memory(monkeypatch, host_gib=2048, gpu_gib=80)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    monkeypatch.setenv("DALI_BRIDGE_DISABLE", "cuda")
    probe.cache_clear()
    try:
        defaults = report()["dali_gpu_defaults"]
    finally:
        probe.cache_clear()
    rule = "20 (the least of: cores per local rank 28, GPU memory 20, host memory 122)"
    assert defaults["DALI threads per process"] == rule
    assert defaults["decoder memory padding"].startswith("4025 MiB GPU + 5361 MiB pinned host per process")
    assert main(["show", str(TRAIN)]) == 0
    assert f"# DALI threads (workers auto): dali {rule}, dali-cpu" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# A fake DALI GPU pipeline: the executor's loop, errors and streams without a GPU


class FakeTensorList:
    def __init__(self, tensor: torch.Tensor | None):
        self.tensor = tensor

    def as_tensor(self) -> torch.Tensor | None:
        return self.tensor


class FakeGpuPipeline:
    """Pulls batches from the feeder as DALI's external source does; fails a batch holding any of
    ``rejected`` (encoded bytes), as the mixed decoder fails a whole batch for one sample."""

    def __init__(self, feeder, rejected: set[bytes], streams: list):
        self.feeder, self.rejected, self.streams = feeder, rejected, streams

    def run(self, stream: Any = None):
        self.streams.append(stream)
        encoded, *_ = next(self.feeder)
        if any(sample.tobytes() in self.rejected for sample in encoded):
            raise RuntimeError("Critical error in pipeline:\nnvJPEG error (6): NVJPEG_STATUS_EXECUTION_FAILED")
        return (FakeTensorList(torch.zeros(len(encoded), 3, SIZE, SIZE, dtype=torch.uint8)),)

    def reset(self) -> None:
        pass


class FakeDecodeCheck:
    """Rejects the samples ``rejected`` (encoded bytes); with ``region_only``, only when asked to decode
    their region of interest (as nvJPEG may fail a window it cannot decode alone). Records each call."""

    def __init__(self, rejected: set[bytes], *, region_only: bool = False):
        self.rejected, self.region_only = rejected, region_only
        self.calls: list[tuple[bytes, Any]] = []

    def rejects(self, data: bytes, region: Any = None) -> str | None:
        self.calls.append((bytes(data), region))
        if bytes(data) in self.rejected and (region is not None or not self.region_only):
            return "nvJPEG error (6): NVJPEG_STATUS_EXECUTION_FAILED"
        return None


def gpu_only_failure(tmp_path, monkeypatch, *, on_error: str, bad: int):
    """A dali (GPU) loader over 12 files whose sample ``bad`` only nvJPEG rejects."""
    files = write_image_folder(tmp_path / "data", classes=2, per_class=6)
    fake_cuda_host(monkeypatch, 1)
    streams: list = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: ("consumer stream", device))
    executor, listing, plan = dali_executor(small_spec(tmp_path / "data", on_error=on_error), device="cpu")
    rejected = {files[bad].read_bytes()}
    monkeypatch.setattr(dali_backend, "build_pipeline",
                        lambda spec, plan, feeder, **kw: FakeGpuPipeline(feeder, rejected, streams))
    executor._gpu_decode_check = FakeDecodeCheck(rejected)
    loader = Loader(executor.spec, listing, plan, executor, "dali", Topology(0, 1, 0))
    return loader, files, streams


def test_a_sample_only_the_gpu_decoder_rejects_is_skipped_named_and_counted(tmp_path, monkeypatch):
    loader, files, streams = gpu_only_failure(tmp_path, monkeypatch, on_error="skip", bad=5)
    seen = [index.tolist() for _, _, index, _ in loader]
    assert seen == [[0, 1, 2, 3], [4, 6, 7], [8, 9, 10, 11]]
    assert [(s.index, s.path) for s in loader.skipped] == [(5, str(files[5]))]
    assert loader.skipped[0].reason.startswith("the GPU decoder (nvJPEG) cannot decode it, though the CPU decoder "
                                               "can: nvJPEG error (6)")
    # Every batch ran on the consumer's current stream of DALI's device: no host wait per batch.
    assert set(streams) == {("consumer stream", 0)}


def test_the_gpu_culprit_search_decodes_each_samples_crop_window_as_the_pipeline_does(tmp_path, monkeypatch):
    loader, files, _ = gpu_only_failure(tmp_path, monkeypatch, on_error="raise", bad=5)
    executor = loader._executor
    executor._gpu_decode_check = check = FakeDecodeCheck({files[5].read_bytes()}, region_only=True)
    with pytest.raises(SampleError) as info:   # found by the window decode alone, and named
        for _ in loader:
            pass
    assert (info.value.index, info.value.path) == (5, str(files[5]))
    assert info.value.reason.startswith("the GPU decoder (nvJPEG) cannot decode it, though the CPU decoder can")
    assert "(decoding its crop window alone, as the pipeline does: " in info.value.reason
    # Each sample of the failed batch was decoded with the window the feeder gave the graph for it.
    task = loader.tasks(0)[1]
    inputs, _ = executor.feeder.prepare(task)
    named = dict(zip(executor.feeder.columns.names, inputs))
    windows = {data: (anchor.tolist(), shape.tolist()) for data, anchor, shape
               in zip(map(bytes, inputs[0]), named["0.crop.anchor"], named["0.crop.shape"])}
    assert [data for data, _ in check.calls] == [files[n].read_bytes() for n in (4, 5, 6, 7)]
    assert all(tuple(np.asarray(part).tolist() for part in region) == windows[data] for data, region in check.calls)


def test_a_sample_only_the_gpu_decoder_rejects_raises_after_the_batches_before_it(tmp_path, monkeypatch):
    loader, files, _ = gpu_only_failure(tmp_path, monkeypatch, on_error="raise", bad=5)
    seen = []
    with pytest.raises(SampleError) as info:
        for _, _, index, _ in loader:
            seen.append(index.tolist())
    assert seen == [[0, 1, 2, 3]]
    assert (info.value.index, info.value.path) == (5, str(files[5]))
    assert "GPU decoder (nvJPEG)" in info.value.reason
    assert loader.state_dict()["batch"] == 1


# ---------------------------------------------------------------------------------------------
# torchvision on CUDA: the prefetch ordering, run on the CPU with a fake device step


def test_prefetched_yields_what_was_started_then_raises_the_same_way_for_every_lookahead():
    def start(item: int) -> int:
        log.append(f"start {item}")
        if item == 3:
            raise SampleError(3, "bad.jpg", "broken")
        return item

    def ready(item: int) -> int:
        log.append(f"ready {item}")
        return item

    outcomes = {}
    for lookahead in (0, 1, 2):
        log: list[str] = []
        seen = []
        with pytest.raises(SampleError):
            for item in prefetched(range(6), start=start, ready=ready, lookahead=lookahead):
                seen.append(item)
        outcomes[lookahead] = seen
        if lookahead == 1:   # item k+1 starts before item k is handed over
            assert log == ["start 0", "start 1", "ready 0", "start 2", "ready 1", "start 3", "ready 2"]
    assert outcomes == {0: [0, 1, 2], 1: [0, 1, 2], 2: [0, 1, 2]}


def test_prefetched_yields_every_item_when_nothing_fails():
    assert list(prefetched(range(5), start=lambda i: i * 10, ready=lambda i: i + 1, lookahead=1)) == \
        [1, 11, 21, 31, 41]


def run_until_error(loader: Loader) -> tuple[list[list[int]], SampleError | None]:
    seen, error = [], None
    try:
        for _, _, index, _ in loader:
            seen.append(index.tolist())
    except SampleError as exc:
        error = exc
    return seen, error


@pytest.mark.parametrize("bad", [5, 0])
def test_torchvision_device_branch_yields_the_batches_before_a_bad_sample_like_the_cpu_branch(tmp_path, bad):
    files = write_image_folder(tmp_path / "data", classes=2, per_class=6)
    break_file(files[bad], "cut_in_header")
    results = {}
    for branch in ("cpu", "device"):
        spec = small_spec(tmp_path / "data", workers=0)
        listing, plan = list_source(spec.source), build_plan(spec)
        executor = TorchvisionExecutor(spec, listing, plan, topology=Topology(0, 1, 0), device="cpu")
        if branch == "device":   # the CUDA branch's ordering with a fake device step
            steps: list[str] = []
            executor.stream = "side stream"

            def on_side_stream(item, executor=executor, steps=steps):
                steps.append("start")
                return executor._finish_here(item), "event"

            def ready(started, steps=steps):
                steps.append("ready")
                return started[0]

            executor._finish_on_side_stream = on_side_stream
            executor._ready = ready
        loader = Loader(spec, listing, plan, executor, "torchvision", Topology(0, 1, 0))
        seen, error = run_until_error(loader)
        results[branch] = (seen, error and error.index, loader.state_dict()["batch"])
        loader.close()
    assert results["device"] == results["cpu"] == ([[0, 1, 2, 3]] if bad == 5 else [], bad, 1 if bad == 5 else 0)
    # Batch 1 (bad sample 5) fails to start after batch 0 started: batch 0 is still handed over.
    assert steps == (["start", "start", "ready"] if bad == 5 else ["start"])


def test_finishing_makes_mean_and_std_once_not_per_batch(monkeypatch):
    from dali_bridge.backends import torchvision as tv
    from dali_bridge.ops.finish import Finish

    made = []
    real = torch.tensor
    monkeypatch.setattr(tv.torch, "tensor", lambda *a, **k: made.append(a) or real(*a, **k))
    finish = Finish(mean=(0.25, 0.5, 0.75), std=(0.5, 0.5, 0.5), dtype="float32", layout="CHW")
    images = torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8)
    first = finish_batch(images, finish, torch.device("cpu"))
    for _ in range(3):
        again = finish_batch(images, finish, torch.device("cpu"))
    assert len(made) <= 2
    expected = (images.float() / 255 - torch.tensor([0.25, 0.5, 0.75]).view(1, 3, 1, 1)) / 0.5
    torch.testing.assert_close(first, expected)
    torch.testing.assert_close(again, expected)


def test_dali_gpu_decoder_arguments_keep_libjpeg_turbo_upsampling_and_nvidia_memory_hints():
    arguments = device_module.mixed_decoder_arguments()
    assert arguments["jpeg_fancy_upsampling"] is True
    assert (arguments["device_memory_padding"], arguments["host_memory_padding"]) == (211025920, 140544512)
    assert np.isclose(arguments["hw_decoder_load"], 0.65)


def test_the_benchs_dali_baseline_runs_on_the_ranks_own_gpu(monkeypatch):
    from dali_bridge.bench.baselines import baseline_device

    fake_cuda_host(monkeypatch, 8)
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert baseline_device(gpu=True) == 5            # not GPU 0 for every rank of the node
    monkeypatch.setenv("LOCAL_RANK", "11")
    assert baseline_device(gpu=True) == 3            # wrapped onto the visible devices, as the loader's
    assert baseline_device(gpu=False) is None


def test_torchvision_on_a_rank_gpu_starts_its_dataloader_with_that_gpu_current(tmp_path, monkeypatch):
    """The pin-memory thread makes its CUDA context on the device current when the iterator starts."""
    from contextlib import contextmanager

    write_image_folder(tmp_path / "data", classes=2, per_class=2)
    spec = small_spec(tmp_path / "data", workers=0)
    executor = TorchvisionExecutor(spec, list_source(spec.source), build_plan(spec), topology=Topology(1, 2, 1),
                                   device="cpu")
    current = ["cuda:0"]   # what a rank > 0 has current until it calls torch.cuda.set_device

    @contextmanager
    def device(target):
        before, current[0] = current[0], str(target)
        yield
        current[0] = before

    class FakeDataLoader:
        def __iter__(self):
            started_on.append(current[0])
            return iter([])

    started_on: list[str] = []
    monkeypatch.setattr(torch.cuda, "device", device)
    executor.device, executor.stream, executor.dataloader = torch.device("cuda", 1), "side stream", FakeDataLoader()
    assert list(executor.run([])) == []
    assert started_on == ["cuda:1"] and current == ["cuda:0"]   # started there; the caller's device left as it was


@pytest.mark.slow
def test_a_zero_copy_batch_keeps_dalis_outputs_alive_as_long_as_the_tensor_and_its_views(tmp_path, monkeypatch):
    """A look-ahead consumer computes on batch k after fetching k+1: DALI's buffer must outlive the loader's
    handling of the batch, as long as the tensor (or a view of it) does."""
    import gc
    import weakref

    write_image_folder(tmp_path / "data", classes=2, per_class=2)
    fake_cuda_host(monkeypatch, 1)
    executor, _, _ = dali_executor(small_spec(tmp_path / "data"), device="cpu")   # already there: no copy
    monkeypatch.setattr(torch, "from_dlpack", lambda tensor: tensor)
    task = Loader(executor.spec, executor.listing, executor.plan, executor, "dali", Topology(0, 1, 0)).tasks(0)[0]
    batch = BatchFeed(BatchOutcome(task, [0, 1, 2, 3]), tail=[])

    class DaliOutputs:   # as DALI's: the tensor views its buffer, the TensorList does not hold the tensor
        def as_tensor(self) -> torch.Tensor:
            return torch.zeros(4, 3, SIZE, SIZE, dtype=torch.uint8)

    outputs = [DaliOutputs()]
    dali_outputs = weakref.ref(outputs[0])
    raw = executor._convert(outputs, batch)
    del outputs
    gc.collect()
    assert dali_outputs() is not None                  # the batch is still held by the consumer
    second = raw.image[1]
    del raw
    gc.collect()
    assert dali_outputs() is not None                  # a view of it too
    del second
    gc.collect()
    assert dali_outputs() is None                      # then released with the last of them


def test_torchvision_threads_on_a_rank_gpu_pin_with_its_device_current_and_copy_on_the_side_stream(tmp_path,
                                                                                                 monkeypatch):
    """loader.executor: threads on cuda:1: each pool thread has the rank's GPU current before its first
    batch (torch.cuda.set_device is per thread; a new one has GPU 0), its buffers are pinned, the copy
    and the finish run in the consumer's thread on the side stream, the consumer's stream waits for
    that batch's event, and close joins the threads."""
    import threading

    write_image_folder(tmp_path / "data", classes=2, per_class=6)
    spec = small_spec(tmp_path / "data", workers=2, **{"loader.executor": "threads"})
    current, log, pinned = threading.local(), [], []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: setattr(current, "device", torch.device(device)))
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: f"side stream of {device}")
    executor = TorchvisionExecutor(spec, list_source(spec.source), build_plan(spec), topology=Topology(1, 2, 1),
                                   device="cuda:1")
    real_empty = torch.empty

    def empty(*args, pin_memory=False, **kwargs):  # no CUDA here to pin with: recorded, then made pageable
        pinned.append((pin_memory, getattr(current, "device", "GPU 0, the thread's default")))
        return real_empty(*args, **kwargs)

    @contextlib.contextmanager
    def on(stream):
        log.append(f"enter {stream}")
        yield
        log.append(f"leave {stream}")

    class Event:
        def record(self, stream):
            log.append(f"event recorded on {stream}")

    class Consumer:
        def wait_event(self, event):
            log.append("consumer waits for the event")

    def finish(images, finish, device):
        log.append(f"finish {len(images)} on {device} in {threading.current_thread().name}")
        return FakeOutput(images)

    class FakeOutput:
        def __init__(self, images):
            self.images = images

        def record_stream(self, stream):
            log.append("output recorded on the consumer")

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Consumer())
    monkeypatch.setattr("dali_bridge.backends.torchvision.finish_batch", finish)
    tasks = Loader(spec, executor.listing, executor.plan, executor, "torchvision", Topology(1, 2, 1)).tasks(0)
    raws = list(executor.run(tasks))
    assert [len(raw.indices) for raw in raws] == [len(task.indices) for task in tasks] and len(raws) > 1
    assert pinned and all(pin and device == torch.device("cuda", 1) for pin, device in pinned), pinned
    consumer = threading.current_thread().name

    def started(raw):
        return ["enter side stream of cuda:1", f"finish {len(raw.indices)} on cuda:1 in {consumer}",
                "event recorded on side stream of cuda:1", "leave side stream of cuda:1"]

    ready = ["consumer waits for the event", "output recorded on the consumer"]
    # Batch k+1 is copied and finished before batch k is handed over (one ahead, as with worker processes).
    assert log == started(raws[0]) + [line for raw in raws[1:] for line in started(raw) + ready] + ready
    executor.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("dali-bridge-sample")]


def test_torchvision_threads_on_a_bare_cuda_device_set_the_device_current_at_build_in_each_thread(tmp_path,
                                                                                                monkeypatch):
    import threading

    write_image_folder(tmp_path / "data", classes=2, per_class=2)
    spec = small_spec(tmp_path / "data", workers=2, **{"loader.executor": "threads"})
    current = threading.local()
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: setattr(current, "device", torch.device(device)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)   # what the building thread has current
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: f"side stream of {device}")
    executor = TorchvisionExecutor(spec, list_source(spec.source), build_plan(spec), topology=Topology(0, 1, 0),
                                   device="cuda")
    try:
        seen = set(executor.pool.map(lambda _: getattr(current, "device", None), range(6), in_flight=2))
    finally:
        executor.close()
    assert seen == {torch.device("cuda", 1)}
