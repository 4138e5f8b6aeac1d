"""The GPU path checked in one run: the checks ``benchmarks/device_check.sh`` runs, each in its own
process with a time limit inside one budget; every finding goes to one JSON file.

    python benchmarks/device_check.py --out DIR [--work DIR] [--budget S] [--images N] [--dry-run]

Checks, in the order they run (the ones that prove most first), with the seconds each is expected
to take on one H100 with 16 cores and 256 generated images (estimates from the dry run's times on a
2-core host: no GPU has run them yet; what the budget check uses; the limit is about twice that,
cut to what the budget has left):
  env          15 s  the host: Python, torch and torchvision (the run stops below the minimum pair,
                     MINIMUM_VERSIONS), CUDA devices, driver, DALI build, ``doctor``
  data         10 s  a generated ImageFolder set (``--images``) shared by the checks
  device       25 s  ``device="cpu"`` batches equal a blocking copy of the GPU ones; LOCAL_RANK
                     beyond the device count; an explicit ``cuda:N``
  equivalence  50 s  shipped train/val pipelines on ``dali`` (mixed decode; decode.device cpu; mixed
                     with the hardware decoder off) against ``dali-cpu``, consumer's stream kept
                     busy: max and mean level difference per variant, within the bounds of
                     ``dali_bridge.tools.compare_bounds.DECODE_BOUNDS``
  errors       30 s  ``on_error: raise`` yields the batches before a broken file, ``skip`` counts
                     it and ends a batch whose every sample is broken, on ``dali`` and on
                     torchvision finishing on CUDA (worker processes, and ``loader.executor: threads``)
  sync         25 s  batches of each shipped pipeline on ``dali`` under ``torch.cuda.set_sync_debug_mode``,
                     "warn" (every sync listed where it happened) then "error": no host sync in the
                     bridge's code but a host tail's copy of its batch (``copy_batch_to_host``)
  pytest       90 s  tests/backends/dali/test_gpu.py (threads on CUDA included), tests/backends/dali/test_gpu_logic.py,
                     the batch kernels against the per-sample ones on CUDA and the rounding probe there
                     (PYTEST_SELECTIONS; each must select a test; JUnit XML: pytest.xml; -rfEs)
  memory_bench 80 s  GPU and pinned host memory after each backend's first batch, then a short
                     ``dali-bridge bench`` (bench.json) and DALI's threads at 4, 8 and the machine's
                     cores (bench_threads.json)
                  --- 325 s expected in all, inside the default budget of 360 s; with the DALI install
                      before it (INSTALL_EXPECTED_S, 90 s) 415 s, within PLAN_LIMIT_S (420 s), which
                      leaves room for one rerun in 15 device minutes.

A check whose expected seconds no longer fit what is left of the budget is skipped with the
reason, not started; a failed ``env`` version check stops the run. On a host with CUDA devices, a
``dali`` that cannot run fails the checks that need it (the reason said): only a host without CUDA
skips them. A check's process that wrote its result but hangs at interpreter exit is killed after
TEARDOWN_GRACE_S and the hang reported beside the result (``teardown``), which stands.

Files: ``--out`` receives only device_check.json, pytest.xml, bench.json and bench_threads.json
(a machine may bring back few files, none deep); scratch data and each check's own result and
output go under ``--work`` (default: a fresh folder in the system's temporary directory). The
first line printed is the plan (each check's expected seconds and the total); the last lines are
a one-screen summary — each check, its status, seconds against those expected and key figures —
since the printed tail is what survives when nothing else does.

``--dry-run`` runs the same control flow on a CPU host: the GPU parts are reported skipped, and
the checks whose logic does not need a GPU run it with CPU stand-ins (``dali-cpu`` for ``dali``,
a CPU target for CUDA) on a few images, so the script is exercised while no GPU is around.
Exit status: 0 when every check that ran passed, 1 otherwise; skips are listed, not failures.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from collections.abc import Callable
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PIPELINES = REPO / "pipelines"
TRAIN, VAL = PIPELINES / "imagenet_train.yaml", PIPELINES / "imagenet_val.yaml"

class Skip(Exception):
    """A check that cannot run here; the message says why."""


class StopRun(AssertionError):
    """A failed check after which the others would test nothing worth the device's time (the reason
    says why); ``results``: what it found all the same."""

    def __init__(self, reason: str, results: dict[str, Any]):
        super().__init__(reason)
        self.results = results


# The oldest torch and torchvision the project runs on (docs/gpu.md): torchvision 0.21 decodes a 16-bit
# PNG to uint16, which the bridge scales to uint8 as DALI does (older releases scale it their own way, so
# pixels differ from DALI's), and decodes WebP (0.20); torch 2.6 is the release that torchvision 0.21
# is built for. A GPU machine brings its own pair: the env check names it and stops the run below these.
MINIMUM_VERSIONS = {"torch": (2, 6), "torchvision": (0, 21)}


def below_minimum(versions: dict[str, str]) -> list[str]:
    """Each package of ``versions`` (name: its ``__version__``) older than :data:`MINIMUM_VERSIONS`, said."""
    import re

    old = []
    for name, minimum in MINIMUM_VERSIONS.items():
        found = re.match(r"(\d+)\.(\d+)", versions[name])
        if found is None or tuple(map(int, found.groups())) < minimum:
            old.append(f"{name} {versions[name]} (the project needs {'.'.join(map(str, minimum))} or newer)")
    return old


# ---------------------------------------------------------------------------------------------
# Helpers shared by the checks (run in the check's own process)


def cuda_devices() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def require_gpu_dali(dry_run: bool) -> None:
    """Return when ``dali`` can run on this host's GPU. A dry run or a host without CUDA skips; a
    host WITH CUDA devices where ``dali`` cannot run fails, with the reason: a skip there would let
    the run pass having tested nothing of DALI."""
    if dry_run:
        raise Skip("dry run: no GPU used")
    devices = cuda_devices()
    if not devices:
        raise Skip("no CUDA device here")
    from dali_bridge.loader.select import unavailable_reason
    reason = unavailable_reason("dali")
    if reason:
        raise AssertionError(f"{devices} CUDA device(s) here, but dali cannot run: {reason}")


def stand_in_backend(dry_run: bool) -> str:
    """``dali`` on a GPU host; ``dali-cpu`` standing in for it in a dry run (skipped if that cannot run)."""
    if not dry_run:
        require_gpu_dali(dry_run)
        return "dali"
    from dali_bridge.loader.select import unavailable_reason
    reason = unavailable_reason("dali-cpu")
    if reason:
        raise Skip(f"dry run: dali-cpu cannot stand in for dali here: {reason}")
    return "dali-cpu"


def overrides(data: Path, pipeline: Path, size: int, **extra: Any) -> dict[str, Any]:
    """The shipped pipeline on the check's data at ``size``, uint8 HWC so levels compare directly."""
    base: dict[str, Any] = {"source": {"type": "folder", "root": str(data)}, "batch_size": 32,
                            "outputs": ["image", "label", "index"], "loader.shuffle": False}
    if pipeline == TRAIN:
        base["ops.0.random_resized_crop.size"] = size
    else:
        base.update({"ops.0.resize.size": size + size // 7, "ops.1.center_crop.size": size})
    base.update(extra)
    return base


def keep_busy(device: Any) -> None:
    """Queue a few large matrix products on the consumer's current stream: DALI's next batches are
    produced while it is busy, as under a training step."""
    import torch
    if getattr(device, "type", "cpu") != "cuda":
        return
    work = torch.randn(2048, 2048, device=device)
    for _ in range(4):
        work = torch.tanh(work @ work)


def level_differences(first, second) -> dict[str, Any]:
    """Mean, max and share of pixels over one level between two loaders' epochs (same order)."""
    import torch
    total = over_one = 0
    worst = 0
    absolute_sum = 0.0
    batches = 0
    for (a_image, _, a_index), (b_image, _, b_index) in zip(first, second, strict=True):
        keep_busy(a_image.device)
        if not torch.equal(a_index.cpu(), b_index.cpu()):
            raise AssertionError(f"batch {batches}: the loaders yielded different samples")
        diff = (a_image.cpu().to(torch.int16) - b_image.cpu().to(torch.int16)).abs()
        total += diff.numel()
        absolute_sum += float(diff.sum(dtype=torch.float64))
        over_one += int((diff > 1).sum())
        worst = max(worst, int(diff.max()) if diff.numel() else 0)
        batches += 1
    if not batches:
        raise AssertionError("no batch compared")
    return {"batches": batches, "pixels": total, "mean_levels": absolute_sum / total, "max_levels": worst,
            "share_over_one_level": over_one / total}


def broken_folder(root: Path, *, images: int = 24,
                  bad: tuple[int, ...] = (9,)) -> tuple[Path, tuple[int, ...]]:
    """A small ImageFolder whose samples ``bad`` are JPEGs cut in their header (every decoder rejects them)."""
    from dali_bridge.data.sources.synthetic import generate_sample_data
    from dali_bridge.data.sources.local import list_source
    from dali_bridge.spec.pipeline import coerce_spec

    if not root.exists():
        generate_sample_data(root, images=images, classes=2, seed=5, workers=1)
    spec = coerce_spec(TRAIN, {"source": {"type": "folder", "root": str(root)}})
    for index in bad:
        path = Path(list_source(spec.source).paths[index])
        path.write_bytes(path.read_bytes()[:20])
    return root, bad


# ---------------------------------------------------------------------------------------------
# The checks: each takes (data folder, work folder, output folder, dry run) and returns its results as data


def check_env(data: Path, work: Path, out: Path, dry_run: bool) -> dict[str, Any]:
    import torch
    import torchvision

    info: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(),
                            "torch": torch.__version__, "torchvision": torchvision.__version__}
    old = below_minimum(info)
    if old:   # before anything else: every later check would run on a pair the project does not support
        raise StopRun(f"this machine's {' and '.join(old)}: install a newer pair, or run on another machine", info)
    info["cuda_devices"] = cuda_devices()
    if info["cuda_devices"]:
        info["gpus"] = [torch.cuda.get_device_name(n) for n in range(info["cuda_devices"])]
    try:
        info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                             "--format=csv,noheader"], capture_output=True, text=True,
                                            timeout=20, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        info["nvidia_smi"] = f"not run: {exc}"
    info["doctor"] = check_env_doctor()
    return info


