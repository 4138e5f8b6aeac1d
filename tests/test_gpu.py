"""GPU-only behaviour: the `dali` backend on a CUDA device and the torchvision fallback finishing on it.

Every test here needs a CUDA device (skipped with "needs a CUDA device" elsewhere); the `dali`
ones also need DALI able to use it. ``benchmarks/device_check.sh`` runs this file on a lent GPU.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from conftest import TRAIN, VAL
from dali_bridge import build_loader
from dali_bridge.backends.select import unavailable_reason

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def _dali_gpu_reason() -> str | None:
    if not CUDA:
        return "needs a CUDA device"
    reason = unavailable_reason("dali")
    return f"needs DALI with CUDA: {reason}" if reason else None


def _dali_cpu_reason() -> str | None:
    reason = unavailable_reason("dali-cpu")
    return f"needs DALI: {reason}" if reason else None


needs_dali_gpu = pytest.mark.skipif(_dali_gpu_reason() is not None, reason=_dali_gpu_reason() or "")
needs_dali_cpu = pytest.mark.skipif(_dali_cpu_reason() is not None, reason=_dali_cpu_reason() or "")

SIZE = 64
UINT8_HWC = {"ops.2": {"normalize": {"dtype": "uint8", "layout": "HWC"}}}
# nvJPEG (mixed decode, fancy upsampling on) and libjpeg-turbo (DALI's CPU decoder) both follow the
# JPEG spec's IDCT accuracy bound, which allows +-1 level per pixel between implementations; the GPU
# resize then accumulates in a different order than the CPU one, adding at most one more rounding
# step. So the same sample with the same crop and flip may differ by up to 2 levels, never more.
MAX_LEVELS = 2


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


@needs_dali_gpu
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


@needs_dali_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices to see LOCAL_RANK=1 honoured")
def test_dali_follows_local_rank_to_the_second_gpu(sample_root, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    loader = build_loader(TRAIN, "dali", overrides=overrides(sample_root), rank=1, world_size=2)
    image, _, _ = next(iter(loader))
    assert image.device == torch.device("cuda", 1) == loader.device


@needs_dali_gpu
@needs_dali_cpu
@pytest.mark.parametrize("pipeline", [TRAIN, VAL], ids=["train-roi-decode", "val-full-decode"])
@pytest.mark.parametrize("decode", ["mixed", "cpu"])
def test_dali_gpu_matches_dali_cpu_within_two_levels(sample_root, pipeline, decode):
    gpu = build_loader(pipeline, "dali", overrides=overrides(sample_root, pipeline, **UINT8_HWC,
                                                             **{"decode.device": decode}))
    cpu = build_loader(pipeline, "dali-cpu", overrides=overrides(sample_root, pipeline, **UINT8_HWC))
    for loader in (gpu, cpu):
        loader.set_epoch(1)
    on_gpu, on_cpu = by_index(gpu), by_index(cpu)
    assert on_gpu.keys() == on_cpu.keys() == set(range(37))
    worst, mean = 0, []
    for index in on_cpu:
        diff = (on_gpu[index].to(torch.int16) - on_cpu[index].to(torch.int16)).abs()
        worst = max(worst, int(diff.max()))
        mean.append(diff.float().mean().item())
    assert worst <= MAX_LEVELS, f"dali (GPU) and dali-cpu differ by up to {worst} levels"
    assert np.mean(mean) < 0.5, f"mean difference {np.mean(mean):.3f} levels: not the same crops/flips?"


@needs_dali_gpu
def test_dali_normalised_output_matches_dali_cpu(sample_root):
    gpu = build_loader(TRAIN, "dali", overrides=overrides(sample_root))
    cpu = build_loader(TRAIN, "dali-cpu", overrides=overrides(sample_root))
    on_gpu, on_cpu = by_index(gpu), by_index(cpu)
    std_levels = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1) * 255
    for index in on_cpu:
        levels = ((on_gpu[index] - on_cpu[index]) * std_levels).abs().max().item()
        assert levels <= MAX_LEVELS + 1e-3, f"sample {index}: {levels:.3f} levels apart"


@needs_dali_gpu
def test_dali_device_argument_moves_outputs(sample_root):
    loader = build_loader(TRAIN, "dali", overrides=overrides(sample_root), device="cpu")
    image, label, _ = next(iter(loader))
    assert loader.device == torch.device("cpu") and image.device.type == "cpu" and label.device.type == "cpu"


# ---------------------------------------------------------------------------------------------
# torchvision finishing on the GPU


@needs_cuda
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


@needs_cuda
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


@needs_cuda
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
        seen.append(image.sum(dtype=torch.float64))   # consumed on the default stream
    torch.cuda.synchronize()
    expected = [image.sum(dtype=torch.float64).item() for image in cpu]
    np.testing.assert_allclose([s.item() for s in seen], expected, rtol=1e-6)


@needs_cuda
def test_torchvision_device_argument_keeps_outputs_on_the_cpu(sample_root):
    loader = build_loader(TRAIN, "torchvision", overrides=overrides(sample_root), device="cpu")
    image, label, index = next(iter(loader))
    assert loader.device == torch.device("cpu")
    assert not (image.is_cuda or label.is_cuda or index.is_cuda)
