"""The command line's outputs and counts: ``--json``, ``--save`` and ``--plot`` are checked before
the work that fills them, ``run --batches`` below 1 is refused, ``compare --worst`` with ``--save``
is bounded, and ``run`` keeps every finished row when one backend fails for a reason other than a
bad sample."""
from __future__ import annotations

import json
import os

import pytest

from tests.helpers.backends import CPU_BACKENDS
from tests.helpers.paths import VAL
from dali_bridge.cli.main import main
from dali_bridge.cli.options import EXIT_FAILED, EXIT_INVALID
from dali_bridge.tools.compare import MAX_SAVED_WORST


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a loader is built: the command must refuse before any work."""
    def refuse(*args, **kwargs):
        raise AssertionError("a loader was built before the arguments were checked")
    monkeypatch.setattr("dali_bridge.loader.loader.build_loader", refuse)


@pytest.mark.parametrize("batches", ["0", "-1", "-100"])
def test_run_refuses_fewer_than_one_batch(batches, no_work, capsys):
    with pytest.raises(SystemExit) as done:
        main(["run", str(VAL), "--backends", "torchvision", "--batches", batches, "-q"])
    assert done.value.code == EXIT_INVALID
    assert f"--batches must be at least 1, found {batches}" in capsys.readouterr().err


def _unwritable(tmp_path, kind: str) -> str:
    if kind == "missing folder":
        return str(tmp_path / "no" / "such" / "out.json")
    if kind == "a FIFO in its place":  # opened without blocking: refused, not waited on
        os.mkfifo(tmp_path / "fifo")
        return str(tmp_path / "fifo")
    (tmp_path / "a-folder").mkdir()
    return str(tmp_path / "a-folder")


@pytest.mark.parametrize("kind", ["missing folder", "a folder in its place", "a FIFO in its place"])
def test_run_checks_its_json_output_before_running(tmp_path, kind, no_work, capsys):
    target = _unwritable(tmp_path, kind)
    with pytest.raises(SystemExit) as done:
        main(["run", str(VAL), "--backends", "torchvision", "-q", "--json", target])
    assert done.value.code == EXIT_INVALID
    assert f"--json {target}: cannot write it:" in capsys.readouterr().err


def test_a_writable_json_output_checked_early_leaves_no_file_behind_when_the_run_is_refused(tmp_path):
    target = tmp_path / "rows.json"
    code = main(["run", str(tmp_path / "missing.yaml"), "--backends", "torchvision", "-q", "--json", str(target)])
    assert code == EXIT_INVALID and not target.exists()


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_bench_checks_its_outputs_before_measuring(tmp_path, flag, monkeypatch, capsys):
    def refuse(*args, **kwargs):
        raise AssertionError("measured before the arguments were checked")
    monkeypatch.setattr("dali_bridge.bench.runner.run_bench", refuse)
    target = _unwritable(tmp_path, "missing folder")
    with pytest.raises(SystemExit) as done:
        main(["bench", str(VAL), "--backends", "none", "--baselines", "ceiling", "-q", flag, target])
    assert done.value.code == EXIT_INVALID
    assert f"{flag} {target}: cannot write it:" in capsys.readouterr().err


def test_compare_checks_json_and_save_before_comparing(tmp_path, no_work, capsys):
    target = _unwritable(tmp_path, "missing folder")
    with pytest.raises(SystemExit) as done:
        main(["compare", str(VAL), "--backends", "dali-cpu,torchvision", "--json", target])
    assert done.value.code == EXIT_INVALID
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the folder would go")
    with pytest.raises(SystemExit) as done:
        main(["compare", str(VAL), "--backends", "dali-cpu,torchvision", "--save", str(blocker / "pictures")])
    assert done.value.code == EXIT_INVALID
    assert f"--save {blocker / 'pictures'}: {blocker} is not a folder" in capsys.readouterr().err


def test_compare_bounds_the_worst_samples_it_saves(tmp_path, no_work, capsys):
    with pytest.raises(SystemExit) as done:
        main(["compare", str(VAL), "--backends", "dali-cpu,torchvision", "--save", str(tmp_path / "out"),
              "--worst", str(MAX_SAVED_WORST + 1)])
    assert done.value.code == EXIT_INVALID
    assert f"at most {MAX_SAVED_WORST} samples are saved" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_compare_batches_refuses_to_hold_more_worst_pixels_than_the_bound():
    from dali_bridge.tools.compare import compare_batches
    from dali_bridge.ops.finish import Finish

    with pytest.raises(ValueError, match=f"at most {MAX_SAVED_WORST} worst samples"):
        compare_batches([], [], ["image", "index"], Finish(), [], keep_worst=MAX_SAVED_WORST + 1, save_dir="x")


@pytest.mark.skipif(len(CPU_BACKENDS) < 2, reason="needs two CPU backends (dali-cpu is not installed here)")
def test_run_keeps_the_finished_rows_when_a_backend_fails_and_reports_the_failure_row(
        tmp_path, sample_root, monkeypatch, capsys):
    import dali_bridge.loader.loader

    real = dali_bridge.loader.loader.build_loader

    def flaky(spec, backend, *args, **kwargs):
        if backend == CPU_BACKENDS[0]:
            raise RuntimeError("the backend fell over")
        return real(spec, backend, *args, **kwargs)

    monkeypatch.setattr(dali_bridge.loader.loader, "build_loader", flaky)
    out = tmp_path / "rows.json"
    code = main(["run", str(VAL), "--data", str(sample_root), "--backends", ",".join(CPU_BACKENDS), "--batches", "1",
                 "-q", "--set", "batch_size=4", "--set", "loader.workers=0", "--json", str(out)])
    assert code == EXIT_FAILED
    rows = json.loads(out.read_text())
    assert rows[0] == {"pipeline": "imagenet-val", "backend": CPU_BACKENDS[0], "error": "the backend fell over"}
    assert rows[1]["backend"] == CPU_BACKENDS[1] and rows[1]["batches"] == 1 and "error" not in rows[1]
    captured = capsys.readouterr()
    assert f"on backend {CPU_BACKENDS[0]} failed: RuntimeError: the backend fell over" in captured.err
    assert "1 of 2 run(s) failed" in captured.err and "bad sample" not in captured.err
    assert sum(CPU_BACKENDS[1] in line for line in captured.out.splitlines()) == 1
