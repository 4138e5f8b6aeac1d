"""Order, rank sharding and per-sample parameters as pure functions; geometry equal to torchvision's."""
from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest
import torch
from torchvision.transforms.v2 import RandomResizedCrop
from torchvision.transforms.v2 import _geometry as tv_geometry
from torchvision.transforms.v2 import functional as F

from dali_bridge.pipeline.plan import build_plan
from dali_bridge.errors import ImageError
from dali_bridge.ops.geometry import RRC_ATTEMPTS, Crop, Flip, Resize, center_crop_window, rrc_window, shorter_side_size
from dali_bridge.pipeline.sampling import (batch_count, draw_count, draws, epoch_order, rank_batches, sample_geometry,
    uniforms)
from dali_bridge.spec.pipeline import spec_from_dict

# ---------------------------------------------------------------------------------------------
# Order


@pytest.mark.parametrize("n", [0, 1, 2, 37, 1000])
def test_epoch_order_is_a_permutation(n):
    order = epoch_order(n, seed=4, epoch=2)
    assert order.dtype == np.int64
    np.testing.assert_array_equal(np.sort(order), np.arange(n))


def test_epoch_order_is_a_pure_function_of_seed_and_epoch():
    np.testing.assert_array_equal(epoch_order(500, 1, 3), epoch_order(500, 1, 3))
    orders = [epoch_order(500, seed, ep).tolist() for seed in range(3) for ep in range(3)]
    assert len({tuple(o) for o in orders}) == 9, "two (seed, epoch) pairs gave the same order"


def test_epoch_order_without_shuffle_is_the_listing_order():
    np.testing.assert_array_equal(epoch_order(11, 5, 9, shuffle=False), np.arange(11))


def test_epoch_order_is_not_a_shuffle_buffer():
    # A buffered shuffle keeps early samples early; a true permutation moves them anywhere.
    order = epoch_order(10_000, 0, 0)
    first_hundred_positions = np.flatnonzero(order < 100)
    assert first_hundred_positions.max() > 9_000 and first_hundred_positions.min() < 1_000


COMBOS = [(n, b, w) for n in (0, 1, 2, 3, 7, 13, 37, 64, 101) for b in (1, 2, 5, 8, 64) for w in (1, 2, 3, 4, 8)]


@pytest.mark.parametrize("n,batch,world", COMBOS)
def test_rank_batches_partial_gives_every_sample_once_and_never_an_empty_batch(n, batch, world):
    seen = []
    for rank in range(world):
        tasks = rank_batches(n, batch, 3, 1, rank, world, "partial")
        assert len(tasks) == batch_count(n, batch, world, rank, "partial")
        assert all(1 <= len(t.indices) <= batch for t in tasks)
        assert all(len(t.indices) == batch for t in tasks[:-1])
        assert all(t.valid.all() and t.epoch == 1 for t in tasks)
        assert [t.number for t in tasks] == list(range(len(tasks)))
        seen += [i for t in tasks for i in t.indices.tolist()]
    assert sorted(seen) == list(range(n))