def check_env_doctor() -> str:
    """What ``dali-bridge doctor`` prints of this host."""
    from dali_bridge.tools.doctor import report

    return report()


def check_data(data: Path, work: Path, out: Path, dry_run: bool, images: int = 256) -> dict[str, Any]:
    from dali_bridge.data.sources.synthetic import generate_sample_data
    if not data.exists():
        generate_sample_data(data, images=images, classes=8, seed=0, workers=min(8, os.cpu_count() or 1))
    files = sorted(p for p in data.rglob("*.jpg"))
    if not files:
        raise AssertionError(f"no .jpg image under {data}")
    return {"root": str(data), "images": len(files)}


EQUIVALENCE_VARIANTS = [  # (name, pipeline, decode device, hardware decoder share or None for the default)
    ("train-mixed", TRAIN, "mixed", None), ("val-mixed", VAL, "mixed", None),
    ("train-cpu-decode", TRAIN, "cpu", None), ("val-cpu-decode", VAL, "cpu", None),
    ("val-mixed-hw-decoder-off", VAL, "mixed", 0.0),
]


def check_equivalence(data: Path, work: Path, out: Path, dry_run: bool) -> dict[str, Any]:
    """(a): ``dali`` against ``dali-cpu``, per variant, within the bounds of its decode.device
    (:func:`equivalence_failures`)."""
    from dali_bridge import build_loader
    from dali_bridge.backends import device as device_module

    gpu_backend = stand_in_backend(dry_run)   # the dry run compares dali-cpu with itself
    size = 64 if dry_run else 160
    variants = EQUIVALENCE_VARIANTS[:1] if dry_run else EQUIVALENCE_VARIANTS
    results: dict[str, Any] = {"compared": f"{gpu_backend} vs dali-cpu", "size": size, "stand_in": dry_run}
    failures = []
    for name, pipeline, decode, hw_load in variants:
        device_module.HW_DECODER_LOAD = 0.65 if hw_load is None else hw_load
        extra = {"ops.2": {"normalize": {"dtype": "uint8", "layout": "HWC"}}}  # the last op of both pipelines
        gpu = build_loader(pipeline, gpu_backend, overrides=overrides(data, pipeline, size, **extra,
                                                                      **{"decode.device": decode}))
        cpu = build_loader(pipeline, "dali-cpu", overrides=overrides(data, pipeline, size, **extra))
        found = level_differences(gpu, cpu)
        gpu.close(), cpu.close()
        found["hw_decoder_load"] = device_module.HW_DECODER_LOAD
        results[name] = found
        failures += equivalence_failures(name, decode, found)
    device_module.HW_DECODER_LOAD = 0.65
    if failures:
        raise AssertionError("; ".join(failures) + f" — {json.dumps(results)}")
    return results


