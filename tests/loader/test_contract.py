"""The loader contract, pinned once and run on every backend (dali-cpu and torchvision here; dali on a GPU).

Order is a pure function of (seed, epoch); ranks share an epoch exactly as the last-batch policy
says; every random parameter is a pure function of (seed, epoch, sample index), so the same
sample gives the same pixels whatever its batch position, rank layout or worker count; a run
resumes exactly in a new process; loaders start, stop and go away cleanly.
"""
from __future__ import annotations

import gc
import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.backends import backend_params
from tests.helpers.paths import TRAIN
from tests.helpers.processes import child_processes, os_threads, settle
from dali_bridge import build_loader
from dali_bridge.backends.base import resolve_topology
from dali_bridge.loader.loader import Loader
from dali_bridge.pipeline.sampling import epoch_order

BACKENDS = backend_params()
SAMPLES = 37   # the sample_root fixture: 37 images in 3 classes
BATCH = 5
SIZE = 48      # a small random_resized_crop output keeps the suite fast


def overrides(root: Path, **extra: Any) -> dict[str, Any]:
    """The shipped train pipeline on the small sample set, with every output requested."""
    base: dict[str, Any] = {"source": {"type": "folder", "root": str(root)}, "batch_size": BATCH,
                            "outputs": ["image", "label", "index", "valid"], "loader.workers": 1,
                            "ops.0.random_resized_crop.size": SIZE}
    base.update(extra)
    return base


UINT8_HWC = {"ops.2": {"normalize": {"dtype": "uint8", "layout": "HWC"}}}  # raw levels: exact comparisons


def make(root: Path, backend: str, *, rank: int | None = None, world_size: int | None = None,
         **extra: Any) -> Loader:
    return build_loader(TRAIN, backend, overrides=overrides(root, **extra), rank=rank, world_size=world_size)


def epoch(loader: Loader) -> list[dict[str, Any]]:
    """One iteration of the loader as host data, one dict per batch."""
    out = []
    for image, label, index, valid in loader:
        out.append({"image": image.cpu(), "label": label.cpu().numpy(), "index": index.cpu().numpy(),
                    "valid": valid.cpu().numpy()})
    return out


def indices(batches: list[dict[str, Any]]) -> np.ndarray:
    return np.concatenate([b["index"] for b in batches]) if batches else np.zeros(0, dtype=np.int64)


def images_by_index(batches: list[dict[str, Any]]) -> dict[int, torch.Tensor]:
    found: dict[int, torch.Tensor] = {}
    for batch in batches:
        for row, index in enumerate(batch["index"].tolist()):
            if batch["valid"][row]:
                found[index] = batch["image"][row]
    return found


def assert_same_pixels(a: dict[int, torch.Tensor], b: dict[int, torch.Tensor], backend: str) -> None:
    """Same sample → same image. Exact on CPU backends; on `dali` (GPU) nvJPEG splits a batch between
    the hardware decoder and the CUDA decoder by position (hw_decoder_load), whose IDCT/upsampling may
    round differently by a level or two, so a sample moved to another position may differ by <= 2."""
    assert a.keys() == b.keys()
    tolerance = 2 if backend == "dali" else 0
    for index in a:
        diff = (a[index].to(torch.int16) - b[index].to(torch.int16)).abs().max().item()
        assert diff <= tolerance, f"sample {index}: pixels differ by {diff} levels between the two runs"


