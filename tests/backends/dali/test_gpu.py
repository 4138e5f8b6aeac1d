"""GPU-only behaviour: the `dali` backend on a CUDA device and the torchvision fallback finishing on it.

Every test here needs a CUDA device (elsewhere each is skipped with a reason saying what it
checks); the `dali` ones also need DALI able to use it. ``benchmarks/device_check.sh`` runs this
file on a GPU machine; tests/backends/dali/test_gpu_logic.py pins the same decisions on a CPU host with fakes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.paths import TRAIN, VAL
from dali_bridge import build_loader
from dali_bridge.backends.device import made_by_host_copy
from dali_bridge.tools.compare_bounds import DECODE_BOUNDS, FLOAT32_SLACK, exceeded
from dali_bridge.loader.select import unavailable_reason

CUDA = torch.cuda.is_available()


def _dali_gpu_reason() -> str | None:
    if not CUDA:
        return "no CUDA device here"
    reason = unavailable_reason("dali")
    return f"dali cannot run here: {reason}" if reason else None


def _dali_cpu_reason() -> str | None:
    reason = unavailable_reason("dali-cpu")
    return f"needs DALI: {reason}" if reason else None


def needs_cuda(checks: str):
    """Skip without a CUDA device, saying what the test would have checked."""
    return pytest.mark.skipif(not CUDA, reason=f"GPU-only: checks {checks} (no CUDA device here)")


def needs_dali_gpu(checks: str):
    why = _dali_gpu_reason()
    return pytest.mark.skipif(why is not None, reason=f"GPU-only: checks {checks} ({why})")


needs_dali_cpu = pytest.mark.skipif(_dali_cpu_reason() is not None, reason=_dali_cpu_reason() or "")

SIZE = 64
UINT8_HWC = {"ops.2": {"normalize": {"dtype": "uint8", "layout": "HWC"}}}
def overrides(root: Path, pipeline: Path = TRAIN, **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"source": {"type": "folder", "root": str(root)}, "batch_size": 8,
                            "outputs": ["image", "label", "index"], "loader.workers": 2}
    if pipeline == TRAIN:
        base["ops.0.random_resized_crop.size"] = SIZE
    else:
        base.update({"ops.0.resize.size": SIZE + 8, "ops.1.center_crop.size": SIZE})
    base.update(extra)
    return base


def by_index(loader) -> dict[int, torch.Tensor]:
    out: dict[int, torch.Tensor] = {}
    for image, _, index in loader:
        for row, i in enumerate(index.cpu().tolist()):
            out[i] = image[row].cpu()
    return out


# ---------------------------------------------------------------------------------------------
# dali on the GPU


@needs_dali_gpu("that dali yields CUDA tensors on the local rank's device")
def test_dali_yields_cuda_tensors_on_the_local_rank_device(sample_root, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    loader = build_loader(TRAIN, "dali", overrides=overrides(sample_root))
    assert loader.device == torch.device("cuda", 0)
    count = 0
    for image, label, index in loader:
        assert image.device == label.device == index.device == torch.device("cuda", 0)
        assert image.dtype == torch.float32 and tuple(image.shape[1:]) == (3, SIZE, SIZE)
        assert label.dtype == index.dtype == torch.int64
        count += len(index)
    assert count == 37


@needs_dali_gpu("that LOCAL_RANK=1 puts dali on the second GPU")
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="GPU-only: checks that LOCAL_RANK=1 puts dali on the "
                                                          "second GPU (needs two CUDA devices)")
def test_dali_follows_local_rank_to_the_second_gpu(sample_root, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    loader = build_loader(TRAIN, "dali", overrides=overrides(sample_root), rank=1, world_size=2)
    image, _, _ = next(iter(loader))
    assert image.device == torch.device("cuda", 1) == loader.device


@needs_dali_gpu("that a LOCAL_RANK beyond the visible devices wraps onto them instead of failing")
def test_dali_with_local_rank_beyond_the_visible_devices_runs_on_a_visible_one(sample_root, monkeypatch):
    count = torch.cuda.device_count()
    monkeypatch.setenv("LOCAL_RANK", str(count + 3))
    loader = build_loader(TRAIN, "dali", overrides=overrides(sample_root))
    image, _, _ = next(iter(loader))
    assert image.device == loader.device == torch.device("cuda", (count + 3) % count)


@needs_dali_gpu("that an explicit cuda:N is where DALI itself runs (no copy across devices)")
def test_dali_explicit_cuda_device_is_where_dali_runs(sample_root):
    last = torch.device("cuda", torch.cuda.device_count() - 1)
    loader = build_loader(TRAIN, "dali", overrides=overrides(sample_root), device=str(last))
    image, _, _ = next(iter(loader))
    assert loader._executor.device_id == last.index and image.device == last


def level_differences(first: dict[int, torch.Tensor], second: dict[int, torch.Tensor]) -> tuple[float, int]:
    """Mean and max absolute difference in levels over every pixel of the samples both hold."""
    assert first.keys() == second.keys()
    diffs = [(first[i].to(torch.int16) - second[i].to(torch.int16)).abs() for i in sorted(first)]
    total = sum(d.numel() for d in diffs)
    return sum(float(d.sum(dtype=torch.float64)) for d in diffs) / total, max(int(d.max()) for d in diffs)


@needs_dali_gpu("dali (GPU) against dali-cpu within the bounds of DECODE_BOUNDS (dali_bridge/tools/compare_bounds.py)")
@needs_dali_cpu
@pytest.mark.parametrize("pipeline", [TRAIN, VAL], ids=["train-roi-decode", "val-full-decode"])
@pytest.mark.parametrize("decode", ["mixed", "cpu"])
def test_dali_gpu_matches_dali_cpu_within_the_stated_bounds(sample_root, pipeline, decode):
    gpu = build_loader(pipeline, "dali", overrides=overrides(sample_root, pipeline, **UINT8_HWC,
                                                             **{"decode.device": decode}))
    cpu = build_loader(pipeline, "dali-cpu", overrides=overrides(sample_root, pipeline, **UINT8_HWC))
    for loader in (gpu, cpu):
        loader.set_epoch(1)
    on_gpu, on_cpu = by_index(gpu), by_index(cpu)
    assert on_gpu.keys() == on_cpu.keys() == set(range(37))
    mean, worst = level_differences(on_gpu, on_cpu)
    print(f"dali ({decode} decode) vs dali-cpu: mean {mean:.3f} levels, max {worst}")   # the reported maximum
    problems = exceeded(DECODE_BOUNDS[decode], max_levels=worst, mean_levels=mean)
    assert not problems, f"dali ({decode} decode) vs dali-cpu: {problems} (not the same crops/flips?)"


@needs_dali_gpu("that dali's normalised float output matches dali-cpu's within the uint8 bounds")
def test_dali_normalised_output_matches_dali_cpu(sample_root):
    gpu = build_loader(TRAIN, "dali", overrides=overrides(sample_root, **{"decode.device": "cpu"}))
    cpu = build_loader(TRAIN, "dali-cpu", overrides=overrides(sample_root))
    on_gpu, on_cpu = by_index(gpu), by_index(cpu)
    std_levels = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1) * 255
    for index in on_cpu:
        levels = ((on_gpu[index] - on_cpu[index]) * std_levels).abs().max().item()
        assert levels <= DECODE_BOUNDS["cpu"].max_abs + FLOAT32_SLACK, f"sample {index}: {levels:.3f} levels apart"


@needs_dali_gpu("that device='cpu' batches equal the GPU batches copied to the host while the GPU is kept busy")
def test_dali_cpu_target_equals_a_blocking_copy_under_load(sample_root):
    on_gpu = build_loader(TRAIN, "dali", overrides=overrides(sample_root))
    on_cpu = build_loader(TRAIN, "dali", overrides=overrides(sample_root), device="cpu")
    work = torch.randn(2048, 2048, device=on_gpu.device)
    batches = 0
    for (g_image, _, g_index), (c_image, c_label, c_index) in zip(on_gpu, on_cpu):
        for _ in range(8):              # keep the consumer's stream busy while DALI prepares the next batch
            work = torch.tanh(work @ work)
        assert c_image.device.type == c_label.device.type == "cpu"
        assert torch.equal(g_index.cpu(), c_index) and torch.equal(g_image.cpu(), c_image)
        batches += 1
    assert batches == len(on_cpu) == 5


@needs_dali_gpu("that a consumer computing on batch k only after fetching k+1, under load, reads its pixels intact")
@pytest.mark.parametrize("pipeline", [TRAIN, VAL], ids=["train", "val"])
def test_dali_batches_consumed_one_step_late_under_load_equal_copied_references(sample_root, pipeline):
    """Accelerate's loader wrapper and CUDA prefetchers fetch batch k+1 before they queue work on batch k:
    DALI's zero-copy buffer of batch k must still be valid then, while the GPU is kept busy."""
    settings = overrides(sample_root, pipeline, **UINT8_HWC)
    reference = []
    for image, _, index in build_loader(pipeline, "dali", overrides=settings):
        reference.append((image.clone(), index.clone()))   # copied at once, on the consumer's stream
    torch.cuda.synchronize()
    late = build_loader(pipeline, "dali", overrides=settings)
    work = torch.randn(2048, 2048, device=late.device)
    seen, previous = [], None
    for batch in late:
        if previous is not None:
            for _ in range(8):          # the step on the previous batch waits behind a busy stream
                work = torch.tanh(work @ work)
            seen.append((previous[0].clone(), previous[2].clone()))
        previous = batch                 # the consumer keeps only the tensors, as a prefetcher does
    seen.append((previous[0].clone(), previous[2].clone()))
    del previous, batch
    torch.cuda.synchronize()
    assert len(seen) == len(reference) == len(late)
    for (image, index), (ref_image, ref_index) in zip(seen, reference):
        assert torch.equal(index, ref_index) and torch.equal(image, ref_image)