def equivalence_failures(name: str, decode: str, found: dict[str, Any]) -> list[str]:
    """Where variant ``name`` (``decode``: its decode.device) exceeds the bounds of
    ``dali_bridge.tools.compare_bounds.DECODE_BOUNDS`` (the one table: docs/equivalence.md quotes it);
    ``found`` gets the bounds it was judged by."""
    from dali_bridge.tools.compare_bounds import DECODE_BOUNDS, exceeded

    bounds = DECODE_BOUNDS[decode]
    found["bound"] = f"max <= {bounds.max_abs:g}, mean <= {bounds.mean_abs:g} levels"
    return [f"{name}: {problem}" for problem in exceeded(bounds, max_levels=found["max_levels"],
                                                         mean_levels=found["mean_levels"])]


def check_device(data: Path, work: Path, out: Path, dry_run: bool) -> dict[str, Any]:
    """(b): the device contract of the ``dali`` backend on CUDA (needs a GPU: nothing stands in)."""
    require_gpu_dali(dry_run)
    import torch

    from dali_bridge import build_loader
    results: dict[str, Any] = {}
    base = overrides(data, TRAIN, 96)
    on_gpu = [(image, index) for image, _, index in build_loader(TRAIN, "dali", overrides=base)]
    on_cpu = [(image, index) for image, _, index in build_loader(TRAIN, "dali", overrides=base, device="cpu")]
    assert all(image.device.type == "cpu" for image, _ in on_cpu), "device='cpu' yielded CUDA tensors"
    copies_equal = all(torch.equal(g.cpu(), c) and torch.equal(gi.cpu(), ci)
                       for (g, gi), (c, ci) in zip(on_gpu, on_cpu))
    results["cpu_target_equals_blocking_copy"] = copies_equal
    assert copies_equal and len(on_gpu) == len(on_cpu), "device='cpu' batches differ from the GPU ones copied"
    count = cuda_devices()
    os.environ["LOCAL_RANK"] = str(count + 3)
    try:
        loader = build_loader(TRAIN, "dali", overrides=base)
        image, _, _ = next(iter(loader))
        expected = torch.device("cuda", (count + 3) % count)
        results["local_rank_beyond_devices"] = {"local_rank": count + 3, "devices": count,
                                                "device": str(loader.device), "batch_device": str(image.device)}
        assert loader.device == image.device == expected, results["local_rank_beyond_devices"]
        loader.close()
    finally:
        del os.environ["LOCAL_RANK"]
    last = torch.device("cuda", count - 1)
    loader = build_loader(TRAIN, "dali", overrides=base, device=str(last))
    image, _, _ = next(iter(loader))
    results["explicit_device"] = {"device": str(last), "dali_device_id": loader._executor.device_id,
                                  "batch_device": str(image.device)}
    assert loader._executor.device_id == last.index and image.device == last, results["explicit_device"]
    loader.close()
    return results


