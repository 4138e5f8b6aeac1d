"""A new user's first hour: each rough edge they hit answers with what is wrong and what to do."""
from __future__ import annotations

import json
import shlex
import subprocess
import sys

import numpy as np
import pytest
import yaml

from tests.helpers.backends import CPU_BACKENDS, backend_params
from tests.helpers.paths import REPO, TRAIN, VAL
from dali_bridge.backends import base
from dali_bridge.cli.main import main
from dali_bridge.spec.model import SourceSpec
from dali_bridge.spec.pipeline import load_spec, spec_from_dict
from dali_bridge.spec.problems import SpecError


# ---- workers: auto is this rank's share of the node's cores

@pytest.fixture
def cores_96(monkeypatch):
    monkeypatch.setattr(base.os, "sched_getaffinity", lambda pid: set(range(96)), raising=False)


def test_auto_workers_split_the_cores_among_the_ranks_of_a_node(monkeypatch, cores_96):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    share = base.worker_share()
    assert (share.workers, share.cores, share.local_world_size) == (12, 96, 8)
    assert base.default_workers() == 12
    assert share.explain() == "12 = 96 cores ÷ 8 processes on this node (LOCAL_WORLD_SIZE)"


def test_auto_workers_take_every_core_outside_torchrun(monkeypatch, cores_96):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert base.default_workers() == 96
    assert "(LOCAL_WORLD_SIZE unset)" in base.worker_share().reason()


