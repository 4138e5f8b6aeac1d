"""The batch finish on the CPU: a table lookup whose pixels are torchvision's arithmetic, bit for bit,
into memory reused once the loop has let a batch go."""
from __future__ import annotations

import pytest
import torch
import yaml
from tests.helpers.backends import CPU_BACKENDS
from tests.helpers.paths import PIPELINES
from torch.utils._python_dispatch import TorchDispatchMode

from dali_bridge import build_loader
from dali_bridge.backends.finishing import FinishedBuffers, finish_batch
from dali_bridge.ops.finish import Finish

CPU = torch.device("cpu")
FINISHES = [
    Finish(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), dtype="float32", layout="CHW"),
    Finish(mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), dtype="float16", layout="CHW"),
    Finish(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), dtype="float32", layout="HWC"),
    Finish(dtype="float32"),   # identity mean and std: only the scaling to [0, 1]
    Finish(dtype="float16", layout="HWC"),
]


def every_value_batch() -> torch.Tensor:
    """uint8 NCHW [4, 3, 9, 11] holding each of the 256 values in every channel, shuffled differently
    per channel, on planes of an odd size."""
    generator = torch.Generator().manual_seed(3)
    count = 4 * 9 * 11
    channels = [torch.arange(count, dtype=torch.int64)[torch.randperm(count, generator=generator)] % 256
                for _ in range(3)]
    return torch.stack(channels).to(torch.uint8).view(3, 4, 9, 11).transpose(0, 1).contiguous()


def torchvision_arithmetic(images: torch.Tensor, finish: Finish) -> torch.Tensor:
    """ToDtype(scale=True) + Normalize as torchvision computes them, in float32, then the cast."""
    out = images.to(torch.float32).div_(255.0)
    out.sub_(torch.tensor(finish.mean).view(1, 3, 1, 1)).div_(torch.tensor(finish.std).view(1, 3, 1, 1))
    out = out.to(getattr(torch, finish.dtype))
    return out.permute(0, 2, 3, 1).contiguous() if finish.layout == "HWC" else out


@pytest.mark.parametrize("finish", FINISHES, ids=lambda f: f"{f.dtype}-{f.layout}-{'id' if f.identity else 'norm'}")
def test_the_cpu_finish_equals_torchvisions_arithmetic_for_every_value_of_every_channel(finish):
    images = every_value_batch()
    for channel in range(3):
        assert set(images[:, channel].flatten().tolist()) == set(range(256))
    out = finish_batch(images, finish, CPU)
    expected = torchvision_arithmetic(images, finish)
    assert out.dtype == expected.dtype and out.shape == expected.shape
    assert torch.equal(out, expected)


def test_the_cpu_finish_of_a_non_contiguous_batch_equals_the_arithmetic():
    images = every_value_batch().transpose(2, 3)   # a view with swapped strides
    finish = FINISHES[0]
    assert torch.equal(finish_batch(images, finish, CPU), torchvision_arithmetic(images, finish))


class _AtenCalls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_the_cpu_finish_of_a_batch_runs_no_torch_arithmetic_over_its_pixels():
    # Four full passes of torch kernels (convert, divide, subtract, divide) cost about three times the
    # lookup, and run on intra-op threads that compete with the workers for the cores.
    images = every_value_batch()
    finish_batch(images, FINISHES[0], CPU)  # the table, made once per finish
    with _AtenCalls() as calls:
        finish_batch(images, FINISHES[0], CPU)
    arithmetic = [name for name in calls.names if name.split(".")[0] in ("div", "div_", "sub", "sub_", "_to_copy")]
    assert arithmetic == []


def test_finished_buffers_lend_a_buffer_again_only_once_nothing_else_uses_it():
    buffers = FinishedBuffers(keep=8)
    first = buffers.take((2, 3), torch.float32)
    pointer, others = first.data_ptr(), []  # the others are held, so a free buffer can only be the first

    def lent(dtype: torch.dtype = torch.float32) -> int:
        others.append(buffers.take((2, 3), dtype))
        return others[-1].data_ptr()

    assert lent() != pointer                # held by the caller
    row = first[0]
    del first
    assert lent() != pointer                # a view of it is still held
    array = row.numpy()
    del row
    assert lent() != pointer                # so is a numpy array of it
    del array
    assert lent(torch.float64) != pointer   # another dtype: a new one
    assert lent() == pointer                # now nothing uses it


def test_a_finish_into_lent_buffers_equals_the_finish_into_new_memory():
    buffers, images = FinishedBuffers(), every_value_batch()
    for finish in FINISHES:
        for _ in range(2):  # the second time into a buffer already written
            assert torch.equal(finish_batch(images, finish, CPU, buffers=buffers), finish_batch(images, finish, CPU))


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_batches_the_loop_keeps_are_never_written_over_and_those_it_lets_go_are_reused(sample_root, backend,
                                                                                     monkeypatch):
    """Through a recipe with a torch tail (finished by the lookup on both CPU backends)."""
    made = []
    monkeypatch.setattr(FinishedBuffers, "__init__", lambda self, original=FinishedBuffers.__init__, **kwargs: (
        original(self, **kwargs), made.append(self))[0])
    recipe = dict(yaml.safe_load((PIPELINES / "torchvision_recipe_train.yaml").read_text()),
                  source={"type": "folder", "root": str(sample_root)}, batch_size=4)
    recipe["loader"] = {"workers": 1, "repeated_augmentations": 1}
    with build_loader(recipe, backend) as loader:
        kept = [(image, image.clone()) for image, _ in loader]
        (buffers,) = [each for each in made if each.lent]
        assert buffers.made == buffers.lent == len(kept) > buffers.keep  # every kept batch in memory of its own
        assert all(torch.equal(image, copy) for image, copy in kept)
        del kept
        batches = sum(1 for _ in loader)  # each batch let go before the next
    assert buffers.lent == 2 * batches and buffers.made < batches + buffers.keep


def test_finished_buffers_reuse_nothing_where_torch_cannot_count_a_storages_users(monkeypatch):
    from dali_bridge.backends import finishing

    monkeypatch.setattr(finishing, "_STORAGE_USE_COUNT", None)
    buffers = FinishedBuffers()
    for _ in range(3):
        buffers.take((2, 3), torch.float32)  # each let go at once
    assert buffers.made == buffers.lent == 3


@pytest.mark.parametrize("finish", FINISHES + [Finish(dtype="uint8")],
                         ids=lambda f: f"{f.dtype}-{f.layout}-{'id' if f.identity else 'norm'}")
def test_a_channels_last_batch_finishes_to_the_contiguous_batchs_pixels_and_layout(finish):
    # A torchvision worker ships a batch of resized images in their own (HWC) memory: in_layout_of.
    images = every_value_batch()
    channels_last = images.contiguous(memory_format=torch.channels_last)
    out, expected = finish_batch(channels_last, finish, CPU), finish_batch(images, finish, CPU)
    assert torch.equal(out, expected)
    assert out.is_contiguous() and out.stride() == expected.stride()