def check_errors(data: Path, work: Path, out: Path, dry_run: bool) -> dict[str, Any]:
    """(c): raise yields the batches before the broken file then names it; skip counts it — on
    ``dali`` and on torchvision finishing on CUDA (stand-ins in a dry run: dali-cpu, a CPU target)."""
    from dali_bridge import build_loader
    from dali_bridge.loader.select import unavailable_reason
    from dali_bridge.errors import SampleError

    root, (bad,) = broken_folder(work / "broken")
    all_bad, whole_batch = broken_folder(work / "all-bad", bad=(4, 5, 6, 7))   # batch 1 has nothing left
    dali = stand_in_backend(dry_run)   # fails on a CUDA host where dali cannot run
    target = "cpu" if dry_run else "cuda"
    # torchvision's two executors: worker processes, and threads of this process (pinned buffers on CUDA)
    candidates = [(dali, None, "processes"), ("torchvision", target, "processes"), ("torchvision", target, "threads")]
    results: dict[str, Any] = {"bad_index": bad, "stand_in": dry_run}
    for backend, device, executor in candidates:
        if unavailable_reason(backend):
            results[backend] = f"skipped: {unavailable_reason(backend)}"
            continue
        settings = {"source": {"type": "folder", "root": str(root)}, "batch_size": 4, "loader.shuffle": False,
                    "loader.workers": 1 if executor == "processes" else 2, "loader.executor": executor,
                    "outputs": ["image", "label", "index"], "ops.0.random_resized_crop.size": 32}
        loader = build_loader(TRAIN, backend, overrides={**settings, "loader.on_error": "raise"}, device=device)
        seen, error = [], None
        try:
            for _, _, index in loader:
                seen.append(index.tolist())
        except SampleError as exc:
            error = exc
        state = loader.state_dict()
        loader.close()
        expected = [list(range(n, n + 4)) for n in range(0, bad - bad % 4, 4)]
        assert error is not None and error.index == bad, f"{backend}: expected sample {bad} to fail, got {error!r}"
        assert seen == expected, f"{backend}: yielded {seen} before the error, expected {expected}"
        assert state["batch"] == len(expected), f"{backend}: state_dict batch {state['batch']} after the error"
        loader = build_loader(TRAIN, backend, overrides={**settings, "loader.on_error": "skip"}, device=device)
        images = sum(len(index) for _, _, index in loader)
        skipped = [s.index for s in loader.skipped]
        loader.close()
        assert skipped == [bad] and images == 23, f"{backend}: skip kept {images} images, skipped {skipped}"
        loader = build_loader(TRAIN, backend, device=device, overrides={
            **settings, "source": {"type": "folder", "root": str(all_bad)}, "loader.on_error": "skip"})
        kept = [index.tolist() for _, _, index in loader]
        whole = [s.index for s in loader.skipped]
        loader.close()
        assert whole == list(whole_batch) and len(kept) == 5, \
            f"{backend}: an all-bad batch gave {kept}, skipped {whole}"
        name = f"{backend}{' (threads)' if executor == 'threads' else ''} on {device or 'its default device'}"
        results[name] = {"raise_yielded": len(seen), "skip_kept": images, "skipped": skipped,
                         "all_bad_batch_skipped": whole}
    return results


# What the pytest check runs on the GPU: files, and node ids (a test and all its parameters). Each must
# select at least one test, so a test renamed or moved fails the check instead of quietly not running.
PYTEST_SELECTIONS = (
    "tests/backends/dali/test_gpu.py",
    "tests/backends/dali/test_gpu_logic.py",
    "tests/backends/dali/test_batched_tail.py::test_on_cuda_a_batch_kernel_gives_the_per_sample_cuda_kernels_pixels",
    "tests/backends/dali/test_batched_tail.py::test_the_probe_answers_what_the_devices_add_kernel_does",
)


def check_pytest(data: Path, work: Path, out: Path, dry_run: bool) -> dict[str, Any]:
    try:
        import pytest  # noqa: F401
    except ImportError:
        raise Skip("pytest is not importable here (run device_check.sh --stage on the build host and carry "
                   ".dali/pysite)") from None
    missing = [s for s in PYTEST_SELECTIONS if not (REPO / s.split("::")[0]).is_file()]
    if missing:
        raise AssertionError(f"test files not found: {missing}")
    # A dry run only collects them (the suite runs them anyway): they import and their skips are known.
    report = out / "pytest.xml"
    mode = ["--collect-only"] if dry_run else [f"--junitxml={report}"]
    # -rfEs: the summary that comes back names each failure and error, not only the skips.
    command = [sys.executable, "-m", "pytest", *PYTEST_SELECTIONS, "-q", "-rfEs", "-p", "no:cacheprovider", *mode]
    found: dict[str, Any] = {}
    if dry_run:
        run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
        code, output = run.returncode, run.stdout
    else:   # pytest writes its XML at the session's end: a hang at interpreter exit after it is reported apart
        report.unlink(missing_ok=True)
        ran = run_for_result(command, report, timeout=PYTEST_TIMEOUT_S, log=work / "pytest.log", session=False)
        code, output = ran["returncode"], ran["output"]
        if ran["timed_out"]:
            last = "\n".join(output.splitlines()[-40:])
            raise AssertionError(f"pytest timed out after {PYTEST_TIMEOUT_S} s:\n{last}")
        if ran["teardown_hang_s"] is not None:
            code = 1 if junit_failures(report) else 0
            found["teardown"] = "pytest hung at interpreter exit after writing pytest.xml: killed"
    tail = output.strip().splitlines()[-40:]
    if code != 0:
        raise AssertionError("pytest failed:\n" + "\n".join(tail))
    ran_ids = (output.splitlines() if dry_run else junit_node_ids(report))
    selected = {selection: sum(selects(selection, node) for node in ran_ids) for selection in PYTEST_SELECTIONS}
    empty = [selection for selection, count in selected.items() if not count]
    if empty:
        raise AssertionError(f"these pytest selections selected no test: {empty}")
    return {**found, "selected": selected, "summary": tail[-1] if tail else "",
            "skips": [line for line in tail if "SKIP" in line]}


PYTEST_TIMEOUT_S = 170   # inside the check's own limit


