"""Elastic resume: a state saved by ranks that stepped together continues the epoch on any world size.

What ranks stepping round-robin have consumed is a prefix of the epoch's sequence (its order with
the repeats), so the state is one position, the same on every rank; a loader of another world size
deals the rest of the epoch from there. Checked here in one process (loaders given ``rank=`` and
``world_size=``, as torchrun's ranks would build them); ``test_elastic_resume_torchrun.py`` runs the
same story under torchrun with its processes killed.
"""
from __future__ import annotations

import random
import shutil
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers.backends import backend_params
from dali_bridge import build_loader
from dali_bridge.pipeline.sampling import batch_count, entries_consumed, rank_batches
from tests.helpers.elastic import BATCH, KEPT, SAMPLES, image_folder, kept, pipeline, reference, rows, take


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return image_folder(tmp_path_factory.mktemp("elastic"))


def stopped_ranks(root: Path, world: int, last_batch: str, backend: str = "torchvision", count: int = KEPT,
                  workers: int = 0) -> tuple[list[dict], Counter]:
    """``world`` ranks each take ``count`` batches of epoch 0: their states and what they yielded."""
    states, seen = [], Counter()
    for rank in range(world):
        loader = build_loader(pipeline(root, last_batch, workers), backend, rank=rank, world_size=world)
        iterator = iter(loader)
        seen += kept([rows(next(iterator)) for _ in range(count)])
        states.append(loader.state_dict())   # read while the iteration is live: stopped, not broken out of
        loader.close()
    return states, seen


# ---------------------------------------------------------------------------------------------
# The deal (pure functions)

def test_the_rest_of_an_epoch_dealt_from_a_prefix_covers_each_entry_once_on_any_world_size():
    chooser = random.Random(3)
    for _ in range(300):
        n, repeats, batch = chooser.randint(1, 30), chooser.randint(1, 3), chooser.randint(1, 5)
        old_world, new_world = chooser.randint(1, 4), chooser.randint(1, 5)
        policy = chooser.choice(["partial", "drop", "pad"])
        case = (n, repeats, batch, old_world, new_world, policy)
        full = [rank_batches(n, batch, 3, 1, rank, old_world, policy, repeats=repeats) for rank in range(old_world)]
        steps = chooser.randint(0, len(full[0]))
        start = entries_consumed(steps, remaining=n * repeats, batch_size=batch, world_size=old_world)
        for rank in range(old_world):   # the same world size: exactly the uninterrupted batches
            same = rank_batches(n, batch, 3, 1, rank, old_world, policy, repeats=repeats, start=start,
                                first_number=steps)
            assert [(t.number, t.indices.tolist(), t.valid.tolist(), t.repeats.tolist()) for t in same] == \
                [(t.number, t.indices.tolist(), t.valid.tolist(), t.repeats.tolist()) for t in full[rank][steps:]]
        new = [rank_batches(n, batch, 3, 1, rank, new_world, policy, repeats=repeats, start=start)
               for rank in range(new_world)]
        entries = Counter((int(i), int(r)) for tasks in [t[:steps] for t in full] + new for task in tasks
                          for i, ok, r in zip(task.indices, task.valid, task.repeats) if ok)
        assert max(entries.values(), default=1) == 1, case
        assert all(len(task.indices) for tasks in new for task in tasks), case   # never an empty batch
        assert [len(tasks) for tasks in new] == [batch_count(n, batch, new_world, rank, policy, repeats, start=start)
                                                for rank in range(new_world)], case
        if policy != "drop":
            assert set(entries) == {(i, r) for i in range(n) for r in range(repeats)}, case
        if policy != "partial":
            assert len({len(tasks) for tasks in new}) == 1, case
            assert all(len(task.indices) == batch for tasks in new for task in tasks), case


# ---------------------------------------------------------------------------------------------
# The loader: state, resume on another world size, the next epoch

@pytest.mark.parametrize("last_batch", ["partial", "drop", "pad"])
@pytest.mark.parametrize("new_world", [1, 3])
def test_two_ranks_stopped_mid_epoch_continue_on_another_world_size_each_entry_once_with_its_pixels(
        root, last_batch, new_world):
    everything = reference(root)
    states, before = stopped_ranks(root, 2, last_batch)
    assert states[0] == states[1]   # the job's place: the same dict on every rank
    assert (states[0]["epoch"], states[0]["batch"], states[0]["position"]) == (0, KEPT, KEPT * BATCH * 2)
    after, lengths, remaining, next_epoch = Counter(), [], [], []
    for rank in range(new_world):
        with build_loader(pipeline(root, last_batch), "torchvision", rank=rank, world_size=new_world) as loader:
            loader.load_state_dict(states[0])
            lengths.append(len(loader))
            remaining.append(loader.batches_remaining)
            assert loader.batches_done == KEPT
            rest = take(loader)
            assert len(rest) == remaining[-1] and all(rest)
            if last_batch != "partial":
                assert all(len(batch) == BATCH for batch in rest)
            after += kept(rest)
            next_epoch.append(take(loader))
        with build_loader(pipeline(root, last_batch), "torchvision", rank=rank, world_size=new_world) as fresh:
            fresh.set_epoch(1)
            assert next_epoch[-1] == take(fresh)    # the next epoch: as if the job always had this size
    union = before + after
    assert max(union.values()) == 1
    if last_batch == "drop":
        assert not union - everything[0]
        assert sum(union.values()) == 2 * KEPT * BATCH + new_world * BATCH * remaining[0]
    else:
        assert union == everything[0]
    if last_batch != "partial":
        assert len(set(lengths)) == len(set(remaining)) == 1   # every rank the same len() for the rest
    assert all(length == KEPT + left for length, left in zip(lengths, remaining))