@needs_dali_gpu("one batch of each shipped pipeline on dali with no host sync in the bridge's code")
@pytest.mark.parametrize("pipeline", sorted((TRAIN.parent).glob("*.yaml")), ids=lambda p: p.stem)
def test_dali_batches_make_no_host_sync_in_the_bridges_code(sample_root, pipeline):
    import traceback

    loader = build_loader(pipeline, "dali", overrides={"source": {"type": "folder", "root": str(sample_root)},
                                                        "batch_size": 4, "loader.shuffle": False})
    # A tail with a PIL kernel (timm's policies) runs on the host: its batch's one copy there is a sync by design.
    host_tail = loader._executor.tail.device == torch.device("cpu")
    batches = iter(loader)
    next(batches)                        # the first batch makes what is made once
    torch.cuda.set_sync_debug_mode("error")
    try:
        next(batches)
    except RuntimeError as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if {"dali_bridge", "torchvision"} & set(Path(f.filename).parts)]
        in_torchvision = bool(frames) and "torchvision" in Path(frames[-1].filename).parts   # docs/gpu.md
        if not in_torchvision and not (host_tail and made_by_host_copy(frames)):
            raise
    finally:
        torch.cuda.set_sync_debug_mode(0)
        loader.close()


@needs_dali_gpu("that a broken file on dali (GPU) raises after the batches before it, and is skipped and counted")
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_dali_gpu_error_policy(tmp_path, on_error):
    from tests.helpers.hostile import break_file, write_image_folder
    from dali_bridge.errors import SampleError

    files = write_image_folder(tmp_path / "data", classes=2, per_class=6)
    break_file(files[5], "cut_halfway")
    loader = build_loader(TRAIN, "dali", overrides={**overrides(tmp_path / "data"), "batch_size": 4,
                                                     "loader.shuffle": False, "loader.on_error": on_error})
    seen = []
    if on_error == "raise":
        with pytest.raises(SampleError) as info:
            for _, _, index in loader:
                seen.append(index.tolist())
        assert info.value.index == 5 and seen == [[0, 1, 2, 3]] and loader.state_dict()["batch"] == 1
    else:
        seen = [index.tolist() for _, _, index in loader]
        assert seen == [[0, 1, 2, 3], [4, 6, 7], [8, 9, 10, 11]] and [s.index for s in loader.skipped] == [5]


