"""loader.repeated_augmentations: each sample r times per epoch, laid out as torchvision's RASampler
(repeats in a row, then dealt to ranks), each repeat with its own draws; with r = 1 nothing changes."""
from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch
from tests.helpers.backends import backend_params

from dali_bridge.pipeline.plan import build_plan
from dali_bridge.pipeline.sampling import batch_count, draws, epoch_order, rank_batches
from dali_bridge.spec.pipeline import spec_from_dict
from dali_bridge.spec.problems import SpecError

TRAIN_OPS = [{"random_resized_crop": 24}, {"horizontal_flip": 0.5}, {"normalize": {"dtype": "uint8"}}]
GRID = list(itertools.product([1, 2, 3, 4], [1, 2, 3, 4], ["partial", "drop", "pad"]))


def pairs(tasks, valid_only: bool = True) -> list[tuple[int, int]]:
    """(sample index, repeat number) of every row of the tasks."""
    return [(int(i), int(r)) for t in tasks for i, r, ok in zip(t.indices, t.repeats, t.valid) if ok or not valid_only]


@pytest.mark.parametrize("world, repeats, last_batch", GRID)
@pytest.mark.parametrize("n, batch", [(13, 3), (10, 4), (7, 8)])
def test_every_sample_comes_once_per_repeat_over_the_ranks(n, batch, world, repeats, last_batch):
    per_rank = [rank_batches(n, batch, 5, 2, rank, world, last_batch, repeats=repeats) for rank in range(world)]
    entries = n * repeats
    for rank, tasks in enumerate(per_rank):
        assert len(tasks) == batch_count(n, batch, world, rank, last_batch, repeats=repeats)
        assert all(len(t.indices) == len(t.repeats) == len(t.valid) > 0 for t in tasks)
        if last_batch != "partial":
            assert all(len(t.indices) == batch for t in tasks)
    seen = Counter(pair for tasks in per_rank for pair in pairs(tasks))
    assert max(seen.values(), default=1) == 1  # no (sample, repeat) twice, on one rank or across ranks
    everything = {(i, r) for i in range(n) for r in range(repeats)}
    if last_batch == "drop":
        assert len({len(tasks) for tasks in per_rank}) == 1
        assert len(seen) == (entries // world) // batch * batch * world and set(seen) <= everything
    else:
        assert set(seen) == everything
    if last_batch == "pad":
        assert len({len(tasks) for tasks in per_rank}) == 1
        padding = sum(len(t.indices) for tasks in per_rank for t in tasks) - entries
        assert padding == sum((~t.valid).sum() for tasks in per_rank for t in tasks) >= 0


@pytest.mark.parametrize("world, repeats", list(itertools.product([1, 2, 3, 4], [1, 2, 3, 4])))
def test_repeats_follow_one_another_then_are_dealt_round_robin_as_rasampler_does(world, repeats):
    order = epoch_order(20, 2, 6)
    laid_out = np.repeat(order, repeats)  # RASampler: [a, a, a, b, b, b, ...] before the deal
    for rank in range(world):
        tasks = rank_batches(20, 4, 2, 6, rank, world, "partial", repeats=repeats)
        np.testing.assert_array_equal(np.concatenate([t.indices for t in tasks]), laid_out[rank::world])
    ranks_of = {}
    for rank in range(world):
        for index, _ in pairs(rank_batches(20, 4, 2, 6, rank, world, "partial", repeats=repeats)):
            ranks_of.setdefault(index, set()).add(rank)
    assert all(len(ranks) == min(repeats, world) for ranks in ranks_of.values())  # repeats spread over ranks


@pytest.mark.parametrize("world, last_batch", list(itertools.product([1, 2, 3], ["partial", "drop", "pad"])))
def test_one_repeat_is_the_plain_deal_with_every_repeat_number_zero(world, last_batch):
    for rank in range(world):
        plain = rank_batches(13, 3, 5, 2, rank, world, last_batch)
        once = rank_batches(13, 3, 5, 2, rank, world, last_batch, repeats=1)
        assert len(plain) == len(once) == batch_count(13, 3, world, rank, last_batch)
        for a, b in zip(plain, once):
            for field in ("indices", "valid", "repeats"):
                np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
            assert b.repeats.dtype == np.int64 and not b.repeats.any()


def test_repeat_zero_draws_are_bit_identical_and_other_repeats_draw_anew():
    plan = build_plan(spec_from_dict({"version": 1, "source": {"type": "folder", "root": "/nonexistent"},
                                      "batch_size": 2, "ops": TRAIN_OPS}))
    indices = np.repeat(np.arange(50), 4)
    repeats = np.tile(np.arange(4), 50)
    plain = draws(plan, 7, 3, indices)
    keyed = draws(plan, 7, 3, indices, repeats)
    zero = draws(plan, 7, 3, indices, np.zeros(len(indices), dtype=np.int64))
    for position in plain:
        assert np.array_equal(plain[position], zero[position])  # bit for bit
        assert np.array_equal(keyed[position][repeats == 0], plain[position][repeats == 0])
        rows = keyed[position].reshape(50, 4, -1)
        for a, b in itertools.combinations(range(4), 2):
            assert not np.any(np.all(rows[:, a] == rows[:, b], axis=-1))  # every repeat draws anew
    everything = np.concatenate([v.ravel() for v in keyed.values()])
    assert 0.45 < everything.mean() < 0.55 and everything.min() >= 0.0 and everything.max() < 1.0


@pytest.mark.parametrize("value, snippet", [(0, "expected an integer >= 1, found 0"),
                                            ("3", "expected an integer >= 1, found a string '3'")])
def test_repeated_augmentations_below_one_is_refused_naming_the_key(value, snippet):
    with pytest.raises(SpecError) as caught:
        spec_from_dict({"version": 1, "source": {"type": "folder", "root": "/x"}, "batch_size": 2,
                        "ops": TRAIN_OPS, "loader": {"repeated_augmentations": value}})
    assert "loader.repeated_augmentations" in str(caught.value) and snippet in str(caught.value)


def test_repeated_augmentations_defaults_to_one_and_survives_the_resolved_spec():
    base = {"version": 1, "source": {"type": "folder", "root": "/x"}, "batch_size": 2, "ops": TRAIN_OPS}
    assert spec_from_dict(base).loader.repeated_augmentations == 1
    spec = spec_from_dict({**base, "loader": {"repeated_augmentations": 3}})
    assert spec.loader.repeated_augmentations == 3 and spec_from_dict(spec.to_dict()) == spec


# ---------------------------------------------------------------------------------------------
# The loader on both CPU backends

def loader_data(root, repeats: int, last_batch: str = "partial") -> dict:
    return {"version": 1, "source": {"type": "folder", "root": str(root)}, "batch_size": 5, "seed": 4,
            "ops": TRAIN_OPS, "outputs": ["image", "index", "valid"],
            "loader": {"workers": 1, "repeated_augmentations": repeats, "last_batch": last_batch}}


def images_by_index(loader) -> dict[int, list[torch.Tensor]]:
    found: dict[int, list[torch.Tensor]] = {}
    for image, index, valid in loader:
        for picture, i, ok in zip(image, index.tolist(), valid.tolist()):
            if ok:
                found.setdefault(i, []).append(picture)
    return found


@pytest.mark.parametrize("backend", backend_params(["dali-cpu", "torchvision"]))
def test_each_repeat_of_a_sample_is_augmented_differently_and_repeat_zero_is_the_plain_pixels(
        sample_root, backend):
    from dali_bridge.loader.loader import build_loader

    with build_loader(loader_data(sample_root, 3), backend) as loader:
        assert len(loader) == batch_count(37, 5, 1, 0, "partial", repeats=3) == 23
        found = images_by_index(loader)
    assert sorted(found) == list(range(37)) and {len(v) for v in found.values()} == {3}
    for pictures in found.values():
        for a, b in itertools.combinations(pictures, 2):
            assert not torch.equal(a, b)
    with build_loader(loader_data(sample_root, 1), backend) as plain:
        once = images_by_index(plain)
    # the first of the three copies is repeat 0: the pixels a pipeline without repetition gives
    assert all(torch.equal(found[i][0], once[i][0]) for i in range(37))


def test_resuming_mid_epoch_with_repeats_continues_with_the_same_batches(sample_root):
    from dali_bridge.loader.loader import build_loader

    data = loader_data(sample_root, 3, last_batch="pad")
    with build_loader(data, "torchvision") as loader:
        batches = [(image.clone(), index.clone()) for image, index, _ in loader]
        assert len(batches) == 23  # 37 x 3 = 111 entries, padded to 115
    with build_loader(data, "torchvision") as loader:
        head = iter(loader)
        for _ in range(9):
            next(head)
        state = loader.state_dict()
        head.close()
    assert state["repeated_augmentations"] == 3 and state["batch"] == 9
    with build_loader(data, "torchvision") as fresh:
        fresh.load_state_dict(state)
        assert (len(fresh), fresh.batches_done, fresh.batches_remaining) == (23, 9, 14)
        rest = [(image, index) for image, index, _ in fresh]
    assert len(rest) == 14
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(batches[9:], rest))