def test_a_second_change_of_world_size_in_the_same_epoch_still_gives_each_entry_once(root):
    everything = reference(root)
    states, seen = stopped_ranks(root, 2, "partial", count=1)
    middle = []
    for rank in range(3):   # 3 ranks take one batch more, then the job comes back on 1
        with build_loader(pipeline(root), "torchvision", rank=rank, world_size=3) as loader:
            loader.load_state_dict(states[0])
            iterator = iter(loader)
            seen += kept([rows(next(iterator))])
            middle.append(loader.state_dict())
    assert middle[0] == middle[1] == middle[2]
    assert (middle[0]["batch"], middle[0]["position"]) == (2, 2 * BATCH + 3 * BATCH)
    with build_loader(pipeline(root), "torchvision") as last:
        last.load_state_dict(middle[0])
        seen += kept(take(last))
    assert seen == everything[0]


@pytest.mark.parametrize("backend", backend_params(["dali-cpu", "torchvision"]))
@pytest.mark.slow
def test_changing_the_worker_count_between_save_and_resume_changes_nothing_of_the_stream(root, backend):
    with build_loader(pipeline(root, workers=1), backend) as whole:
        uninterrupted = take(whole)
    states, _ = stopped_ranks(root, 1, "partial", backend=backend, count=3, workers=1)
    for workers in (0, 2):
        with build_loader(pipeline(root, workers=workers), backend) as resumed:
            resumed.load_state_dict(states[0])
            assert take(resumed) == uninterrupted[3:], f"workers {workers}"


def test_a_rank_past_its_last_batch_under_partial_saves_the_jobs_place_until_its_epoch_ends(root):
    data = {**pipeline(root, repeats=1), "batch_size": 5}   # 11 samples over 2 ranks: 6 and 5, 2 batches and 1
    short = build_loader(data, "torchvision", rank=1, world_size=2)
    long = build_loader(data, "torchvision", rank=0, world_size=2)
    short_iterator, long_iterator = iter(short), iter(long)
    next(short_iterator)
    next(long_iterator)
    assert short.state_dict() == long.state_dict()   # rank 1 has no batch left, rank 0 has one: still epoch 0
    assert (short.state_dict()["epoch"], short.batches_remaining, long.batches_remaining) == (0, 0, 1)
    assert next(short_iterator, None) is None and short.state_dict()["epoch"] == 1   # its epoch ended
    next(long_iterator)
    assert long.state_dict() == short.state_dict()
    short.close()
    long.close()


def test_a_state_at_the_end_of_the_epoch_for_the_new_world_size_resumes_at_the_next_epoch(root):
    # drop, one rank, 6 of 7 batches: 22 - 18 = 4 entries left, one batch for 1 rank, none for 2
    states, _ = stopped_ranks(root, 1, "drop", count=6)
    with build_loader(pipeline(root, "drop"), "torchvision", rank=1, world_size=2) as loader:
        loader.load_state_dict(states[0])
        assert (loader.epoch, loader.batches_done, len(loader)) == (1, 0, batch_count(SAMPLES, BATCH, 2, 1, "drop", 2))


# ---------------------------------------------------------------------------------------------
# States from ranks that did not step together; states from before elastic resume

def test_states_of_ranks_at_different_batches_are_refused_with_what_to_save(root):
    behind, _ = stopped_ranks(root, 2, "partial", count=1)
    ahead, _ = stopped_ranks(root, 2, "partial", count=2)
    with build_loader(pipeline(root), "torchvision", rank=0, world_size=3) as loader:
        with pytest.raises(ValueError, match=r"the ranks' loader states differ: \[0\] is at epoch 0 batch 2 .*"
                                             r"\[1\] at epoch 0 batch 1 .*Save the state after a step every "
                                             r"rank takes"):
            loader.load_state_dict([ahead[0], behind[1]])
        loader.load_state_dict(ahead)    # the same step on every rank: one state
        assert loader.batches_done == 2


def legacy(state: dict, rank: int) -> dict:
    """``state`` as dali-bridge wrote it before elastic resume (format 1: one rank's place, no fingerprint)."""
    return {"format": 1, "rank": rank, "skipped": 0,
            **{key: state[key] for key in ("epoch", "batch", "seed", "num_samples", "batch_size", "world_size",
                                           "last_batch", "shuffle", "repeated_augmentations")}}