def junit_failures(report: Path) -> int:
    """Failures and errors pytest's JUnit XML counts."""
    import xml.etree.ElementTree as ElementTree

    suites = ElementTree.parse(report).getroot().iter("testsuite")
    return sum(int(suite.get("failures", 0)) + int(suite.get("errors", 0)) for suite in suites)


def selects(selection: str, node: str) -> bool:
    """Whether pytest node id ``node`` is one of those ``selection`` (a file, or a test id) selects."""
    node = node.strip()
    return node == selection or node.startswith(selection + ("::" if "::" not in selection else "["))


def junit_node_ids(report: Path) -> list[str]:
    """The node ids of the test cases in pytest's JUnit XML (its classname is the module's dotted path)."""
    import xml.etree.ElementTree as ElementTree

    ids = []
    for case in ElementTree.parse(report).iter("testcase"):
        parts = case.get("classname", "").split(".")
        while parts and not (REPO / ("/".join(parts) + ".py")).is_file():   # a test class's name ends it
            parts.pop()
        ids.append(f"{'/'.join(parts)}.py::{case.get('name')}")
    return ids


def check_memory_bench(data: Path, work: Path, out: Path, dry_run: bool) -> dict[str, Any]:
    """(d): memory after each backend's build (a fresh process each, its result read from a file:
    a warning printed at interpreter exit cannot spoil it), then a short bench and DALI's threads."""
    require_gpu_dali(dry_run)
    results: dict[str, Any] = {"memory_after_first_batch": {}}
    for backend in ("dali", "torchvision"):
        found = work / f"memory-{backend}.json"
        found.unlink(missing_ok=True)
        ran = run_for_result([sys.executable, __file__, "--memory-of", backend, "--data", str(data), "--result",
                              str(found)], found, timeout=120, log=work / f"memory-{backend}.log", session=False)
        if not found.exists():
            raise AssertionError(f"memory of {backend} ({'timed out' if ran['timed_out'] else ran['returncode']}): "
                                 f"{ran['output'].strip().splitlines()[-3:]}")
        if ran["teardown_hang_s"] is not None:
            results.setdefault("teardown", []).append(f"memory of {backend}: hung at interpreter exit, killed")
        results["memory_after_first_batch"][backend] = json.loads(found.read_text())
    results["bench"] = bench(data, out / "bench.json", backends="dali,torchvision", baselines="torchvision,dali")
    # DALI's GPU threads: the default against a few settings, so the next run can set it from figures.
    threads = sorted({4, 8, max(1, os.cpu_count() or 1)})
    results["threads"] = bench(data, out / "bench_threads.json", backends="dali", baselines="none",
                               threads=",".join(map(str, threads)))
    return results


def bench(data: Path, target: Path, *, backends: str, baselines: str, threads: str | None = None) -> Any:
    """A short ``dali-bridge bench`` of the train pipeline: its figures, also kept in ``target``."""
    command = [sys.executable, "-m", "dali_bridge", "bench", str(TRAIN), "--data", str(data), "--backends",
               backends, "--baselines", baselines, "--batches", "6", "--warmup", "2", "--repeat", "2",
               "--json", str(target), "-q"] + (["--threads", threads] if threads else [])
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    if run.returncode != 0 or not target.exists():
        raise AssertionError(f"bench {backends} failed (exit {run.returncode}): {run.stderr.strip().splitlines()[-5:]}")
    return [{key: row.get(key) for key in ("candidate", "threads", "images_per_s", "spread_pct", "gpu_mib")}
            for row in json.loads(target.read_text())["results"]]


def check_sync(data: Path, work: Path, out: Path, dry_run: bool) -> dict[str, Any]:
    """Batches of each shipped pipeline (after a first one, which makes what is made once) under
    ``torch.cuda.set_sync_debug_mode``: the second under "warn", every host sync listed where it
    happened; the third under "error", which stops at the first. A host sync in the bridge's code
    fails; one inside torchvision's own kernels (their per-call 2x3 affine matrix), or a PIL tail's
    copy of its batch to the host, is reported where it is."""
    import torch

    from dali_bridge import build_loader

    backend = stand_in_backend(dry_run)   # the dry run runs the batches without the debug mode
    results: dict[str, Any] = {"backend": backend, "debug_mode": "off (dry run)" if dry_run else "warn, then error",
                               "warned": {}}
    failures = []
    for pipeline in sorted(PIPELINES.glob("*.yaml")):
        loader = build_loader(pipeline, backend, overrides={"source": {"type": "folder", "root": str(data)},
                                                             "batch_size": 4, "loader.shuffle": False})
        # A tail with a PIL kernel (timm's policies) runs on the host: its batch comes there once, a sync by design.
        host_tail = getattr(getattr(loader._executor, "tail", None), "device", None) == torch.device("cpu")
        batches = iter(loader)
        next(batches)
        try:
            sites = [frame_site(stack, SYNC_MESSAGE, host_tail=host_tail)
                     for stack in warned_syncs(lambda: next(batches), debug=not dry_run)]
            results["warned"][pipeline.stem] = {
                "syncs": len(sites), "where": {kind: sum(s["in"] == kind for s in sites) for kind in
                                               sorted({s["in"] for s in sites})},
                "bridge_frames": sorted({s["bridge_frame"] for s in sites if s["in"] not in ALLOWED_SYNCS})}
            failures += [f"{pipeline.stem}: host sync at {frame} (warn mode)"
                         for frame in results["warned"][pipeline.stem]["bridge_frames"]]
            if not dry_run:
                torch.cuda.set_sync_debug_mode("error")
            next(batches)
            results[pipeline.stem] = "no host sync"
        except RuntimeError as exc:
            results[pipeline.stem] = where = sync_site(exc, host_tail=host_tail)
            if where["in"] not in ALLOWED_SYNCS:
                failures.append(f"{pipeline.stem}: host sync at {where['bridge_frame']}: {where['message']}")
        finally:
            if not dry_run:
                torch.cuda.set_sync_debug_mode(0)
                torch.cuda.synchronize()   # outside the mode: a synchronize is itself a sync
            loader.close()
    if failures:
        raise AssertionError("; ".join(failures) + f" — {json.dumps(results, default=str)}")
    return results