def test_auto_workers_are_at_least_one_and_a_bad_local_world_size_is_named(monkeypatch):
    monkeypatch.setattr(base.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert base.worker_share().workers == 1
    assert base.worker_share().reason().endswith(", at least 1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "eight")
    share = base.worker_share()
    assert share.workers == 2 and "LOCAL_WORLD_SIZE='eight' is not a positive integer, read as 1" in share.reason()


@pytest.mark.parametrize("backend", backend_params(["torchvision", "dali-cpu"]))
def test_loaders_built_under_torchrun_start_the_rank_share_of_workers(monkeypatch, cores_96, sample_root, backend):
    from dali_bridge.loader.loader import build_loader

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    overrides = {"source.root": str(sample_root), "batch_size": 4}
    with build_loader(VAL, backend, overrides=overrides, rank=0, world_size=1) as loader:
        executor = loader._executor
        assert (executor.workers if backend == "torchvision" else executor.threads) == 12


def test_show_and_doctor_state_the_auto_figure_and_why(monkeypatch, capsys, cores_96):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert main(["show", str(TRAIN)]) == 0
    out = capsys.readouterr().out
    assert "workers: null" not in out and "workers: auto," in out
    assert "# loader.workers: auto (24): 96 cores ÷ 4 processes on this node (LOCAL_WORLD_SIZE)" in out
    # what show prints as the resolved pipeline still loads back to the same spec
    resolved = yaml.safe_load(out.split("\n", 1)[1].split("# output per batch")[0])
    assert spec_from_dict(resolved) == load_spec(TRAIN)
    assert main(["doctor", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["cpu_cores_available"] == 96
    assert info["workers_auto"] == "24 = 96 cores ÷ 4 processes on this node (LOCAL_WORLD_SIZE)"


# ---- an epoch with no batches is refused when the loader is built

def test_a_batch_larger_than_the_rank_share_with_drop_is_refused_with_the_numbers(sample_root):
    from dali_bridge.loader.loader import build_loader

    overrides = {"source.root": str(sample_root), "batch_size": 16, "loader.last_batch": "drop"}
    with pytest.raises(SpecError) as caught:
        build_loader(VAL, "torchvision", overrides=overrides, rank=1, world_size=4)
    message = str(caught.value)
    assert "no batches on rank 1 of world size 4: 37 samples ÷ world size 4 = 9 samples per rank" in message
    assert "fewer than batch_size 16" in message and "loader.last_batch: drop" in message
    assert "set batch_size to at most 9 (--set batch_size=9), or loader.last_batch: partial or pad" in message
    # the same job with one rank has 37 // 16 = 2 full batches
    with build_loader(VAL, "torchvision", overrides=overrides, rank=0, world_size=1) as loader:
        assert len(loader) == 2


def test_a_rank_without_samples_is_refused_and_pad_is_suggested(sample_root):
    from dali_bridge.loader.loader import build_loader

    overrides = {"source.root": str(sample_root), "batch_size": 4}
    with pytest.raises(SpecError, match="37 samples dealt over world size 40 give this rank 0 samples.*"
                                        "loader.last_batch: pad"):
        build_loader(VAL, "torchvision", overrides=overrides, rank=38, world_size=40)
    with build_loader(VAL, "torchvision", overrides={**overrides, "loader.last_batch": "pad"},
                      rank=38, world_size=40) as loader:
        assert len(loader) == 1


def test_run_refuses_a_zero_batch_epoch_with_exit_2(capsys, sample_root):
    code = main(["run", str(VAL), "--data", str(sample_root), "--backends", "torchvision", "-q",
                 "--set", "batch_size=64", "--set", "loader.last_batch=drop"])
    assert code == 2
    assert "37 samples ÷ world size 1 = 37 samples per rank, fewer than batch_size 64" in capsys.readouterr().err


# ---- a CUDA device on a host without one


@pytest.mark.parametrize("backend", backend_params(["torchvision", "dali-cpu"]))
def test_device_cuda_without_cuda_says_what_is_wrong_when_the_loader_is_built(sample_root, no_cuda, backend):
    from dali_bridge.loader.select import BackendUnavailable
    from dali_bridge.loader.loader import build_loader

    with pytest.raises(BackendUnavailable, match="device 'cuda' cannot be used here: CUDA disabled by "
                                                 "DALI_BRIDGE_DISABLE; leave device unset"):
        build_loader(VAL, backend, overrides={"source.root": str(sample_root)}, device="cuda")


def test_device_that_is_not_a_torch_device_is_named(sample_root):
    from dali_bridge.loader.loader import build_loader

    with pytest.raises(ValueError, match="device 'gpu' is not a torch device \\(expected e.g. 'cuda'"):
        build_loader(VAL, "torchvision", overrides={"source.root": str(sample_root)}, device="gpu")


# ---- DataLoader keywords point to overrides; Python overrides are not worded as --set flags

def test_dataloader_keywords_name_the_pipeline_key_to_override():
    from dali_bridge.loader.loader import build_loader

    with pytest.raises(TypeError) as caught:
        build_loader(VAL, "torchvision", num_workers=4, batch_size=32, shuffle=False, drop_last=True)
    message = str(caught.value)
    assert "'num_workers': a pipeline setting; pass overrides={\"loader.workers\": 4}" in message
    assert "'shuffle': a pipeline setting; pass overrides={\"loader.shuffle\": False}" in message
    assert "'drop_last': a pipeline setting; pass overrides={\"loader.last_batch\": \"drop\"}" in message
    assert ('together: overrides={"loader.workers": 4, "batch_size": 32, "loader.shuffle": False, '
            '"loader.last_batch": "drop"}') in message


def test_dataloader_keywords_without_a_pipeline_key_say_why_and_typos_get_a_did_you_mean():
    from dali_bridge.loader.loader import build_loader

    with pytest.raises(TypeError) as caught:
        build_loader(VAL, pin_memory=True, sampler=None, rnak=1)
    message = str(caught.value)
    assert "'pin_memory': nothing to set: batches land on the loader's device already" in message
    assert "'sampler': nothing to set: the loader owns the order" in message
    assert "'rnak': not a keyword of build_loader" in message and "did you mean 'rank'?" in message


def test_python_overrides_are_named_as_overrides_and_set_flags_as_flags(capsys):
    from dali_bridge.loader.loader import build_loader

    with pytest.raises(SpecError) as caught:
        build_loader(VAL, overrides={"batch_size": 0})
    (problem,) = caught.value.problems
    assert problem.where == 'overrides["batch_size"]=0' and "--set" not in str(caught.value)
    with pytest.raises(SpecError) as caught:
        load_spec(VAL, ["batch_size=0"])
    assert caught.value.problems[0].where == "--set batch_size=0"
    assert main(["validate", str(VAL), "--set", "batch_size=0"]) == 2
    assert "--set batch_size=0: batch_size: expected an integer >= 1" in capsys.readouterr().err


# ---- run: a bad sample stops one run, not the others

def test_run_reports_a_bad_sample_and_carries_on_with_the_other_runs(capsys, tmp_path, sample_root,
                                                                      write_pipeline):
    from tests.helpers.hostile import break_file, write_image_folder

    files = write_image_folder(tmp_path / "broken", classes=2, per_class=6)
    break_file(files[0], "zero_bytes")
    bad = write_pipeline(VAL, name="broken-set", source={"type": "folder", "root": str(tmp_path / "broken")})
    good = write_pipeline(VAL, name="good-set", source={"type": "folder", "root": str(sample_root)})
    out = tmp_path / "rows.json"
    code = main(["run", str(bad), str(good), "--backends", ",".join(CPU_BACKENDS), "--batches", "2", "-q",
                 "--set", "batch_size=4", "--set", "loader.workers=0", "--set", "loader.shuffle=false",
                 "--json", str(out)])
    assert code == 1
    captured = capsys.readouterr()
    for backend in CPU_BACKENDS:
        assert f"{bad} (broken-set) on backend {backend} stopped at a bad sample: sample 0 (" in captured.err
    hint = "to leave bad samples out and count them: --set loader.on_error=skip"
    assert captured.err.count(hint) == len(CPU_BACKENDS)
    assert f"{len(CPU_BACKENDS)} of {2 * len(CPU_BACKENDS)} run(s) stopped at a bad sample" in captured.err
    rows = json.loads(out.read_text())
    assert [(r["pipeline"], r["backend"], "error" in r) for r in rows] == \
        [("broken-set", b, True) for b in CPU_BACKENDS] + [("good-set", b, False) for b in CPU_BACKENDS]
    assert all(r["batches"] == 2 for r in rows if "error" not in r)
    table = captured.out.splitlines()
    assert table[0].split()[-1] == "error" and sum("good-set" in line for line in table) == len(CPU_BACKENDS)


# ---- the command line's small edges

def _cli(*args: str, stdout_to: str = "") -> subprocess.CompletedProcess:
    """``python -m dali_bridge ARGS [| stdout_to]`` from the repository root, as a user's shell runs it."""
    command = " ".join(shlex.quote(a) for a in (sys.executable, "-m", "dali_bridge", *args))
    return subprocess.run(command + (f" | {stdout_to}" if stdout_to else ""), shell=True, cwd=REPO,
                          capture_output=True, text=True, timeout=120, executable="/bin/bash")


@pytest.mark.slow
def test_show_into_a_reader_that_stops_early_leaves_no_traceback():
    done = _cli("show", str(TRAIN), stdout_to="head -1")
    assert done.stdout == f"# resolved pipeline: {TRAIN}\n"
    assert done.stderr == ""
    # a reader gone before the first write (`true` reads nothing): the write itself fails
    done = _cli("show", str(TRAIN), stdout_to="true; sleep 1")
    assert "BrokenPipeError" not in done.stderr and done.stderr == ""


@pytest.mark.slow
def test_version_flag_and_python_dash_m():
    from dali_bridge import __version__

    done = _cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"dali-bridge {__version__}"
    done = _cli("validate", str(VAL), "--no-source-check")
    assert done.returncode == 0 and done.stdout.startswith(f"{VAL}: ok (imagenet-val: 3 ops")


def test_a_misspelt_backend_exits_2_with_a_did_you_mean(capsys):
    with pytest.raises(SystemExit) as done:
        main(["run", str(VAL), "--backends", "dali-cpu,torchvison"])
    assert done.value.code == 2
    assert "unknown backend(s) torchvison" in str(done.value)
    assert "did you mean 'torchvision' for 'torchvison'?" in capsys.readouterr().err


def test_counts_of_one_are_singular(capsys, tmp_path):
    from dali_bridge.data.sources.local import list_source
    from dali_bridge.util.wording import plural

    assert (plural(1, "class"), plural(2, "class"), plural(0, "sample"), plural(1, "batch")) == \
        ("1 class", "2 classes", "0 samples", "1 batch")
    assert main(["sample-data", str(tmp_path / "one"), "--images", "1", "--classes", "1", "-q"]) == 0
    assert "1 image in 1 class (seed 0" in capsys.readouterr().out
    listing = list_source(SourceSpec(type="folder", root=str(tmp_path / "one")))
    assert listing.describe().startswith("1 sample in 1 class under ")


def test_validate_no_source_check_keeps_a_missing_source_root_a_warning_with_a_did_you_mean(capsys, tmp_path,
                                                                                           write_pipeline):
    (tmp_path / "images" / "train").mkdir(parents=True)
    path = write_pipeline(VAL, source={"type": "folder", "root": str(tmp_path / "imagse" / "train")})
    assert main(["validate", str(path), "--no-source-check"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(f"{path}: ok")
    line = next(n for n, text in enumerate(path.read_text().splitlines(), start=1) if "root:" in text)
    assert f"warning: {path}:{line}:" in captured.err
    assert (f"source.root: folder {tmp_path / 'imagse'} does not exist (so neither does "
            f"{tmp_path / 'imagse' / 'train'}); did you mean {tmp_path / 'images'}?") in captured.err
    assert main(["validate", str(path), "--no-source-check",
                 "--set", f"source.root={tmp_path / 'images' / 'train'}"]) == 0
    assert "warning" not in capsys.readouterr().err


# ---- doctor: do torch's and DALI's CUDA builds pair?

# The default install: torch 2.14.1+cu130 with nvidia-dali-cuda120.
DEFAULT_PAIR = {"torch_cuda": "13.0", "dali_builds": ["nvidia-dali-cuda120"]}


def test_doctor_says_a_cuda_13_torch_with_a_cuda_12_dali_changes_nothing_without_a_gpu_and_what_a_gpu_needs():
    from dali_bridge.tools.doctor import cuda_builds_pairing

    text = cuda_builds_pairing(**DEFAULT_PAIR)
    assert text.startswith("fine on this host: torch is built for CUDA 13.0 and DALI for CUDA 12 "
                           "(nvidia-dali-cuda120), and without an NVIDIA driver here dali-cpu and torchvision use "
                           "neither; on a GPU host each process loads both CUDA runtimes side by side and each needs "
                           "the driver: CUDA 13 (torch) a driver >= 580, CUDA 12 (DALI) >= 525, so a driver >= 580 "
                           "runs both")
    assert text.endswith("to load one runtime: pip uninstall -y nvidia-dali-cuda120 && pip install nvidia-dali-cuda130")
    assert "mismatch" not in text and not text.startswith("no")
    assert cuda_builds_pairing(torch_cuda="12.8", dali_builds=["nvidia-dali-cuda120"]) == \
        "yes: torch and DALI (nvidia-dali-cuda120) are both CUDA 12 builds"


@pytest.mark.parametrize("driver, verdict", [
    ({"driver_cuda": "13000", "driver_release": "580.65.06"},
     "works here: torch is built for CUDA 13.0 and DALI for CUDA 12 (nvidia-dali-cuda120); this driver (580.65.06, "
     "CUDA 13.0) runs both (>= 580), each process loading both CUDA runtimes side by side; to load one: "
     "pip uninstall -y nvidia-dali-cuda120 && pip install nvidia-dali-cuda130"),
    ({"driver_cuda": "12040"},
     "breaks here: torch is built for CUDA 13.0 and DALI for CUDA 12 (nvidia-dali-cuda120); this driver (CUDA 12.4) "
     "is older than CUDA 13 needs (>= 580): DALI runs but torch cannot use the GPU, so the dali backend cannot run; "
     "update the driver to >= 580 and pip uninstall -y nvidia-dali-cuda120 && pip install nvidia-dali-cuda130, or "
     "keep this driver and install torch built for CUDA 12 (its cu12x wheels: https://pytorch.org/get-started/locally/)"),
    ({"driver_release": "550.54.15"}, "breaks here: torch is built for CUDA 13.0 and DALI for CUDA 12 "
                                      "(nvidia-dali-cuda120); this driver (550.54.15) is older than CUDA 13 needs"),
    ({"driver_release": "470.82.01"}, "breaks here: torch is built for CUDA 13.0 and DALI for CUDA 12 "
                                      "(nvidia-dali-cuda120); this driver (470.82.01) runs neither (CUDA 13 needs "
                                      ">= 580, CUDA 12 >= 525): update the driver to >= 580"),
])
def test_doctor_says_whether_this_hosts_driver_runs_the_cuda_13_torch_and_cuda_12_dali_pair(driver, verdict):
    from dali_bridge.tools.doctor import cuda_builds_pairing

    assert cuda_builds_pairing(**DEFAULT_PAIR, **driver).startswith(verdict)


def test_doctor_reads_the_driver_release_apart_from_torch(tmp_path):
    from dali_bridge.tools.doctor import driver_release_version

    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
                       "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    assert driver_release_version(version) == "550.54.15"
    assert driver_release_version(tmp_path / "absent") is None


def test_doctor_pairing_covers_a_cpu_torch_no_dali_two_dalis_and_an_old_driver():
    from dali_bridge.tools.doctor import cuda_builds_pairing

    assert cuda_builds_pairing(torch_cuda=None, dali_builds=["nvidia-dali-cuda120"]).startswith(
        "torch is a CPU build: dali-cpu and torchvision run")
    assert cuda_builds_pairing(torch_cuda="12.6", dali_builds=[]) == \
        "no DALI installed (the dali and dali-cpu backends need it): pip install 'dali-bridge[cuda12]'"
    both = cuda_builds_pairing(torch_cuda="13.0", dali_builds=["nvidia-dali-cuda120", "nvidia-dali-cuda130"])
    assert both.endswith("pip uninstall -y nvidia-dali-cuda120 nvidia-dali-cuda130 && pip install nvidia-dali-cuda130")
    old_driver = cuda_builds_pairing(torch_cuda="13.0", dali_builds=["nvidia-dali-cuda130"], driver_cuda="12040")
    assert old_driver.startswith("yes: torch and DALI (nvidia-dali-cuda130) are both CUDA 13 builds")
    assert old_driver.endswith("this driver (CUDA 12.4) is too old for a CUDA 13 build: update the driver (>= 580) "
                               "or use builds for CUDA 12")


def test_doctor_report_carries_the_pairing_of_the_installed_builds(capsys):
    import torch

    from dali_bridge.tools.doctor import installed_dali_builds, cuda_builds_pairing

    assert main(["doctor", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["cuda_builds"] == cuda_builds_pairing(torch_cuda=torch.version.cuda,
                                                      dali_builds=installed_dali_builds(),
                                                      driver_cuda=info.get("cuda_driver"),
                                                      driver_release=info.get("nvidia_driver"))


# ---- compare: a header that says the mode, a mean map scaled to the bound

def test_compare_under_fast_parity_says_the_exact_bounds_are_exceeded_at_the_border_not_only_by_rounding(
        capsys, sample_root):
    from dali_bridge.tools.compare_bounds import CPU_BOUNDS, default_bounds

    fast = load_spec(TRAIN, {"parity": "fast"})
    assert default_bounds(load_spec(TRAIN), ["dali-cpu", "torchvision"]) is CPU_BOUNDS
    reason = default_bounds(fast, ["dali-cpu", "torchvision"]).reason
    assert reason.startswith("parity: fast: the DALI backends resize with DALI's own border handling")
    assert "only in rounding" not in reason
    nearest = load_spec(TRAIN, {"parity": "fast", "ops.0.random_resized_crop.interpolation": "nearest"})
    assert default_bounds(nearest, ["dali-cpu", "torchvision"]) is CPU_BOUNDS  # fast changes nothing there
    main(["compare", str(TRAIN), "--data", str(sample_root), "--backends", "dali-cpu,torchvision", "--batches", "1",
          "--set", "batch_size=6", "--set", "loader.workers=1", "--set", "parity=fast"])
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("bounds:"))
    assert "parity: fast" in header and "only in rounding" not in header


def _mean_delta_panel(tmp_path, delta: np.ndarray) -> np.ndarray:
    """The map (H W RGB, shown at twice the size) of the mean_delta.png compare saves for four samples
    differing by ``delta`` (C H W levels)."""
    import torch
    from PIL import Image

    from dali_bridge.tools.compare import compare_batches
    from dali_bridge.ops.finish import Finish

    a = torch.full((4, 3, *delta.shape[1:]), 100, dtype=torch.uint8)
    b = a + torch.from_numpy(delta.astype(np.uint8))
    indices = torch.arange(4)
    compare_batches([(a, indices % 2, indices)], [(b, indices % 2, indices)], ["image", "label", "index"],
                    Finish(), [f"/d/{i}.jpg" for i in range(4)], save_dir=tmp_path, worst_to_save=0)
    with Image.open(tmp_path / "mean_delta.png") as picture:
        header = 34  # the title and caption lines above the map
        return np.asarray(picture.convert("RGB"))[header: header + 2 * delta.shape[1], : 2 * delta.shape[2]].astype(int)


def test_compare_mean_delta_map_shows_rounding_within_the_bound_as_grey_and_beyond_it_in_colour(tmp_path):
    rounding = (np.random.default_rng(0).random((3, 40, 40)) < 0.3).astype(np.int64)  # 0 or 1 level
    panel = _mean_delta_panel(tmp_path / "rounding", rounding)
    grey = (panel[..., 0] == panel[..., 1]) & (panel[..., 1] == panel[..., 2]) & (panel[..., 0] <= 96)
    assert grey.all(), "differences within the bound (ordinary rounding) are shades of grey, not a red field"
    assert panel.max() > 0
    border = rounding.copy()
    border[:, 0, :] = 6  # a top row 6 levels off, as a plain resize's border
    panel = _mean_delta_panel(tmp_path / "border", border)
    top, rest = panel[:2], panel[2:]
    assert ((top[..., 0] > 200) & (top[..., 2] < top[..., 0] - 50)).all(), "beyond the bound: warm colours"
    assert ((rest[..., 0] == rest[..., 2]) & (rest[..., 0] <= 96)).all()
