"""loader.stats(): how long the consumer waited for batches and held them, and the verdict.

The clock's arithmetic is pinned with a fake clock (exact figures); the loader's hook with a
sleeping executor or a sleeping consumer, asserting only the verdict and generous bounds on the
fractions (never a speed).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch

from tests.helpers.paths import TRAIN
from dali_bridge import build_loader
from dali_bridge.backends.base import RawBatch, Topology
from dali_bridge.loader.loader import Loader
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.data.sources.local import list_source
from dali_bridge.spec.pipeline import load_spec
from dali_bridge.loader.stats import StepClock

BATCH = 4


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_clock_splits_each_step_into_wait_and_busy_and_leaves_the_startup_out_of_the_fraction():
    fake = FakeClock()
    clock = StepClock(backend="torchvision", workers=2, report=False, clock=fake)
    clock.asked(name="test", epoch=0)
    fake.now += 5.0          # the first batch: workers starting
    clock.handed(8)
    for _ in range(3):       # then each step: 0.6 s waiting, 0.4 s computing
        fake.now += 0.4
        clock.returned()
        fake.now += 0.6
        clock.handed(8)
    fake.now += 0.4
    clock.returned()
    figures = clock.figures()
    assert figures["batches"] == 4 and figures["images"] == 32
    assert abs(figures["wait_s"] - 6.8) < 1e-9 and abs(figures["startup_s"] - 5.0) < 1e-9
    assert abs(figures["busy_s"] - 1.6) < 1e-9
    assert abs(figures["data_wait_fraction"] - 1.8 / 3.4) < 1e-9
    assert abs(figures["loader_images_per_s"] - 24 / 3.4) < 1e-9
    assert abs(figures["consumer_images_per_s"] - 24 / 1.6) < 1e-9
    assert figures["verdict"].startswith("data-bound: 53 % of each step waited for data (loader 7 img/s, "
                                         "your steps consume 15 img/s); try `backend: dali`")
    assert "loader.workers, now 2" in figures["verdict"]


def test_clock_says_compute_bound_when_batches_are_ready_and_not_measured_before_a_second_batch():
    fake = FakeClock()
    clock = StepClock(backend="dali", workers=None, report=False, clock=fake)
    assert clock.figures()["verdict"].startswith("not measured yet")
    clock.asked(name="test", epoch=0)
    fake.now += 1.0
    clock.handed(4)
    assert clock.figures()["data_wait_fraction"] is None
    for _ in range(10):
        fake.now += 1.0
        clock.returned()
        fake.now += 0.01
        clock.handed(4)
    assert clock.figures()["verdict"] == "compute-bound: 1 % waiting"


class SleepingExecutor:
    """Hands back tiny batches after ``delay`` seconds each: a loader slower than any step."""

    device = torch.device("cpu")

    def __init__(self, delay: float):
        self.delay = delay

    def run(self, tasks):
        for task in tasks:
            time.sleep(self.delay)
            yield RawBatch(image=torch.zeros(len(task.indices), 3, 4, 4), indices=task.indices, valid=task.valid)

    def close(self) -> None:
        pass


def sleeping_loader(root: Path, delay: float, **loader_keys) -> Loader:
    keys = {"source": {"type": "folder", "root": str(root)}, "batch_size": BATCH, "loader.shuffle": False,
            **{f"loader.{k}": v for k, v in loader_keys.items()}}
    spec = load_spec(TRAIN, keys)
    return Loader(spec, list_source(spec.source), build_plan(spec), SleepingExecutor(delay), "torchvision",
                  Topology(0, 1, 0))


def test_a_slow_loader_is_data_bound_and_the_epoch_line_says_so(sample_root, caplog):
    loader = sleeping_loader(sample_root, 0.05, report_starvation=True)
    with caplog.at_level(logging.INFO, logger="dali_bridge"):
        for _ in loader:
            pass   # a step that takes no time at all
    figures = loader.stats()
    assert figures["batches"] == len(loader.tasks(0)) == 10
    assert figures["images"] == 37
    assert figures["data_wait_fraction"] > 0.9
    assert figures["wait_s"] > 0.4 and figures["busy_s"] < figures["wait_s"]
    assert figures["verdict"].startswith("data-bound: ")
    lines = [r for r in caplog.records if "epoch 0: data-bound" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING


def test_a_slow_consumer_is_compute_bound_and_no_line_is_logged_unless_asked(sample_root, caplog):
    loader = sleeping_loader(sample_root, 0.0)
    with caplog.at_level(logging.INFO, logger="dali_bridge"):
        for _ in loader:
            time.sleep(0.05)   # the training step
    figures = loader.stats()
    assert figures["busy_s"] > 0.4
    assert figures["data_wait_fraction"] < 0.1
    assert figures["verdict"].startswith("compute-bound: ")
    assert not [r for r in caplog.records if "bound" in r.getMessage()]


def test_stats_add_up_over_epochs_and_a_broken_off_epoch_logs_no_verdict(sample_root, caplog):
    loader = sleeping_loader(sample_root, 0.0, report_starvation=True)
    with caplog.at_level(logging.INFO, logger="dali_bridge"):
        for number, _ in enumerate(loader):
            if number == 2:
                break
        for _ in loader:
            pass
    assert loader.stats()["batches"] == 3 + 10
    assert [r.getMessage().split(": ")[1] for r in caplog.records if "bound" in r.getMessage()] == ["epoch 1"]


def test_the_verdict_is_logged_with_the_last_batch_for_a_consumer_that_never_asks_past_it(sample_root, caplog):
    loader = sleeping_loader(sample_root, 0.0, report_starvation=True)
    with caplog.at_level(logging.INFO, logger="dali_bridge"):
        batches = iter(loader)
        for _ in range(len(loader)):   # as Lightning iterates: len() batches, no final next()
            next(batches)
        lines = [r.getMessage() for r in caplog.records if "bound" in r.getMessage()]
        for _ in batches:
            pass
    assert len(lines) == 1 and "epoch 0: " in lines[0]
    assert len([r for r in caplog.records if "bound" in r.getMessage()]) == 1   # not again at the end


def test_a_real_loader_counts_every_batch_and_image(sample_root):
    overrides = {"source": {"type": "folder", "root": str(sample_root)}, "batch_size": BATCH, "loader.workers": 0,
                 "ops.0.random_resized_crop.size": 16}
    with build_loader(TRAIN, "torchvision", overrides=overrides) as loader:
        labels = [label for _, label in loader]
        figures = loader.stats()
    assert figures["batches"] == len(labels) and figures["images"] == sum(len(x) for x in labels) == 37
    assert figures["wait_s"] > 0 and figures["busy_s"] >= 0
    assert np.isfinite(figures["data_wait_fraction"])


def test_the_torchvision_backend_splits_its_batches_cpu_by_stage(sample_root):
    spec = {"source": {"type": "folder", "root": str(sample_root)}, "batch_size": BATCH, "loader.shuffle": False,
            "loader.workers": 1}
    with build_loader(load_spec(TRAIN, spec), "torchvision") as loader:
        images = sum(len(batch[0]) for batch in loader)
        stages = loader.stats()["stages"]
    assert stages["images"] == images == 37
    per_image = stages["cpu_ms_per_image"]
    assert set(per_image) == set(stages["stages"]) == {"sample_python", "decode", "kernels", "collate",
                                                        "transfer", "finish"}
    assert all(value >= 0 for value in per_image.values())
    assert per_image["decode"] > 0 and per_image["kernels"] > 0  # each sample decoded and resized in the worker
    assert abs(sum(stages["share"].values()) - 1) < 1e-9
