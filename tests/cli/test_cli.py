"""The command line: each command through ``dali_bridge.cli.main.main``, plus one run of the installed script."""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import TRAIN, VAL
from dali_bridge.loader.select import available_backends
from dali_bridge.cli.main import main
from dali_bridge.cli.options import EXIT_INVALID, EXIT_UNAVAILABLE



def test_validate_accepts_the_shipped_pipelines(capsys):
    # Their data/sample folder exists once ./dev.sh run made it; the files themselves are checked here.
    assert main(["validate", str(TRAIN), str(VAL), "--no-source-check"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"{TRAIN}: ok (imagenet-train: 3 ops, batch 64)", f"{VAL}: ok (imagenet-val: 3 ops, batch 64)"]


def test_validate_reports_every_invalid_file_with_its_position(capsys, write_pipeline):
    bad = write_pipeline(TRAIN, batch_size=0)
    assert main(["validate", str(TRAIN), str(bad), str(bad.parent / "missing.yaml"),
                 "--no-source-check"]) == EXIT_INVALID
    captured = capsys.readouterr()
    assert f"{TRAIN}: ok" in captured.out
    assert f"{bad}:" in captured.err and "batch_size" in captured.err
    assert "missing.yaml: cannot read" in captured.err


def test_validate_applies_set_overrides(capsys):
    assert main(["validate", str(TRAIN), "--set", "batch_size=32", "--no-source-check"]) == 0
    assert "batch 32" in capsys.readouterr().out
    assert main(["validate", str(TRAIN), "--set", "batch_size=-1", "--no-source-check"]) == EXIT_INVALID
    assert "--set batch_size" in capsys.readouterr().err


def test_show_prints_the_resolved_pipeline_and_each_backends_placement(capsys, no_cuda):
    assert main(["show", str(TRAIN)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# resolved pipeline: {TRAIN}\n")
    assert "scale: [0.08, 1.0]" in out and "last_batch: partial" in out
    assert "# output per batch: (64, 3, 224, 224) float32 (CHW)" in out
    assert "# backend 'auto' picks torchvision here: auto: torchvision fallback (CUDA disabled by " in out
    dali_section = out.split("## dali (")[1].split("## dali-cpu")[0]
    assert dali_section.startswith("not available here: CUDA disabled by DALI_BRIDGE_DISABLE)")
    assert "mixed" in dali_section and "fn.decoders.image_slice" in dali_section
    torchvision_section = out.split("## torchvision (")[1]
    assert "F.crop + F.resize" in torchvision_section
    assert "where a run's CPU goes, by stage: loader.stats()['stages']" in torchvision_section


def test_show_reports_a_backend_forced_with_set(capsys):
    assert main(["show", str(VAL), "--set", "backend=torchvision"]) == 0
    assert "# backend 'torchvision' picks torchvision here: backend 'torchvision' requested explicitly" \
        in capsys.readouterr().out


@pytest.mark.slow
def test_run_iterates_each_pipeline_on_each_available_backend(capsys, sample_root, tmp_path):
    out = tmp_path / "rows.json"
    code = main(["run", str(TRAIN), str(VAL), "--data", str(sample_root), "--backends", "available",
                 "--set", "batch_size=6", "--set", "loader.workers=1", "--batches", "2", "-q", "--json", str(out)])
    assert code == 0, capsys.readouterr().err
    rows = json.loads(out.read_text())
    backends = available_backends()
    assert [(r["pipeline"], r["backend"]) for r in rows] == \
        [(p, b) for p in ("imagenet-train", "imagenet-val") for b in backends]
    for row in rows:
        assert (row["batches"], row["images"], row["skipped"]) == (2, 12, 0)
        assert row["shape"] == [6, 3, 224, 224] and row["dtype"] == "float32"
        assert row["images_per_second"] > 0
    table = capsys.readouterr().out
    assert "images/s" in table and table.count("imagenet-val") == len(backends)


def test_run_one_full_epoch_counts_every_sample(capsys, sample_root, tmp_path):
    out = tmp_path / "rows.json"
    assert main(["run", str(VAL), "--data", str(sample_root), "--backends", "auto", "--set", "batch_size=16",
                 "--set", "loader.workers=0", "-q", "--json", str(out)]) == 0
    (row,) = json.loads(out.read_text())
    assert (row["batches"], row["images"]) == (3, 37)


def test_run_with_an_unavailable_backend_exits_3_with_the_reason(capsys, sample_root, no_cuda):
    assert main(["run", str(TRAIN), "--data", str(sample_root), "--backends", "dali", "-q"]) == EXIT_UNAVAILABLE
    assert "backend 'dali' cannot run here: CUDA disabled by DALI_BRIDGE_DISABLE" in capsys.readouterr().err


def test_run_refuses_an_unknown_backend_name():
    with pytest.raises(SystemExit, match="unknown backend\\(s\\) tpu"):
        main(["run", str(TRAIN), "--backends", "tpu"])


def test_run_on_a_missing_folder_exits_2_naming_it(capsys, tmp_path):
    missing = tmp_path / "nothing-here"
    assert main(["run", str(TRAIN), "--data", str(missing), "--backends", "auto", "-q"]) == EXIT_INVALID
    assert f"folder {missing} does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_sample_data_writes_a_set_and_if_absent_keeps_it(capsys, tmp_path):
    target = tmp_path / "set"
    assert main(["sample-data", str(target), "--images", "6", "--classes", "2", "--seed", "3", "-q"]) == 0
    assert "6 images in 2 classes (seed 3" in capsys.readouterr().out
    files = sorted(p for p in target.rglob("*.jpg"))
    assert len(files) == 6 and len({p.parent.name for p in files}) == 2
    stamps = [p.stat().st_mtime_ns for p in files]
    assert main(["sample-data", str(target), "--images", "6", "--classes", "2", "--seed", "3", "--if-absent"]) == 0
    assert [p.stat().st_mtime_ns for p in files] == stamps


@pytest.mark.slow
def test_doctor_json_is_machine_readable(capsys):
    assert main(["doctor", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["python"] == sys.version.split()[0]
    assert info["auto_picks"].split(" — ")[0] in ("dali", "torchvision")


def _console_script() -> str | None:
    beside = Path(sys.executable).parent / "dali-bridge"
    return str(beside) if beside.exists() else shutil.which("dali-bridge")


@pytest.mark.skipif(_console_script() is None,
                    reason="the dali-bridge console script is not installed (a PYTHONPATH-only checkout)")
@pytest.mark.slow
def test_console_script_runs_validate_and_show():
    script = _console_script()
    done = subprocess.run([script, "validate", str(TRAIN), "--no-source-check"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{TRAIN}: ok (imagenet-train: 3 ops, batch 64)"
    done = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and all(cmd in done.stdout for cmd in ("validate", "show", "run", "doctor"))
    done = subprocess.run([script, "validate"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "FILE" in done.stderr


def test_each_command_module_holds_its_parser_beside_its_handler():
    # build_parser asks each module of cli.main.COMMANDS to add its commands; each handler it names is its own.
    from dali_bridge.cli.main import COMMANDS, build_parser

    for module in COMMANDS:
        added = []
        module.add_parser(lambda name, func, *args, **kwargs: added.append((name, func)) or argparse.ArgumentParser())
        assert added and all(func.__module__ == module.__name__ for _, func in added), (module.__name__, added)
    names = set(build_parser()._subparsers._group_actions[0].choices)
    assert names == {"validate", "show", "run", "pipelines", "init", "sample-data", "convert", "verify", "doctor",
                     "bench", "compare", "from-torchvision", "from-timm"}


def test_run_of_a_pipeline_whose_own_folder_is_missing_says_how_to_give_images(capsys, tmp_path):
    copied = tmp_path / "pipelines" / "train.yaml"   # a shipped file away from its sample images
    copied.parent.mkdir()
    copied.write_text(TRAIN.read_text())
    assert main(["run", str(copied), "--backends", "torchvision", "-q"]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert f"folder {tmp_path / 'data' / 'sample'} does not exist" in err
    assert "--data DIR" in err and f"dali-bridge sample-data {tmp_path / 'data' / 'sample'}" in err