# ---------------------------------------------------------------------------------------------
# torchvision finishing on the GPU


@needs_cuda("that torchvision targets the GPU with pinned memory and a side stream")
def test_torchvision_targets_the_gpu_with_pinned_memory_and_a_side_stream(sample_root):
    loader = build_loader(TRAIN, "torchvision", overrides=overrides(sample_root))
    assert loader.device == torch.device("cuda", torch.cuda.current_device())
    executor = loader._executor
    assert executor.dataloader.pin_memory is True
    assert isinstance(executor.stream, torch.cuda.Stream)
    assert executor.stream != torch.cuda.default_stream(loader.device)
    for image, label, index in loader:
        assert image.is_cuda and label.is_cuda and index.is_cuda
        assert image.dtype == torch.float32 and image.is_contiguous()


@needs_cuda("that torchvision's finishing on CUDA equals its finishing on the CPU")
@pytest.mark.parametrize("finish", [
    {},
    {"ops.2": {"normalize": {"dtype": "float16", "layout": "HWC", "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}}},
    UINT8_HWC,
], ids=["float32-chw", "float16-hwc", "uint8-hwc"])
def test_torchvision_gpu_finishing_equals_cpu_finishing(sample_root, finish):
    gpu = build_loader(TRAIN, "torchvision", overrides=overrides(sample_root, **finish), device="cuda")
    cpu = build_loader(TRAIN, "torchvision", overrides=overrides(sample_root, **finish), device="cpu")
    assert gpu.device.type == "cuda" and cpu.device.type == "cpu"
    assert cpu._executor.stream is None and cpu._executor.dataloader.pin_memory is False
    batches = 0
    for (g_image, g_label, g_index), (c_image, c_label, c_index) in zip(gpu, cpu):
        assert g_image.is_cuda and not c_image.is_cuda
        assert torch.equal(g_index.cpu(), c_index) and torch.equal(g_label.cpu(), c_label)
        assert g_image.dtype == c_image.dtype and g_image.shape == c_image.shape
        torch.testing.assert_close(g_image.cpu(), c_image, atol=1e-6 if c_image.is_floating_point() else 0, rtol=0)
        batches += 1
    assert batches == len(cpu) == 5


@needs_cuda("that side-stream batches are ready (one event each) while the consumer keeps the GPU busy")
def test_torchvision_side_stream_batches_are_ready_while_the_consumer_keeps_the_gpu_busy(sample_root):
    """The consumer's default stream must wait for the side-stream copy: results stay right under load."""
    cpu = [image for image, _, _ in build_loader(TRAIN, "torchvision", overrides=overrides(sample_root),
                                                 device="cpu")]
    gpu_loader = build_loader(TRAIN, "torchvision", overrides=overrides(sample_root), device="cuda")
    work = torch.randn(2048, 2048, device=gpu_loader.device)
    seen = []
    for image, _, _ in gpu_loader:
        for _ in range(8):              # keep the default stream busy while the next batch is finished
            work = torch.tanh(work @ work)
        seen.append(image.clone())      # consumed on the default stream
    torch.cuda.synchronize()
    assert len(seen) == len(cpu)
    # Element by element: a stream race gives gross errors; CUDA's finishing differs from the CPU's by
    # at most one float32 ulp per element (it divides by multiplying with the reciprocal), which a
    # float64 sum over a batch turns into a relative 2e-6.
    for on_gpu, on_cpu in zip(seen, cpu):
        torch.testing.assert_close(on_gpu.cpu(), on_cpu, atol=1e-6, rtol=0)


@needs_cuda("that torchvision with device='cpu' keeps outputs on the CPU on a GPU host")
def test_torchvision_device_argument_keeps_outputs_on_the_cpu(sample_root):
    loader = build_loader(TRAIN, "torchvision", overrides=overrides(sample_root), device="cpu")
    image, label, index = next(iter(loader))
    assert loader.device == torch.device("cpu")
    assert not (image.is_cuda or label.is_cuda or index.is_cuda)


@needs_cuda("that torchvision on CUDA yields the batches before a broken file, then raises, like the CPU branch")
def test_torchvision_cuda_yields_the_batches_before_a_broken_file(tmp_path):
    from tests.helpers.hostile import break_file, write_image_folder
    from dali_bridge.errors import SampleError

    files = write_image_folder(tmp_path / "data", classes=2, per_class=6)
    break_file(files[5], "cut_halfway")
    loader = build_loader(TRAIN, "torchvision", overrides={**overrides(tmp_path / "data"), "batch_size": 4,
                                                            "loader.shuffle": False}, device="cuda")
    seen = []
    with pytest.raises(SampleError):
        for _, _, index in loader:
            seen.append(index.tolist())
    assert seen == [[0, 1, 2, 3]] and loader.state_dict()["batch"] == 1


@needs_cuda("that loader.executor: threads on CUDA gives the batches of worker processes, pinned, on the loader's GPU")
def test_torchvision_threads_on_cuda_give_the_batches_of_worker_processes(sample_root):
    import threading

    extra = {"loader.executor": "threads"}
    processes = build_loader(TRAIN, "torchvision", overrides=overrides(sample_root))   # the rank's GPU, cuda:N
    threads = build_loader(TRAIN, "torchvision", overrides=overrides(sample_root, **extra))
    assert threads.device.type == "cuda" and threads.device == processes.device
    executor = threads._executor
    made = []
    real = executor.dataset.batch

    def batch(task, buffer):   # in a pool thread: its current device and whether its buffer is pinned
        item = real(task, buffer)
        made.append((torch.cuda.current_device(), item["image"].is_pinned() if "image" in item else None))
        return item

    executor.dataset.batch = batch
    work = torch.randn(1024, 1024, device=threads.device)
    expected = [(image.clone(), index.clone()) for image, _, index in processes]
    seen = []
    for image, _, index in threads:
        work = torch.tanh(work @ work)      # the consumer's stream kept busy while the next batch is copied
        seen.append((image.clone(), index.clone()))
    torch.cuda.synchronize()
    assert len(seen) == len(expected) > 1
    for (image, index), (ref_image, ref_index) in zip(seen, expected):
        assert image.device == ref_image.device == threads.device
        assert torch.equal(index, ref_index) and torch.equal(image, ref_image)   # the same kernels on both
    assert made and set(made) == {(threads.device.index, True)}, made
    threads.close(), processes.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("dali-bridge-sample")]