def test_states_saved_before_repeated_augmentation_still_load_and_a_mismatch_is_refused(sample_root):
    from dali_bridge.loader.loader import build_loader

    with build_loader(loader_data(sample_root, 1), "torchvision") as loader:
        # a format 1 state as dali-bridge wrote it before repeated augmentation (and elastic resume)
        current = loader.state_dict()
        old = {"format": 1, "rank": 0, "skipped": 0,
               **{k: current[k] for k in ("epoch", "batch", "seed", "num_samples", "batch_size", "world_size",
                                          "last_batch", "shuffle")}}
        loader.load_state_dict({**old, "batch": 2})
        assert loader.batches_remaining == batch_count(37, 5, 1, 0, "partial") - 2
        with pytest.raises(ValueError, match="repeated_augmentations is 3 in the state and 1 here"):
            loader.load_state_dict({**old, "repeated_augmentations": 3})
    with build_loader(loader_data(sample_root, 3), "torchvision") as repeated:
        with pytest.raises(ValueError, match="repeated_augmentations is 1 in the state and 3 here"):
            repeated.load_state_dict(old)


@pytest.mark.slow
def test_ops_after_the_finish_draw_each_repeat_anew(sample_root):
    """random_erasing runs on the finished batch in the loader: its draws key on the repeat number too."""
    from dali_bridge.loader.loader import build_loader

    data = loader_data(sample_root, 3)
    data["ops"] = [{"center_crop": 48}, {"normalize": {}}, {"random_erasing": {"probability": 1.0, "value": 0}}]
    with build_loader(data, "torchvision") as loader:
        found = images_by_index(loader)
    erased = {i: [tuple((picture == 0).all(dim=0).nonzero().min(dim=0).values.tolist()) for picture in pictures]
              for i, pictures in found.items()}
    # each sample's three copies have their erased box at different places (not all three the same)
    assert sum(len(set(corners)) > 1 for corners in erased.values()) >= 30