# Host syncs the sync check accepts: torchvision's own (docs/gpu.md), and the one copy of a batch to
# the host that a tail with a PIL kernel needs.
HOST_TAIL_COPY = "the host tail's copy to the host"
ALLOWED_SYNCS = ("torchvision's kernels", HOST_TAIL_COPY)
SYNC_MESSAGE = "called a synchronizing CUDA operation"   # what torch's sync debug mode says


def warned_syncs(step: Callable[[], Any], *, debug: bool) -> list[list[traceback.FrameSummary]]:
    """``step()`` under ``torch.cuda.set_sync_debug_mode("warn")`` (``debug``): the Python stack of each
    host sync torch warned about, taken as its warning is shown (torch goes on after each)."""
    import warnings

    import torch

    stacks: list[list[traceback.FrameSummary]] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")   # every sync, not the first per line
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if SYNC_MESSAGE in str(message):   # the stack up to the torch call that synced (warnings' own frames cut)
                stacks.append([f for f in traceback.extract_stack()[:-1] if f.filename != warnings.__file__])
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        if debug:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            if debug:
                torch.cuda.set_sync_debug_mode(0)
    return stacks


def sync_site(exc: BaseException, *, host_tail: bool = False) -> dict[str, Any]:
    """Where a host sync the debug mode refused happened (see :func:`frame_site`)."""
    return frame_site(traceback.extract_tb(exc.__traceback__), str(exc) or repr(exc), host_tail=host_tail)


def frame_site(frames: list[traceback.FrameSummary], message: str, *, host_tail: bool = False) -> dict[str, Any]:
    """Where a host sync happened: the innermost frames, the bridge's last frame, and whether the
    innermost frame outside torch is torchvision's package, the batch's copy to the host of a tail
    that runs there (``host_tail``: the sync is that of ``copy_batch_to_host``, the one function that
    makes the copy, see ``made_by_host_copy``), or the bridge's code."""
    from dali_bridge.backends.device import made_by_host_copy

    ours = [f for f in frames if "dali_bridge" in Path(f.filename).parts]
    outside_torch = [f for f in frames if "dali_bridge" in Path(f.filename).parts
                     or "torchvision" in Path(f.filename).parts]
    inside = bool(outside_torch) and "torchvision" in Path(outside_torch[-1].filename).parts
    copy_to_host = host_tail and made_by_host_copy(frames)
    return {"message": message.splitlines()[0],
            "innermost": [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames[-3:]],
            "bridge_frame": f"{Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else None,
            "in": "torchvision's kernels" if inside else HOST_TAIL_COPY if copy_to_host else "the bridge's code"}


def memory_of(backend: str, data: Path) -> dict[str, Any]:
    """Build ``backend``'s train loader, take one batch, and report memory (run in a fresh process)."""
    from dali_bridge import build_loader
    from dali_bridge.backends.device import memory_snapshot
    before = memory_snapshot()
    loader = build_loader(TRAIN, backend, overrides={"source": {"type": "folder", "root": str(data)}})
    next(iter(loader))
    return {"before": before, "after_first_batch": memory_snapshot(), "threads": getattr(loader._executor, "threads",
                                                                                         None)}


# (name, check, seconds expected on one H100 with 16 cores and 256 images, time limit in seconds): estimates,
# see the docstring. The docstring, device_check.sh's header and docs/gpu.md list the same figures (tested).
CHECKS: list[tuple[str, Callable[..., dict[str, Any]], int, int]] = [
    ("env", check_env, 15, 60), ("data", check_data, 10, 60), ("device", check_device, 25, 60),
    ("equivalence", check_equivalence, 50, 120), ("errors", check_errors, 30, 60), ("sync", check_sync, 25, 60),
    ("pytest", check_pytest, 90, 180), ("memory_bench", check_memory_bench, 80, 160),
]
# The DALI install before the checks, in device seconds: six calls that each carry a 50 MiB part of the
# wheels (their transfer not measured), then ../shared/device/install-dali.sh (16 s on a 2-core host).
INSTALL_EXPECTED_S = 90
# Install and checks together, expected: a first run and one rerun on the warm machine fit 15 device
# minutes with the machine's start.
PLAN_LIMIT_S = 420
DEFAULT_BUDGET_S = 360
DRY_RUN_IMAGES = 12
# What --out may receive: the summary and the few files worth bringing back (none in a folder).
OUTPUT_FILES = ("device_check.json", "pytest.xml", "bench.json", "bench_threads.json")


# ---------------------------------------------------------------------------------------------
# Running them: one process per check, a limit per check inside the budget, one JSON for all


