"""``loader.shuffle: shards``: shards shuffled, then samples within a window of shards, from (seed,
epoch) only — a permutation, exactly once across ranks, resumable, the same on every backend —
and the quality report (`dali-bridge show --order`) that compares it with a global shuffle."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers.backends import CPU_BACKENDS
from tests.helpers.paths import TRAIN
from dali_bridge import build_loader
from dali_bridge.tools.convert import convert
from dali_bridge.data.shards.order import ShardWindows, order_quality, quality_report, shard_window_order
from dali_bridge.spec.pipeline import spec_from_dict
from dali_bridge.spec.problems import SpecError

SHARDS = "train-{000000..000007}.tar"


@pytest.fixture(scope="session")
def small_shards(sample_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 37-image sample set as 8 shards of 5 (the last of 2)."""
    out = tmp_path_factory.mktemp("order-shards")
    convert(sample_root, str(out / "train-%06d.tar"), shard_size=5)
    return out


def overrides(folder: Path, window: int = 2, **extra) -> dict:
    return {"source": {"type": "webdataset", "shards": str(folder / SHARDS)}, "batch_size": 4,
            "loader.workers": 1, "loader.shuffle": "shards", "loader.shuffle_window": window,
            "outputs": ["image", "label", "index"], "ops.0.random_resized_crop.size": 32, **extra}


def class_sorted(num_shards: int = 40, per_shard: int = 50, classes: int = 20) -> tuple[np.ndarray, np.ndarray]:
    """(labels, shard of each sample) of a class-sorted set, as converting an ImageFolder makes it."""
    shard_of = np.repeat(np.arange(num_shards), per_shard)
    labels = np.sort(np.arange(num_shards * per_shard) % classes)
    return labels, shard_of


def test_the_order_is_a_permutation_drawn_from_seed_and_epoch_only():
    _, shard_of = class_sorted()
    windows = ShardWindows(shard_of, 4)
    order = shard_window_order(windows, seed=3, epoch=1)
    assert sorted(order.tolist()) == list(range(len(shard_of)))
    assert np.array_equal(order, shard_window_order(ShardWindows(shard_of.copy(), 4), seed=3, epoch=1))
    assert not np.array_equal(order, shard_window_order(windows, seed=3, epoch=2))
    assert not np.array_equal(order, shard_window_order(windows, seed=4, epoch=1))


def test_each_window_holds_the_samples_of_its_shards_only():
    _, shard_of = class_sorted()
    order = shard_window_order(ShardWindows(shard_of, 4), seed=0, epoch=0)
    for window in range(10):  # 40 shards of 50: windows of 200 samples from 4 shards each
        assert len(set(shard_of[order[window * 200:(window + 1) * 200]].tolist())) == 4


def test_small_windows_mix_fewer_classes_per_batch_than_a_global_shuffle():
    labels, shard_of = class_sorted()
    quality = {w: order_quality(labels, shard_window_order(ShardWindows(shard_of, w), 0, 0), 64) for w in (1, 8, 40)}
    from dali_bridge.pipeline.sampling import epoch_order
    reference = order_quality(labels, epoch_order(len(labels), 0, 0), 64)
    assert quality[1].distinct_classes < 2.5 < quality[8].distinct_classes < reference.distinct_classes + 0.5
    assert quality[1].entropy_bits < quality[8].entropy_bits < reference.entropy_bits + 0.05
    rows = quality_report(labels, shard_of, 64, 0, [1, 8, 40], chosen=8, global_order=epoch_order(len(labels), 0, 0))
    assert [r["window"] for r in rows] == ["-", "1", "8", "40"] and rows[2]["order"] == "shards (this pipeline)"


