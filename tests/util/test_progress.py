"""Progress of long work: a bar on a terminal, plain periodic lines in a log, nothing when quiet."""
from __future__ import annotations

import io

import pytest
from tests.helpers.backends import needs_cpu_backends

from dali_bridge.util.progress import Progress, progress


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_plain_line_every_few_seconds_with_rate_and_time_left():
    clock, log = FakeClock(), io.StringIO()
    bar = Progress(total=100, unit="batch", description="train [torchvision]", stream=log, interval_s=5.0,
                   clock=clock)
    for _ in range(10):
        clock.now += 1.0
        bar.update(4)
    bar.close()
    lines = log.getvalue().splitlines()
    assert lines == ["train [torchvision]: 20/100 batches (20 %), 4.0 batch/s, 5 s, ~20 s left",
                     "train [torchvision]: 40/100 batches (40 %), 4.0 batch/s, 10 s, ~15 s left",
                     "train [torchvision]: 40/100 batches (40 %), 4.0 batch/s, 10 s, ~15 s left"]


def test_work_without_a_known_total_still_says_how_far_and_how_fast():
    clock, log = FakeClock(), io.StringIO()
    with Progress(total=None, unit="image", description="convert", stream=log, clock=clock) as bar:
        clock.now += 2.0
        bar.update(10)
    assert log.getvalue() == "convert: 10 images, 5.0 image/s, 2 s\n"


def test_a_terminal_gets_a_tqdm_bar_and_quiet_gets_nothing():
    from tqdm import tqdm

    terminal = Terminal()
    bar = progress(total=3, unit="batch", description="x", stream=terminal)
    assert isinstance(bar, tqdm)
    bar.close()
    quiet = io.StringIO()
    with progress(total=3, unit="batch", description="x", enabled=False, stream=quiet) as silent:
        silent.update(3)
    assert quiet.getvalue() == "" and silent.n == 3
    assert isinstance(progress(total=3, unit="batch", description="x", stream=io.StringIO()), Progress)


@pytest.mark.slow
def test_run_prints_progress_lines_into_a_log(sample_root, write_pipeline, capfd):
    from dali_bridge.cli.main import main

    pipeline = write_pipeline(source={"type": "folder", "root": str(sample_root)}, batch_size=8)
    assert main(["run", str(pipeline), "--backends", "torchvision", "--set", "loader.workers=0"]) == 0
    err = capfd.readouterr().err
    assert "[torchvision]: 5/5 batches (100 %)" in err


@pytest.mark.parametrize("images", [10_000_001, 10**9])
def test_sample_data_refuses_a_count_no_run_could_use_before_writing_anything(tmp_path, images):
    from dali_bridge.data.sources.synthetic import SampleDataError, generate_sample_data

    with pytest.raises(SampleDataError, match=r"at most 10,000,000"):
        generate_sample_data(tmp_path / "set", images=images, classes=10)
    assert not (tmp_path / "set").exists()


def test_sample_data_refuses_a_set_the_disk_cannot_hold(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from dali_bridge.data.sources.synthetic import SampleDataError, generate_sample_data

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 10**6, 10**6))
    with pytest.raises(SampleDataError, match=r"1,000 images need about 40 MiB; .* 1 MiB free"):
        generate_sample_data(tmp_path / "set", images=1000, classes=10)
    assert not list((tmp_path / "set").rglob("*.jpg"))


@needs_cpu_backends
def test_compare_prints_progress_lines_into_a_log(sample_root, write_pipeline, capfd):
    from dali_bridge.cli.main import main

    pipeline = write_pipeline(source={"type": "folder", "root": str(sample_root)}, batch_size=8)
    assert main(["compare", str(pipeline), "--batches", "2", "--set", "loader.workers=0"]) == 0
    assert "(dali-cpu vs torchvision): 2/2 batches (100 %)" in capfd.readouterr().err
    assert main(["compare", str(pipeline), "--batches", "2", "--set", "loader.workers=0", "--quiet"]) == 0
    assert "batches (100 %)" not in capfd.readouterr().err


def test_convert_prints_progress_lines_into_a_log(sample_root, tmp_path, capfd):
    from dali_bridge.cli.main import main

    assert main(["convert", str(sample_root), str(tmp_path / "s-%06d.tar"), "--shard-size", "20"]) == 0
    assert "convert: 37/37 images (100 %)" in capfd.readouterr().err


def test_verify_prints_progress_lines_into_a_log(sample_root, tmp_path, capfd):
    from dali_bridge.cli.main import main

    assert main(["convert", str(sample_root), str(tmp_path / "s-%06d.tar"), "--shard-size", "20", "-q"]) == 0
    capfd.readouterr()
    assert main(["verify", str(tmp_path / "s-%06d.tar")]) == 0
    assert "s.manifest.json: 2/2 shards (100 %)" in capfd.readouterr().err
    assert main(["verify", str(tmp_path / "s-%06d.tar"), "--quiet"]) == 0
    assert "shards (100 %)" not in capfd.readouterr().err