def run_one(name: str, data: Path, work: Path, out: Path, dry_run: bool, images: int) -> dict[str, Any]:
    """Run check ``name`` here; what it found (or why it failed or skipped) as data."""
    check = {n: c for n, c, _, _ in CHECKS}[name]
    try:
        found = (check(data, work, out, dry_run, images=images) if name == "data"
                 else check(data, work, out, dry_run))
    except Skip as exc:
        return {"status": "skipped", "reason": str(exc)}
    except StopRun as exc:
        return {"status": "failed", "reason": f"{type(exc).__name__}: {exc}", "results": exc.results, "stops_run": True}
    except Exception as exc:
        return {"status": "failed", "reason": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    return {"status": "passed", "results": found}


def default_work() -> Path:
    import tempfile
    return Path(tempfile.gettempdir()) / "dali-bridge-device-check"


def orchestrate(out: Path, *, budget: float, dry_run: bool, images: int, data: Path | None,
                work: Path | None = None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    work = work or default_work()
    if work.resolve() == out.resolve() or out.resolve() in work.resolve().parents:
        raise SystemExit(f"device check: the work folder {work} must be outside the output folder {out}")
    shutil.rmtree(work, ignore_errors=True)   # a fresh one: nothing left from an earlier run is read
    work.mkdir(parents=True)
    data = data or work / "data"
    started = time.monotonic()
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dry_run": dry_run,
                              "budget_s": budget, "images": images, "work": str(work), "plan": plan(),
                              "checks": []}
    print(plan_line(), flush=True)
    stopped: str | None = None   # why the checks after a failed gate are not run
    for name, _, expected, limit in CHECKS:
        left = budget - (time.monotonic() - started)
        entry: dict[str, Any] = {"name": name, "expected_s": expected, "limit_s": round(min(limit, max(left, 0)))}
        if stopped:
            entry.update(status="skipped", reason=stopped)
        elif left < expected:
            entry.update(status="skipped", reason=f"not run: expects ~{expected} s, {max(left, 0):.0f} s of the "
                                                  f"{budget:.0f} s budget left")
        else:
            entry.update(run_in_process(name, data, work, out, dry_run, images, timeout=min(limit, left)))
        report["checks"].append(entry)
        if entry.get("stops_run"):
            stopped = f"not run: {name} failed ({entry.get('reason', '')})"
        print(f"device check {name}: {entry['status']}" + (f" ({one_line(entry['reason'])})" if entry.get("reason")
                                                           else "") + f" [{entry.get('seconds', 0):.0f} s]"
              + (f"; teardown: {entry['teardown']}" if entry.get("teardown") else ""),
              flush=True)
    counts = {status: sum(c["status"] == status for c in report["checks"])
              for status in ("passed", "failed", "skipped")}
    # A hang at interpreter exit after the result was written is reported beside the results, not as a failure.
    report.update(elapsed_s=round(time.monotonic() - started, 1), summary=counts,
                  teardown_hangs=[c["name"] for c in report["checks"] if c.get("teardown")],
                  exit_status=0 if counts["failed"] == 0 else 1)
    target = out / "device_check.json"
    target.write_text(json.dumps(report, indent=2, default=str))
    print("\n".join(summary_screen(report, target)), flush=True)
    return report["exit_status"]


def plan() -> dict[str, Any]:
    """What the run is expected to take on one H100, in device seconds: each check, the checks, the DALI
    install before them, and both against :data:`PLAN_LIMIT_S`."""
    checks = {name: expected for name, _, expected, _ in CHECKS}
    total = sum(checks.values())
    return {"device": "one H100, 16 cores (estimates)", "checks_s": checks, "checks_total_s": total,
            "install_s": INSTALL_EXPECTED_S, "install_and_checks_s": total + INSTALL_EXPECTED_S,
            "limit_s": PLAN_LIMIT_S}


def plan_line() -> str:
    """The plan in one printed line (the first of the run)."""
    found = plan()
    checks = ", ".join(f"{name} {seconds}" for name, seconds in found["checks_s"].items())
    return (f"device check plan, expected seconds on {found['device']}: {checks} = {found['checks_total_s']} s of "
            f"checks; with the DALI install ({found['install_s']} s) {found['install_and_checks_s']} s "
            f"(limit {found['limit_s']} s)")


def one_line(text: str, width: int = 110) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[:width - 3] + "..."


def key_figures(name: str, results: dict[str, Any]) -> str:
    """A check's few numbers worth reading on the summary screen."""
    if name == "env":
        return (f"{results.get('cuda_devices')} GPU(s) {results.get('gpus', [])} torch {results.get('torch')} "
                f"torchvision {results.get('torchvision')}")
    if name == "data":
        return f"{results.get('images')} images"
    if name == "equivalence":
        return "; ".join(f"{k} mean {v['mean_levels']:.3f} max {v['max_levels']}" for k, v in results.items()
                         if isinstance(v, dict) and "mean_levels" in v)
    if name == "sync":
        return "; ".join(f"{k}: {v if isinstance(v, str) else 'sync in ' + v['in'] + ' at ' + str(v['bridge_frame'])}"
                         for k, v in results.items() if k not in ("backend", "debug_mode", "warned"))
    if name == "pytest":
        return str(results.get("summary", ""))
    if name == "errors":
        return "; ".join(f"{k}: raise yielded {v['raise_yielded']}, skip kept {v['skip_kept']}"
                         for k, v in results.items() if isinstance(v, dict))
    if name == "memory_bench":
        memory = {k: round((v["after_first_batch"].get("gpu_used") or 0) / 2**20)
                  for k, v in results.get("memory_after_first_batch", {}).items()}
        rates = [f"{r['candidate']} x{r['threads']} {r['images_per_s']:.0f}/s"
                 for r in results.get("bench", []) + results.get("threads", []) if r.get("images_per_s")]
        return f"GPU MiB after first batch {memory}; " + ", ".join(rates)
    return ", ".join(f"{k}={v}" for k, v in results.items() if isinstance(v, (bool, int, float, str)))[:200]


def summary_screen(report: dict[str, Any], target: Path) -> list[str]:
    """The last lines printed: one per check (status, seconds, key figures or reason), then the total."""
    lines = ["", "=" * 30 + " device check summary " + "=" * 30]
    for check in report["checks"]:
        detail = (key_figures(check["name"], check.get("results") or {}) if check["status"] == "passed"
                  else check.get("reason", ""))
        lines.append(f"{check['name']:<13}{check['status']:<8}{check.get('seconds', 0):>5.0f} s "
                     f"(~{check['expected_s']:>3}) {one_line(detail, 95)}")
    counts = report["summary"]
    if report.get("teardown_hangs"):
        lines.append(f"teardown: {', '.join(report['teardown_hangs'])} hung at interpreter exit after writing "
                     f"the result (killed; the results stand)")
    lines.append(f"device check: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
                 f"in {report['elapsed_s']:.0f} s of {report['budget_s']:.0f} s; results in {target}")
    return lines


# Seconds a check's process may take to exit once its result is written: past them its interpreter's
# teardown (DALI's or CUDA's threads) is taken to hang; it is killed and the hang reported beside the result.
TEARDOWN_GRACE_S = 20.0


def run_for_result(command: list[str], result: Path, *, timeout: float, log: Path,
                   grace: float | None = None, session: bool = True) -> dict[str, Any]:
    """Run ``command`` until it exits, or until ``timeout`` seconds: in a session of its own (``session``:
    killed with every process it started when it runs over), or, inside a check, in the check's (then a
    check killed for its own limit takes it along; only the command itself is killed here). Once it has
    written ``result`` it has ``grace`` seconds (:data:`TEARDOWN_GRACE_S`) to exit: a hang at interpreter
    exit is then killed and reported (``teardown_hang_s``) apart from the result, which stands. Output
    goes to ``log``."""
    grace = TEARDOWN_GRACE_S if grace is None else grace
    started = time.monotonic()
    written_at: float | None = None
    found: dict[str, Any] = {"returncode": None, "timed_out": False, "teardown_hang_s": None}
    with open(log, "w") as output, subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, text=True,
                                                   cwd=REPO, start_new_session=session) as process:
        while process.poll() is None:
            now = time.monotonic()
            if written_at is None and result.exists():
                written_at = now
            if written_at is not None and now - written_at > grace:
                found["teardown_hang_s"] = round(now - written_at, 1)
                break
            if now - started > timeout:
                found["timed_out"] = True
                break
            time.sleep(0.1)
        if process.poll() is None:
            if session:
                os.killpg(process.pid, signal.SIGKILL)
            else:
                process.kill()
            process.wait()
        else:
            found["returncode"] = process.returncode
    found["output"] = log.read_text(errors="replace")
    return found