@pytest.mark.parametrize("world_size", [1, 2])
def test_every_sample_comes_once_across_ranks_and_every_backend_gives_the_same_order(small_shards, world_size):
    orders = {}
    for backend in CPU_BACKENDS:
        per_rank = []
        for rank in range(world_size):
            loader = build_loader(TRAIN, backend, overrides=overrides(small_shards), rank=rank, world_size=world_size)
            loader.set_epoch(1)
            per_rank.append([i for _, _, index in loader for i in index.tolist()])
            loader.close()
        orders[backend] = per_rank
        seen = [i for indices in per_rank for i in indices]
        assert sorted(seen) == list(range(37))
    assert len({repr(o) for o in orders.values()}) == 1


def test_a_shard_ordered_run_resumes_mid_epoch_with_the_same_batches(small_shards):
    whole = build_loader(TRAIN, "torchvision", overrides=overrides(small_shards))
    expected = [tuple(t.clone() for t in batch) for batch in whole]
    whole.close()
    first = build_loader(TRAIN, "torchvision", overrides=overrides(small_shards))
    iterator = iter(first)
    for _ in range(3):
        next(iterator)
    state = first.state_dict()
    iterator.close()
    first.close()
    assert state["shuffle"] == "shards" and state["shuffle_window"] == 2
    resumed = build_loader(TRAIN, "torchvision", overrides=overrides(small_shards))
    resumed.load_state_dict(state)
    rest = list(resumed)
    resumed.close()
    assert len(rest) == len(expected) - 3
    assert all(torch.equal(x, y) for got, want in zip(rest, expected[3:]) for x, y in zip(got, want))
    other_window = build_loader(TRAIN, "torchvision", overrides=overrides(small_shards, window=3))
    with pytest.raises(ValueError, match="shuffle_window"):
        other_window.load_state_dict(state)
    other_window.close()


def test_show_order_prints_classes_per_batch_and_entropy_against_a_global_shuffle(small_shards, write_pipeline,
                                                                                capsys):
    from dali_bridge.cli.main import main

    pipeline = write_pipeline(source={"type": "webdataset", "shards": str(small_shards / SHARDS)},
                              loader__shuffle="shards", loader__shuffle_window=2)
    assert main(["show", "--order", str(pipeline)]) == 0
    out = capsys.readouterr().out
    assert "global shuffle" in out and "shards (this pipeline)" in out
    assert "classes/batch" in out and "entropy" in out


def test_shuffle_shards_needs_shards_and_a_window_of_at_least_one(tmp_path):
    def spec(source: dict, **loader):
        return spec_from_dict({"version": 1, "batch_size": 2, "ops": [{"center_crop": {"size": 8}}],
                               "source": source, "loader": loader}, base_dir=tmp_path)

    shards = {"type": "webdataset", "shards": "s-{0..1}.tar"}
    assert spec(shards, shuffle="shards").loader.shuffle == "shards"
    with pytest.raises(SpecError, match="needs a webdataset source"):
        spec({"type": "folder", "root": "x"}, shuffle="shards")
    with pytest.raises(SpecError, match="loader.shuffle_window: expected an integer >= 1"):
        spec(shards, shuffle="shards", shuffle_window=0)
    with pytest.raises(SpecError, match="loader.shuffle: expected true or false, found a string 'shard' "
                                        r"\(or 'shards' for a webdataset source"):
        spec(shards, shuffle="shard")


def test_the_decode_ceiling_reads_in_the_shard_aware_order(small_shards):
    from dali_bridge.bench.baselines import ceiling
    from dali_bridge.pipeline.sampling import epoch_order
    from dali_bridge.data.shards.order import windows_of
    from dali_bridge.data.sources.local import list_source

    spec = spec_from_dict({"version": 1, "batch_size": 4, "ops": [{"center_crop": {"size": 8}}],
                           "source": {"type": "webdataset", "shards": str(small_shards / SHARDS)},
                           "loader": {"shuffle": "shards", "shuffle_window": 2}})
    listing = list_source(spec.source)
    stream, stop = ceiling(spec, listing, threads=1)
    first = [next(stream)[1].tolist() for _ in range(3)]
    stop()
    expected = epoch_order(37, spec.seed, 0, "shards", windows_of(listing, spec.loader)).tolist()
    assert sum(first, []) == expected[:12]