def digest(image: torch.Tensor) -> str:
    return hashlib.sha256(image.cpu().contiguous().numpy().tobytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Order

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_order_is_the_seed_epoch_permutation_and_set_epoch_selects_it(sample_root, backend):
    loader = make(sample_root, backend, seed=7)
    assert loader.backend == backend and loader.batch_size == BATCH and loader.num_samples == SAMPLES
    for chosen in (3, 0, 3):
        loader.set_epoch(chosen)
        assert loader.epoch == chosen
        got = indices(epoch(loader))
        np.testing.assert_array_equal(got, epoch_order(SAMPLES, 7, chosen))
    assert not np.array_equal(epoch_order(SAMPLES, 7, 0), epoch_order(SAMPLES, 7, 3))
    assert not np.array_equal(epoch_order(SAMPLES, 7, 0), epoch_order(SAMPLES, 8, 0))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_each_iteration_without_set_epoch_runs_the_next_epoch(sample_root, backend):
    loader = make(sample_root, backend, seed=3)
    for expected_epoch in range(3):
        assert loader.epoch == expected_epoch
        np.testing.assert_array_equal(indices(epoch(loader)), epoch_order(SAMPLES, 3, expected_epoch))
    loader.set_epoch(10)
    epoch(loader)
    np.testing.assert_array_equal(indices(epoch(loader)), epoch_order(SAMPLES, 3, 11))


def test_order_is_identical_across_cpu_backends(sample_root):
    from tests.helpers.backends import CPU_BACKENDS
    if len(CPU_BACKENDS) < 2:
        pytest.skip(f"needs two CPU backends, this host has {CPU_BACKENDS}")
    runs = {}
    for backend in CPU_BACKENDS:
        loader = make(sample_root, backend, seed=11)
        loader.set_epoch(4)
        runs[backend] = [b["index"] for b in epoch(loader)]
    first, second = (runs[b] for b in CPU_BACKENDS)
    assert len(first) == len(second)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("backend", BACKENDS)
def test_unshuffled_order_is_the_listing_order(sample_root, backend):
    loader = make(sample_root, backend, **{"loader.shuffle": False})
    loader.set_epoch(5)
    np.testing.assert_array_equal(indices(epoch(loader)), np.arange(SAMPLES))


# ---------------------------------------------------------------------------------------------
# Ranks and last-batch policies

def rank_epochs(root: Path, backend: str, world: int, policy: str, epoch_number: int = 1) -> list[list[dict]]:
    runs = []
    for rank in range(world):
        loader = make(root, backend, rank=rank, world_size=world, **{"loader.last_batch": policy})
        loader.set_epoch(epoch_number)
        expected_len = len(loader)
        batches = epoch(loader)
        assert len(batches) == expected_len, f"rank {rank}: len() said {expected_len}, yielded {len(batches)}"
        assert all(len(b["index"]) > 0 for b in batches), f"rank {rank}: an empty batch was yielded"
        for b in batches:
            assert b["image"].shape[0] == len(b["index"]) == len(b["label"]) == len(b["valid"])
        runs.append(batches)
    return runs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.slow
def test_partial_gives_every_sample_exactly_once_over_all_ranks(sample_root, backend, world):
    runs = rank_epochs(sample_root, backend, world, "partial")
    everything = np.concatenate([indices(r) for r in runs])
    np.testing.assert_array_equal(np.sort(everything), np.arange(SAMPLES))
    for rank, batches in enumerate(runs):
        sizes = [len(b["index"]) for b in batches]
        assert all(s == BATCH for s in sizes[:-1]) and 1 <= sizes[-1] <= BATCH, sizes
        assert all(b["valid"].all() for b in batches)
        # Rank r deals samples r, r+world, ... of the epoch order.
        np.testing.assert_array_equal(indices(batches), epoch_order(SAMPLES, 0, 1)[rank::world])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world", [2, 3])
def test_drop_yields_full_batches_and_equal_len_on_every_rank(sample_root, backend, world):
    runs = rank_epochs(sample_root, backend, world, "drop")
    lengths = {len(r) for r in runs}
    assert lengths == {(SAMPLES // world) // BATCH}
    everything = np.concatenate([indices(r) for r in runs])
    assert len(np.unique(everything)) == len(everything), "a sample was repeated under drop"
    assert all(len(b["index"]) == BATCH and b["valid"].all() for r in runs for b in r)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.slow
def test_pad_yields_full_batches_with_identifiable_padding(sample_root, backend, world):
    runs = rank_epochs(sample_root, backend, world, "pad")
    per_rank = -(-SAMPLES // world)
    assert {len(r) for r in runs} == {-(-per_rank // BATCH)}
    assert all(len(b["index"]) == BATCH for r in runs for b in r)
    valid = np.concatenate([b["index"][b["valid"]] for r in runs for b in r])
    padding = np.concatenate([b["index"][~b["valid"]] for r in runs for b in r])
    np.testing.assert_array_equal(np.sort(valid), np.arange(SAMPLES))
    assert len(padding) == world * len(runs[0]) * BATCH - SAMPLES > 0
    assert set(padding.tolist()) <= set(range(SAMPLES))
    for r in runs:  # padding only at the end of a rank's epoch
        flags = np.concatenate([b["valid"] for b in r])
        assert not flags[np.argmin(flags):].any() or flags.all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_batch_larger_than_the_share_gives_one_partial_batch(sample_root, backend):
    loader = make(sample_root, backend, rank=1, world_size=2, batch_size=64)
    batches = epoch(loader)
    assert len(loader) == len(batches) == 1
    assert len(batches[0]["index"]) == SAMPLES // 2


# ---------------------------------------------------------------------------------------------
# Randomness: a pure function of (seed, epoch, sample index), seen through the pixels

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_same_sample_gives_same_pixels_in_any_batch_position_rank_layout_or_worker_count(sample_root, backend):
    reference = make(sample_root, backend, **UINT8_HWC)
    reference.set_epoch(2)
    base = images_by_index(epoch(reference))
    assert len(base) == SAMPLES

    other_positions = make(sample_root, backend, batch_size=7, **UINT8_HWC)
    other_positions.set_epoch(2)
    assert_same_pixels(base, images_by_index(epoch(other_positions)), backend)

    ranks: dict[int, torch.Tensor] = {}
    for rank in range(3):
        loader = make(sample_root, backend, rank=rank, world_size=3, **UINT8_HWC)
        loader.set_epoch(2)
        ranks.update(images_by_index(epoch(loader)))
    assert_same_pixels(base, ranks, backend)

    # torchvision: worker processes 0 vs 2; DALI: threads 1 vs 2.
    workers = 0 if backend == "torchvision" else 2
    parallel = make(sample_root, backend, **UINT8_HWC, **{"loader.workers": workers, "batch_size": 3})
    parallel.set_epoch(2)
    assert_same_pixels(base, images_by_index(epoch(parallel)), backend)

    parallel = make(sample_root, backend, **UINT8_HWC, **{"loader.workers": 2})
    parallel.set_epoch(2)
    assert_same_pixels(base, images_by_index(epoch(parallel)), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_crops_and_flips_change_with_the_epoch_and_the_seed(sample_root, backend):
    runs = []
    for seed, chosen in ((0, 0), (0, 1), (1, 0)):
        loader = make(sample_root, backend, seed=seed, **UINT8_HWC)
        loader.set_epoch(chosen)
        runs.append(images_by_index(epoch(loader)))
    for other in runs[1:]:
        differing = sum(not torch.equal(runs[0][i], other[i]) for i in range(SAMPLES))
        assert differing >= SAMPLES - 2, f"only {differing} of {SAMPLES} samples changed"


# ---------------------------------------------------------------------------------------------
# Outputs

@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_follow_the_declared_order_dtypes_and_labels(sample_root, backend):
    from torchvision.datasets import ImageFolder

    loader = make(sample_root, backend, outputs=["index", "image", "valid", "label"])
    folder = ImageFolder(str(sample_root))
    assert tuple(loader.listing.classes) == tuple(folder.classes) == tuple(sorted(folder.classes))
    seen = 0
    for batch in loader:
        assert len(batch) == 4
        index, image, valid, label = batch
        assert index.dtype == torch.int64 and label.dtype == torch.int64 and valid.dtype == torch.bool
        assert image.dtype == torch.float32 and tuple(image.shape) == (len(index), 3, SIZE, SIZE)
        assert index.device == image.device == label.device == loader.device
        for i, lab in zip(index.tolist(), label.tolist()):
            assert Path(folder.samples[i][0]) == Path(loader.listing.paths[i])
            assert lab == folder.samples[i][1], f"sample {i}: label {lab}, ImageFolder says {folder.samples[i][1]}"
        seen += len(index)
    assert seen == SAMPLES


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_layouts_and_dtypes_are_as_declared_and_consistent(sample_root, backend):
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    results = {}
    for dtype, layout in (("float32", "CHW"), ("float16", "HWC"), ("uint8", "HWC"), ("uint8", "CHW")):
        norm = {"dtype": dtype, "layout": layout}
        if dtype != "uint8":
            norm.update(mean=mean, std=std)
        loader = make(sample_root, backend, **{"ops.2": {"normalize": norm}})
        loader.set_epoch(1)
        image = next(iter(loader))[0].cpu()
        expected_shape = (BATCH, 3, SIZE, SIZE) if layout == "CHW" else (BATCH, SIZE, SIZE, 3)
        assert tuple(image.shape) == expected_shape
        assert image.dtype == {"float32": torch.float32, "float16": torch.float16, "uint8": torch.uint8}[dtype]
        assert image.is_contiguous()
        results[(dtype, layout)] = image if layout == "CHW" else image.permute(0, 3, 1, 2)
    levels = results[("uint8", "HWC")]
    assert torch.equal(levels, results[("uint8", "CHW")])
    expected = (levels.float() / 255.0 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    torch.testing.assert_close(results[("float32", "CHW")], expected, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(results[("float16", "HWC")].float(), expected, atol=4e-3, rtol=1e-3)


# ---------------------------------------------------------------------------------------------
# Resumption

RESUME_SCRIPT = textwrap.dedent("""
    import hashlib, json, sys
    from dali_bridge import build_loader
    args = json.loads(sys.argv[1])
    loader = build_loader(args["pipeline"], args["backend"], overrides=args["overrides"])
    loader.load_state_dict(args["state"])
    out = {"len": len(loader), "done": loader.batches_done, "remaining": loader.batches_remaining,
           "batches": [], "next_epoch": []}
    for image, label, index, valid in loader:
        out["batches"].append([index.cpu().tolist(),
                               hashlib.sha256(image.cpu().contiguous().numpy().tobytes()).hexdigest()])
    for image, label, index, valid in loader:   # the epoch after the resumed one
        out["next_epoch"].append(index.cpu().tolist())
        break
    print(json.dumps(out))
""")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_resume_in_a_new_process_continues_with_the_next_batch(sample_root, backend, tmp_path):
    extra = {"seed": 5}
    full = make(sample_root, backend, **extra)
    full.set_epoch(2)
    uninterrupted = [(b["index"].tolist(), digest(b["image"])) for b in epoch(full)]
    following = epoch(full)[0]["index"].tolist()

    k = 3
    partial = make(sample_root, backend, **extra)
    partial.set_epoch(2)
    iterator = iter(partial)
    consumed = [next(iterator) for _ in range(k)]
    state = partial.state_dict()
    assert state["epoch"] == 2 and state["batch"] == k
    assert [b[2].cpu().tolist() for b in consumed] == [u[0] for u in uninterrupted[:k]]
    del iterator, consumed, partial
    gc.collect()

    script = tmp_path / "resume.py"
    script.write_text(RESUME_SCRIPT)
    payload = json.dumps({"pipeline": str(TRAIN), "backend": backend,
                          "overrides": overrides(sample_root, **extra), "state": state})
    done = subprocess.run([sys.executable, str(script), payload], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    resumed = json.loads(done.stdout.strip().splitlines()[-1])
    # len() is the epoch's length, as a DataLoader's; the resume point is batches_done
    assert (resumed["len"], resumed["done"], resumed["remaining"]) == (len(uninterrupted), k, len(uninterrupted) - k)
    assert [tuple(b) for b in resumed["batches"]] == uninterrupted[k:]
    assert resumed["next_epoch"][0] == following


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_a_resumed_loop_that_calls_set_epoch_neither_repeats_nor_loses_samples(sample_root, backend):
    source = make(sample_root, backend)
    source.set_epoch(1)
    iterator = iter(source)
    for _ in range(2):
        next(iterator)
    state = source.state_dict()
    del iterator
    fresh = make(sample_root, backend)
    fresh.load_state_dict(state)
    seen = []
    for number in range(state["epoch"], 3):     # the usual loop: set_epoch at the top of every epoch
        fresh.set_epoch(number)
        seen.append(indices(epoch(fresh)))
    np.testing.assert_array_equal(seen[0], epoch_order(SAMPLES, 0, 1)[2 * BATCH:])
    np.testing.assert_array_equal(seen[1], epoch_order(SAMPLES, 0, 2))
    fresh.load_state_dict(state)
    fresh.set_epoch(0)                           # another epoch: the resume point no longer applies
    np.testing.assert_array_equal(indices(epoch(fresh)), epoch_order(SAMPLES, 0, 0))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_state_at_the_end_of_an_epoch_resumes_at_the_next_epoch(sample_root, backend):
    loader = make(sample_root, backend)
    loader.set_epoch(4)
    epoch(loader)
    state = loader.state_dict()
    fresh = make(sample_root, backend)
    fresh.load_state_dict(json.loads(json.dumps(state)))   # a state survives JSON
    assert len(fresh) == len(loader)
    np.testing.assert_array_equal(indices(epoch(fresh)), epoch_order(SAMPLES, 0, 5))


@pytest.mark.parametrize("backend", BACKENDS)
def test_load_state_dict_refuses_a_state_from_another_seed_or_format(sample_root, backend):
    source = make(sample_root, backend, rank=0, world_size=2)
    iterator = iter(source)
    next(iterator)
    state = source.state_dict()
    del iterator
    with pytest.raises(ValueError, match=r"seed is 0 in the state and 9 here"):
        make(sample_root, backend, rank=0, world_size=2, seed=9).load_state_dict(state)
    with pytest.raises(ValueError, match=r"unknown loader state format"):
        make(sample_root, backend, rank=0, world_size=2).load_state_dict({**state, "format": 99})


# ---------------------------------------------------------------------------------------------
# Lifecycle

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_breaking_out_of_an_epoch_then_iterating_the_next_fully(sample_root, backend):
    loader = make(sample_root, backend)
    for number, _ in enumerate(loader):
        if number == 1:
            break
    assert loader.epoch == 1
    # A state saved after the break says what the live loader does next: epoch 1 from its start.
    state = loader.state_dict()
    assert (state["epoch"], state["batch"]) == (1, 0)
    fresh = make(sample_root, backend)
    fresh.load_state_dict(state)
    expected = epoch_order(SAMPLES, 0, 1)
    np.testing.assert_array_equal(indices(epoch(loader)), expected)
    np.testing.assert_array_equal(indices(epoch(fresh)), expected)
    assert loader.epoch == 2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_two_loaders_iterated_at_once_each_yield_their_own_batches(sample_root, backend):
    alone = make(sample_root, backend, seed=2)
    expected = [(b["index"].tolist(), digest(b["image"])) for b in epoch(alone)]
    first, second = make(sample_root, backend, seed=2), make(sample_root, backend, seed=3)
    got_first, got_second = [], []
    for a, b in zip(first, second):
        got_first.append((a[2].cpu().tolist(), digest(a[0])))
        got_second.append(b[2].cpu().tolist())
    assert got_first == expected
    assert [i for batch in got_second for i in batch] == epoch_order(SAMPLES, 3, 0)[:len(got_second) * BATCH].tolist()





@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc to count threads")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_collected_loader_leaves_no_threads_or_child_processes(sample_root, backend):
    import multiprocessing
    import threading

    def use_and_drop() -> None:
        loader = make(sample_root, backend, **{"loader.workers": 2})
        epoch(loader)
        for number, _ in enumerate(loader):   # an interrupted epoch too
            if number == 0:
                break

    # Children the session already had (a loopback server another folder's fixture started) are not the loader's.
    before = set(child_processes())
    active_before = set(multiprocessing.active_children())
    use_and_drop()      # warm-up: lazily created process-wide pools (torch intra-op, DALI) persist by design
    gc.collect()
    assert settle(lambda: not set(child_processes()) - before)
    threads, python_threads = os_threads(), len(threading.enumerate())
    for _ in range(2):
        use_and_drop()
        gc.collect()
    assert settle(lambda: os_threads() <= threads), f"OS threads grew from {threads} to {os_threads()}"
    assert len(threading.enumerate()) <= python_threads, threading.enumerate()
    assert settle(lambda: not set(child_processes()) - before), \
        f"child processes left: {sorted(set(child_processes()) - before)}"
    assert not set(multiprocessing.active_children()) - active_before


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_stops_the_loader_and_iterating_a_closed_loader_fails_clearly(sample_root, backend):
    with make(sample_root, backend) as loader:
        next(iter(loader))
    with pytest.raises(RuntimeError, match="closed"):
        next(iter(loader))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.slow
def test_plain_training_loop(sample_root, backend):
    loader = build_loader(TRAIN, backend, overrides={"source": {"type": "folder", "root": str(sample_root)},
                                                     "batch_size": 8, "ops.0.random_resized_crop.size": SIZE,
                                                     "loader.workers": 1})
    seen = []
    for number in range(2):
        loader.set_epoch(number)
        count = 0
        for x, y in loader:
            assert x.shape[1:] == (3, SIZE, SIZE) and x.dtype == torch.float32
            assert y.dtype == torch.int64 and set(y.tolist()) <= {0, 1, 2}
            count += len(y)
            loss = (x.float().mean() - y.float().mean()) ** 2   # something a training step would do
            assert torch.isfinite(loss)
        seen.append(count)
    assert seen == [SAMPLES, SAMPLES]


# ---------------------------------------------------------------------------------------------
# Distributed resolution

def test_rank_and_world_come_from_arguments_first(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    topology = resolve_topology(2, 3)
    assert (topology.rank, topology.world_size, topology.local_rank) == (2, 3, 1)


def test_rank_and_world_come_from_torchrun_environment(monkeypatch, sample_root):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    topology = resolve_topology()
    assert (topology.rank, topology.world_size, topology.local_rank) == (3, 4, 1)
    loader = make(sample_root, "torchvision" if "torchvision" in _host() else "dali-cpu")
    assert (loader.rank, loader.world_size) == (3, 4)
    np.testing.assert_array_equal(indices(epoch(loader)), epoch_order(SAMPLES, 0, 0)[3::4])


def test_rank_and_world_default_to_a_single_process(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    topology = resolve_topology()
    assert (topology.rank, topology.world_size) == (0, 1)
    assert topology.local_rank == 0


def test_rank_outside_the_world_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="rank 2 is not within world size 2"):
        resolve_topology(2, 2)


@pytest.mark.parametrize("name, value, message", [
    ("RANK", "abc", r"environment variable RANK='abc' is not a non-negative integer \(torchrun sets it"),
    ("RANK", "-1", r"environment variable RANK='-1' is not a non-negative integer"),
    ("WORLD_SIZE", "0", r"WORLD_SIZE=0: the world size must be at least 1"),
    ("WORLD_SIZE", "two", r"environment variable WORLD_SIZE='two'"),
    ("LOCAL_RANK", "x", r"environment variable LOCAL_RANK='x'"),
])
def test_an_unusable_torchrun_variable_is_named_with_its_value(monkeypatch, name, value, message):
    for other in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        resolve_topology()


def test_a_rank_outside_the_environment_world_names_both_variables(monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=r"rank 2 is not within world size 2 \(RANK=2, WORLD_SIZE=2\)"):
        resolve_topology()
    with pytest.raises(TypeError, match=r"rank=True is not an integer"):
        resolve_topology(True, 2)


def _host() -> list[str]:
    from tests.helpers.backends import CPU_BACKENDS
    return CPU_BACKENDS


@pytest.mark.parametrize("backend", backend_params(["dali-cpu"]))
def test_zero_workers_gives_dali_one_thread_not_every_core(sample_root, backend):
    loader = build_loader(TRAIN, backend, overrides={"source.root": str(sample_root), "loader.workers": 0})
    assert loader._executor.threads == 1
    assert [len(images) for images, _ in loader] == [37]  # the 37 samples in one partial batch