def run_in_process(name: str, data: Path, work: Path, out: Path, dry_run: bool, images: int, *,
                   timeout: float) -> dict[str, Any]:
    part = work / f"{name}.json"
    part.unlink(missing_ok=True)
    command = [sys.executable, __file__, "--one", name, "--data", str(data), "--work", str(work), "--out", str(out),
               "--images", str(images)] + (["--dry-run"] if dry_run else [])
    t0 = time.monotonic()
    ran = run_for_result(command, part, timeout=timeout, log=work / f"{name}.log")
    entry: dict[str, Any] = {"seconds": round(time.monotonic() - t0, 1)}
    if part.exists():
        entry.update(json.loads(part.read_text()))
    elif ran["timed_out"]:
        entry.update(status="failed", reason=f"timed out after {timeout:.0f} s")
    else:
        entry.update(status="failed", reason=f"the check's process exited {ran['returncode']} without a result")
    if ran["teardown_hang_s"] is not None:   # the result stands; the hang is said beside it
        entry["teardown"] = (f"the process hung at interpreter exit after writing its result: killed "
                             f"{ran['teardown_hang_s']:.0f} s later")
    if entry["status"] == "failed" or "teardown" in entry:
        entry["output_tail"] = ran["output"][-3000:]
    return entry


def write_result(path: Path, result: dict[str, Any]) -> None:
    """``result`` as JSON at ``path``, whole or not at all (the parent reads it as soon as it exists)."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(result, indent=2, default=str))
    os.replace(partial, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="folder for device_check.json (default $OUT, else ./out)")
    parser.add_argument("--work", type=Path, help="folder for scratch data, outside --out (default: "
                                                  f"{default_work()})")
    parser.add_argument("--budget", type=float, default=float(os.environ.get("CHECK_BUDGET_S", DEFAULT_BUDGET_S)))
    parser.add_argument("--images", type=int, default=None, help="images in the generated set (default 256; 12 "
                                                                  "in a dry run)")
    parser.add_argument("--data", type=Path, help="an ImageFolder to use instead of a generated one")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--one", help=argparse.SUPPRESS)         # run one check in this process
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    images = args.images or (DRY_RUN_IMAGES if args.dry_run else 256)
    if args.memory_of:
        write_result(args.result, memory_of(args.memory_of, args.data))
        return 0
    out = args.out or Path(os.environ.get("OUT") or REPO / "out")
    if args.one:
        result = run_one(args.one, args.data, args.work, out, args.dry_run, images)
        write_result(args.work / f"{args.one}.json", result)
        return 0
    return orchestrate(out, budget=args.budget, dry_run=args.dry_run, images=images, data=args.data, work=args.work)


if __name__ == "__main__":
    sys.exit(main())