@pytest.mark.parametrize("n,batch,world", COMBOS)
def test_rank_batches_drop_gives_full_batches_and_equal_counts(n, batch, world):
    per_rank = [rank_batches(n, batch, 3, 1, rank, world, "drop") for rank in range(world)]
    expected = (n // world) // batch
    for rank, tasks in enumerate(per_rank):
        assert len(tasks) == expected == batch_count(n, batch, world, rank, "drop")
        assert all(len(t.indices) == batch and t.valid.all() for t in tasks)
    seen = [i for tasks in per_rank for t in tasks for i in t.indices.tolist()]
    assert len(seen) == len(set(seen)) == expected * batch * world


@pytest.mark.parametrize("n,batch,world", COMBOS)
def test_rank_batches_pad_gives_full_batches_equal_counts_and_marks_the_padding(n, batch, world):
    per_rank = [rank_batches(n, batch, 3, 1, rank, world, "pad") for rank in range(world)]
    expected = math.ceil(math.ceil(n / world) / batch) if n else 0
    valid, padding = [], []
    for rank, tasks in enumerate(per_rank):
        assert len(tasks) == expected == batch_count(n, batch, world, rank, "pad")
        assert all(len(t.indices) == batch for t in tasks)
        for t in tasks:
            valid += t.indices[t.valid].tolist()
            padding += t.indices[~t.valid].tolist()
    assert sorted(valid) == list(range(n)), "every sample exactly once among the valid entries"
    assert len(padding) == expected * batch * world - n
    assert set(padding) <= set(range(n))


def test_rank_batches_deal_the_epoch_order_round_robin():
    order = epoch_order(20, 2, 6)
    for rank in range(3):
        tasks = rank_batches(20, 4, 2, 6, rank, 3, "partial")
        np.testing.assert_array_equal(np.concatenate([t.indices for t in tasks]), order[rank::3])


def test_rank_batches_pad_repeats_from_the_start_of_the_epoch_order():
    order = epoch_order(10, 0, 0)
    tasks = rank_batches(10, 4, 0, 0, rank=1, world_size=3, last_batch="pad")
    flat = np.concatenate([t.indices for t in tasks])
    flags = np.concatenate([t.valid for t in tasks])
    np.testing.assert_array_equal(flat[flags], order[1::3])
    np.testing.assert_array_equal(flat[~flags], order[:len(flat) - flags.sum()])


def test_rank_batches_refuses_bad_rank_and_policy():
    with pytest.raises(ValueError, match="rank 3 is outside world size 3"):
        rank_batches(10, 2, 0, 0, rank=3, world_size=3)
    with pytest.raises(ValueError, match="unknown last_batch policy 'keep'"):
        rank_batches(10, 2, 0, 0, last_batch="keep")


# ---------------------------------------------------------------------------------------------
# Counter-based uniforms


def test_uniforms_are_deterministic_in_range_and_shaped():
    u = uniforms(1, 2, np.arange(1000), stream=3, count=22)
    assert u.shape == (1000, 22) and u.dtype == np.float64
    assert u.min() >= 0.0 and u.max() < 1.0
    np.testing.assert_array_equal(u, uniforms(1, 2, np.arange(1000), stream=3, count=22))


def test_uniforms_depend_on_the_sample_index_not_its_batch_position():
    batch = np.array([17, 3, 999, 42])
    together = uniforms(5, 1, batch, 2, 4)
    for row, index in enumerate(batch):
        np.testing.assert_array_equal(together[row], uniforms(5, 1, np.array([index]), 2, 4)[0])
    shuffled = uniforms(5, 1, batch[::-1].copy(), 2, 4)
    np.testing.assert_array_equal(shuffled, together[::-1])


def test_uniforms_change_with_seed_epoch_stream_and_index():
    base = uniforms(0, 0, np.arange(64), 1, 2)
    for other in (uniforms(1, 0, np.arange(64), 1, 2), uniforms(0, 1, np.arange(64), 1, 2),
                  uniforms(0, 0, np.arange(64), 2, 2), uniforms(0, 0, np.arange(64, 128), 1, 2)):
        assert not np.isclose(base, other).any()


def test_uniforms_are_uniform_and_uncorrelated():
    from scipy import stats

    u = uniforms(0, 0, np.arange(20_000), 1, 2)
    for column in range(2):
        assert stats.kstest(u[:, column], "uniform").pvalue > 1e-3
    assert abs(np.corrcoef(u[:, 0], u[:, 1])[0, 1]) < 0.03
    neighbours = np.corrcoef(u[:-1, 0], u[1:, 0])[0, 1]   # consecutive sample indices
    assert abs(neighbours) < 0.03


def test_draws_give_each_random_step_its_own_stream():
    spec = spec_from_dict({"version": 1, "source": {"type": "folder", "root": "/nonexistent"}, "batch_size": 2,
                           "ops": [{"random_resized_crop": 32}, {"horizontal_flip": 0.5}, {"normalize": {}}]})
    plan = build_plan(spec)
    got = draws(plan, 1, 2, np.array([4, 9]))
    assert set(got) == {0, 1}
    assert got[0].shape == (2, 2 * RRC_ATTEMPTS + 2) and got[1].shape == (2, 1)
    assert draw_count(plan.steps[1]) == 1
    np.testing.assert_array_equal(got[1], uniforms(1, 2, np.array([4, 9]), 2, 1))


# ---------------------------------------------------------------------------------------------
# RandomResizedCrop: the real torchvision get-params code, driven by the same uniforms


class _ScriptedTorch:
    """Stands in for ``torch`` inside torchvision's _geometry module: ``empty(1).uniform_(a, b)``
    returns a + (b - a) * u and ``randint(lo, hi)`` returns lo + floor(u * (hi - lo)), taking the
    u's from the list the bridge's ``rrc_window`` receives (2 per attempt, then the last two for
    top/left). Everything else is the real torch."""

    def __init__(self, u):
        self.u = list(u)
        self.next_uniform = 0
        self.next_int = len(self.u) - 2

    def __getattr__(self, name):
        return getattr(torch, name)

    def empty(self, *size, **kwargs):
        scripted = self

        class _Draw:
            def uniform_(self, low, high):
                value = scripted.u[scripted.next_uniform]
                scripted.next_uniform += 1
                low, high = float(low), float(high)
                return torch.tensor([low + (high - low) * value], dtype=torch.float64)
        return _Draw()

    def randint(self, low, high, size=None, **kwargs):
        value = self.u[self.next_int]
        self.next_int += 1
        return torch.tensor([low + min(int(value * (high - low)), high - low - 1)])


def _torchvision_rrc(monkeypatch, height, width, u, scale, ratio):
    transform = RandomResizedCrop(224, scale=scale, ratio=ratio)
    with monkeypatch.context() as patch:
        patch.setattr(tv_geometry, "torch", _ScriptedTorch(u))
        params = transform.make_params([torch.zeros(3, height, width, dtype=torch.uint8)])
    return params["top"], params["left"], params["height"], params["width"]


@pytest.mark.slow
def test_rrc_window_equals_torchvision_random_resized_crop(monkeypatch):
    rng = random.Random(0)
    cases = 0
    for _ in range(600):
        height, width = rng.randint(1, 900), rng.randint(1, 900)
        scale = sorted([rng.uniform(0.01, 1.0), rng.uniform(0.01, 1.0)])
        ratio = sorted([rng.uniform(0.3, 1.0), rng.uniform(1.0, 3.0)])
        u = [rng.random() for _ in range(2 * RRC_ATTEMPTS + 2)]
        expected = _torchvision_rrc(monkeypatch, height, width, u, scale, ratio)
        assert rrc_window(height, width, u, scale, ratio) == expected, (height, width, scale, ratio)
        cases += 1
    assert cases == 600


@pytest.mark.slow
def test_rrc_window_with_imagenet_defaults_on_many_image_sizes(monkeypatch):
    scale, ratio = [0.08, 1.0], [3 / 4, 4 / 3]
    stream = uniforms(0, 0, np.arange(400), 1, 2 * RRC_ATTEMPTS + 2)
    rng = random.Random(1)
    for row in stream:
        height, width = rng.randint(64, 2000), rng.randint(64, 2000)
        expected = _torchvision_rrc(monkeypatch, height, width, row.tolist(), scale, ratio)
        top, left, h, w = rrc_window(height, width, row, scale, ratio)
        assert (top, left, h, w) == expected
        assert 0 <= top <= height - h and 0 <= left <= width - w


@pytest.mark.parametrize("height,width,expected_hw", [
    (10, 1000, (10, 13)),    # far wider than the widest ratio: full height, width = height * 4/3
    (1000, 10, (13, 10)),    # far taller: full width, height = width / (3/4)
])
def test_rrc_window_falls_back_to_the_centre_like_torchvision(monkeypatch, height, width, expected_hw):
    # Area at least the whole image, so every attempt overflows and the centred fallback runs.
    u = [0.999] * (2 * RRC_ATTEMPTS) + [0.5, 0.5]
    scale, ratio = [1.0, 1.0], [3 / 4, 4 / 3]
    ours = rrc_window(height, width, u, scale, ratio)
    assert ours == _torchvision_rrc(monkeypatch, height, width, u, scale, ratio)
    assert ours[2:] == expected_hw
    assert ours[:2] == ((height - expected_hw[0]) // 2, (width - expected_hw[1]) // 2)


def test_rrc_window_fallback_inside_the_ratio_range_takes_the_whole_image(monkeypatch):
    u = [0.999] * (2 * RRC_ATTEMPTS) + [0.1, 0.9]
    # ratio range narrow around 1 with draws at its top end, on a square image: sqrt(area * r) > width
    assert rrc_window(50, 50, u, [1.0, 1.0], [1.0, 1.1]) == (0, 0, 50, 50)
    assert _torchvision_rrc(monkeypatch, 50, 50, u, [1.0, 1.0], [1.0, 1.1]) == (0, 0, 50, 50)


# ---------------------------------------------------------------------------------------------
# Resize(int) and centre crop: sizes and windows equal to torchvision on real tensors

ODD_SIZES = [(1, 1), (1, 7), (7, 1), (3, 5), (17, 33), (255, 256), (256, 255), (333, 500), (500, 333),
             (480, 640), (719, 1281), (1000, 3), (224, 224), (99, 1000)]


@pytest.mark.parametrize("height,width", ODD_SIZES)
@pytest.mark.parametrize("size,max_size", [(1, None), (7, None), (224, None), (256, None), (256, 300), (64, 65),
                                           (7, 8)])
def test_shorter_side_size_equals_torchvision_resize(height, width, size, max_size):
    # float32: torch's AVX uint8 antialias kernel asserts on 1-pixel outputs; the size logic is dtype-free.
    image = torch.zeros(3, height, width, dtype=torch.float32)
    try:
        resized = F.resize(image, size, max_size=max_size, antialias=True)
    except RuntimeError as exc:   # max_size squeezes a very thin image to 0 pixels: torchvision refuses it
        assert "greater than 0" in str(exc)
        with pytest.raises(ImageError, match=f"too thin to resize: .* this {height}x{width} image"):
            shorter_side_size(height, width, size, max_size)  # a sample error with its reason (on_error)
        return
    assert shorter_side_size(height, width, size, max_size) == tuple(resized.shape[-2:])


@pytest.mark.parametrize("height,width", ODD_SIZES)
@pytest.mark.parametrize("crop", [(1, 1), (2, 3), (5, 4), (224, 224), (300, 7), (7, 300), (1001, 1002)])
def test_center_crop_window_equals_torchvision_center_crop(height, width, crop):
    """Larger crops than the image pad with zeros; torchvision's crop with the window reproduces them."""
    image = (torch.arange(height * width * 3, dtype=torch.int64).view(3, height, width) % 251 + 1).to(torch.uint8)
    expected = F.center_crop(image, list(crop))
    window = center_crop_window(height, width, *crop)
    assert (window.height, window.width) == crop
    got = F.crop(image, window.top, window.left, window.height, window.width)
    assert torch.equal(got, expected), (height, width, crop, window)


# ---------------------------------------------------------------------------------------------
# sample_geometry: one op list per sample, same shape for every sample of a plan


def _plan(ops):
    spec = spec_from_dict({"version": 1, "source": {"type": "folder", "root": "/nonexistent"}, "batch_size": 2,
                           "ops": ops})
    return build_plan(spec)


def test_sample_geometry_of_the_val_pipeline_is_resize_then_centre_crop():
    plan = _plan([{"resize": 256}, {"center_crop": 224}, {"normalize": {}}])
    ops = sample_geometry(plan, 375, 500, {})
    assert ops == [Resize(256, 341, "bilinear", True), Crop(16, 58, 224, 224)]


def test_sample_geometry_of_the_train_pipeline_uses_the_sample_draws():
    plan = _plan([{"random_resized_crop": 224}, {"horizontal_flip": 0.5}, {"normalize": {}}])
    sample = draws(plan, 0, 0, np.array([12]))
    row = {k: v[0] for k, v in sample.items()}
    ops = sample_geometry(plan, 375, 500, row)
    crop, resize, flip = ops
    assert (crop.top, crop.left, crop.height, crop.width) == rrc_window(375, 500, row[0], [0.08, 1.0], [3 / 4, 4 / 3])
    assert resize == Resize(224, 224, "bilinear", True)
    assert flip == Flip(bool(row[1][0] < 0.5))


def test_sample_geometry_flip_probability_is_respected():
    plan = _plan([{"center_crop": 8}, {"horizontal_flip": 0.3}, {"normalize": {}}])
    sample = draws(plan, 0, 0, np.arange(20_000))
    flips = [sample_geometry(plan, 10, 10, {1: sample[1][i]})[1].apply for i in range(20_000)]
    assert abs(np.mean(flips) - 0.3) < 0.015
    never = _plan([{"center_crop": 8}, {"horizontal_flip": 0.0}, {"normalize": {}}])
    assert not any(sample_geometry(never, 10, 10, {1: sample[1][i]})[1].apply for i in range(200))


def test_sample_geometry_shape_does_not_depend_on_the_image():
    plan = _plan([{"random_resized_crop": 32}, {"resize": 40}, {"center_crop": 32},
                  {"horizontal_flip": 0.5}, {"normalize": {}}])
    sample = draws(plan, 0, 0, np.arange(50))
    shapes = set()
    for i, (h, w) in enumerate(itertools.islice(itertools.cycle([(5, 900), (900, 5), (32, 32), (481, 640)]), 50)):
        ops = sample_geometry(plan, h, w, {k: v[i] for k, v in sample.items()})
        shapes.add(tuple(type(op).__name__ for op in ops))
    assert shapes == {("Crop", "Resize", "Resize", "Crop", "Flip")}