def test_a_state_from_before_elastic_resume_loads_at_its_own_world_size_and_rank_only(root):
    states, _ = stopped_ranks(root, 2, "pad")
    with build_loader(pipeline(root, "pad"), "torchvision", rank=1, world_size=2) as whole:
        expected = take(whole)[KEPT:]
    with build_loader(pipeline(root, "pad"), "torchvision", rank=1, world_size=2) as same:
        same.load_state_dict(legacy(states[1], rank=1))
        assert take(same) == expected
    with build_loader(pipeline(root, "pad"), "torchvision", rank=0, world_size=3) as other:
        with pytest.raises(ValueError, match=r"holds one rank's place \(rank 1 of world size 2; format 1.*pass the "
                                             r"states of all 2 ranks as a list"):
            other.load_state_dict(legacy(states[1], rank=1))
        other.load_state_dict([legacy(states[0], rank=0), legacy(states[1], rank=1)])  # every rank: the job's place
        assert (other.batches_done, other.state_dict()["position"]) == (KEPT, states[0]["position"])


# ---------------------------------------------------------------------------------------------
# Checked fields

def fresh_state(root: Path) -> dict:
    with build_loader(pipeline(root), "torchvision") as loader:
        iterator = iter(loader)
        next(iterator)
        return loader.state_dict()


@pytest.mark.parametrize("change, message", [
    ({"epoch": -5}, r"epoch must be an integer in \[0, 4294967296\), found -5"),
    ({"epoch": 1 << 32}, r"epoch must be an integer in \[0, 4294967296\), found 4294967296"),
    ({"batch": 1.5}, r"batch must be an integer >= 0, found 1.5"),
    ({"batch": True}, r"batch must be an integer >= 0, found True"),
    ({"batch": "3"}, r"batch must be an integer >= 0, found '3'"),
    ({"position": 3, "batch": 4}, r"batch 4 and position 3 do not go together"),
    ({"shuffle": 1}, r"shuffle must be true, false or 'shards', found 1"),
    ({"last_batch": "keep"}, r"last_batch must be one of partial, drop, pad, found 'keep'"),
    ({"dataset": "abc"}, r"dataset must be a 64-digit hex SHA-256, found 'abc'"),
    ({"position": None}, r"position must be an integer >= 0, found None"),
    ({"extra": 1}, r"unknown key\(s\) 'extra'"),
    ({"format": True}, r"unknown loader state format True"),
    ({"position": 10 ** 6}, r"position 1000000 is outside this epoch's 22 entries"),
])
def test_every_field_of_a_state_is_checked_and_the_error_names_it(root, change, message):
    state = {**fresh_state(root), **change}
    with build_loader(pipeline(root), "torchvision") as loader:
        with pytest.raises(ValueError, match=message):
            loader.load_state_dict(state)


def test_a_state_with_a_key_missing_or_not_a_mapping_says_what_to_pass(root):
    state = fresh_state(root)
    with build_loader(pipeline(root), "torchvision") as loader:
        with pytest.raises(ValueError, match=r"loader state has no 'position' \(a format 2 state holds format, "
                                             r"epoch, batch.*pass what loader.state_dict\(\) returned"):
            loader.load_state_dict({k: v for k, v in state.items() if k != "position"})
        with pytest.raises(TypeError, match=r"loader state must be a mapping .* found str"):
            loader.load_state_dict("state.json")
        with pytest.raises(ValueError, match=r"no loader state to load: the sequence of states is empty"):
            loader.load_state_dict([])


def test_a_state_from_another_dataset_of_the_same_size_is_refused(root, tmp_path):
    from tests.helpers.hostile import write_image_folder

    write_image_folder(tmp_path / "other", classes=1, per_class=SAMPLES, seed=4)
    (tmp_path / "other" / "class_0" / "img_000.jpg").rename(tmp_path / "other" / "class_0" / "renamed.jpg")
    state = fresh_state(root)
    with build_loader(pipeline(tmp_path / "other"), "torchvision") as loader:
        assert loader.num_samples == state["num_samples"]
        with pytest.raises(ValueError, match=r"saved on another dataset \(listing fingerprint [0-9a-f]{12}… in the "
                                             r"state, [0-9a-f]{12}… here; 11 samples in both\)"):
            loader.load_state_dict(state)
        loader.load_state_dict(legacy(state, rank=0))   # format 1 has no fingerprint: the count is all it checks
    moved = tmp_path / "moved"
    shutil.copytree(root, moved)
    with build_loader(pipeline(moved), "torchvision") as same_files:   # the same dataset under another root
        same_files.load_state_dict(state)
        assert same_files.batches_done == 1


@pytest.mark.parametrize("epoch, error", [(-1, ValueError), (1 << 32, ValueError), (True, TypeError),
                                          (1.0, TypeError), ("2", TypeError)])
def test_set_epoch_refuses_negative_huge_and_non_integer_epochs(root, epoch, error):
    with build_loader(pipeline(root), "torchvision") as loader:
        with pytest.raises(error, match=r"epoch must be"):
            loader.set_epoch(epoch)
        loader.set_epoch((1 << 32) - 1)    # the largest epoch whose draws differ from every other's
        assert loader.epoch == (1 << 32) - 1
