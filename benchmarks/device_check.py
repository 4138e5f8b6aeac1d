"""The GPU path checked in one run: the checks ``benchmarks/device_check.sh`` runs, each in its own
process with a time limit inside one budget, and every finding written to one JSON file.

    python benchmarks/device_check.py --out DIR [--budget S] [--images N] [--dry-run]

Checks (each skipped, with its reason, where the host cannot run it):
  env          the host: Python, torch, CUDA devices, driver, DALI build, ``doctor``
  data         a generated ImageFolder set (``--images``) shared by the checks
  equivalence  (a) shipped train/val pipelines on ``dali`` (mixed decode; decode.device cpu; mixed
               with the hardware decoder off) against ``dali-cpu``, consumer's stream kept busy:
               mean and max level difference per variant
  device       (b) ``device="cpu"`` batches equal a blocking copy of the GPU ones; LOCAL_RANK beyond
               the device count; an explicit ``cuda:N``
  errors       (c) ``on_error: raise`` yields the batches before a broken file, ``skip`` counts it,
               on ``dali`` and on torchvision finishing on CUDA
  pytest       tests/test_gpu.py and tests/test_gpu_logic.py
  memory_bench (d) GPU and pinned host memory after building each backend's loader, then a short
               ``dali-bridge bench`` of dali vs torchvision vs the hand-written loaders

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

# Equivalence bounds, in levels of 0-255 uint8 output (docs/gpu.md): nvJPEG's chroma upsampling
# and the hardware decoder differ from libjpeg-turbo by several levels at some pixels, so mixed
# decode is bounded by its mean and its maximum reported; decoding on the CPU leaves only the GPU
# resize's rounding, at most one level.
MIXED_MEAN_LEVELS = 1.0
CPU_DECODE_MAX_LEVELS = 1


class Skip(Exception):
    """A check that cannot run here; the message says why."""


# ---------------------------------------------------------------------------------------------
# Helpers shared by the checks (run in the check's own process)


def cuda_devices() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def need_gpu_dali(dry_run: bool) -> str | None:
    """None when ``dali`` can run here, else why not (a dry run never uses the GPU)."""
    if dry_run:
        return "dry run: no GPU used"
    from dali_bridge.backends.select import unavailable_reason
    reason = unavailable_reason("dali")
    return f"dali cannot run here: {reason}" if reason else None


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


def broken_folder(root: Path, *, images: int = 24, bad: int = 9) -> tuple[Path, int]:
    """A small ImageFolder whose sample ``bad`` is a JPEG cut in its header (every decoder rejects it)."""
    from dali_bridge.samples import generate_sample_data
    from dali_bridge.sources import list_source
    from dali_bridge.spec import coerce_spec

    if not root.exists():
        generate_sample_data(root, images=images, classes=2, seed=5, workers=1)
    spec = coerce_spec(TRAIN, {"source": {"type": "folder", "root": str(root)}})
    path = Path(list_source(spec.source).paths[bad])
    path.write_bytes(path.read_bytes()[:20])
    return root, bad


# ---------------------------------------------------------------------------------------------
# The checks: each takes (data folder, work folder, dry run) and returns its results as data


def check_env(data: Path, work: Path, dry_run: bool) -> dict[str, Any]:
    import torch

    from dali_bridge.doctor import report
    info: dict[str, Any] = {"python": sys.version.split()[0], "platform": platform.platform(),
                            "torch": torch.__version__, "cuda_devices": cuda_devices()}
    if info["cuda_devices"]:
        info["gpus"] = [torch.cuda.get_device_name(n) for n in range(info["cuda_devices"])]
    try:
        info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                                             "--format=csv,noheader"], capture_output=True, text=True,
                                            timeout=20, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        info["nvidia_smi"] = f"not run: {exc}"
    info["doctor"] = report()
    return info


def check_data(data: Path, work: Path, dry_run: bool, images: int = 256) -> dict[str, Any]:
    from dali_bridge.samples import generate_sample_data
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


def check_equivalence(data: Path, work: Path, dry_run: bool) -> dict[str, Any]:
    """(a): ``dali`` against ``dali-cpu``, per variant; mean ≤ 1 level for mixed decode (max
    reported), max ≤ 1 level with ``decode.device: cpu``."""
    from dali_bridge import build_loader
    from dali_bridge.backends import device as device_module
    from dali_bridge.backends.select import unavailable_reason

    why_not = need_gpu_dali(dry_run)
    if why_not and (not dry_run or unavailable_reason("dali-cpu")):
        raise Skip(why_not)
    gpu_backend = "dali-cpu" if why_not else "dali"   # the dry run compares dali-cpu with itself
    size = 64 if dry_run else 160
    variants = EQUIVALENCE_VARIANTS[:1] if dry_run else EQUIVALENCE_VARIANTS
    results: dict[str, Any] = {"compared": f"{gpu_backend} vs dali-cpu", "size": size, "stand_in": bool(why_not)}
    failures = []
    for name, pipeline, decode, hw_load in variants:
        device_module.HW_DECODER_LOAD = 0.65 if hw_load is None else hw_load
        extra = {"ops.2": {"normalize": {"dtype": "uint8", "layout": "HWC"}}}  # the last op of both pipelines
        gpu = build_loader(pipeline, gpu_backend, overrides=overrides(data, pipeline, size, **extra,
                                                                      **{"decode.device": decode}))
        cpu = build_loader(pipeline, "dali-cpu", overrides=overrides(data, pipeline, size, **extra))
        found = level_differences(gpu, cpu)
        gpu.close(), cpu.close()
        found["bound"] = (f"mean <= {MIXED_MEAN_LEVELS} level" if decode == "mixed"
                          else f"max <= {CPU_DECODE_MAX_LEVELS} level")
        found["hw_decoder_load"] = device_module.HW_DECODER_LOAD
        results[name] = found
        if decode == "mixed" and found["mean_levels"] > MIXED_MEAN_LEVELS:
            failures.append(f"{name}: mean {found['mean_levels']:.3f} levels > {MIXED_MEAN_LEVELS}")
        if decode == "cpu" and found["max_levels"] > CPU_DECODE_MAX_LEVELS:
            failures.append(f"{name}: max {found['max_levels']} levels > {CPU_DECODE_MAX_LEVELS}")
    device_module.HW_DECODER_LOAD = 0.65
    if failures:
        raise AssertionError("; ".join(failures) + f" — {json.dumps(results)}")
    return results


def check_device(data: Path, work: Path, dry_run: bool) -> dict[str, Any]:
    """(b): the device contract of the ``dali`` backend on CUDA (needs a GPU: nothing stands in)."""
    why_not = need_gpu_dali(dry_run)
    if why_not:
        raise Skip(why_not)
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


def check_errors(data: Path, work: Path, dry_run: bool) -> dict[str, Any]:
    """(c): raise yields the batches before the broken file then names it; skip counts it — on
    ``dali`` and on torchvision finishing on CUDA (stand-ins in a dry run: dali-cpu, a CPU target)."""
    from dali_bridge import build_loader
    from dali_bridge.backends.select import unavailable_reason
    from dali_bridge.images import SampleError

    root, bad = broken_folder(work / "broken")
    gpu_dali = need_gpu_dali(dry_run) is None
    cuda = not dry_run and cuda_devices() > 0
    if not dry_run and not (gpu_dali or cuda):
        raise Skip("needs a CUDA device")
    candidates = [("dali" if gpu_dali else "dali-cpu", None), ("torchvision", "cuda" if cuda else "cpu")]
    results: dict[str, Any] = {"bad_index": bad, "stand_in": dry_run}
    for backend, device in candidates:
        if unavailable_reason(backend):
            results[backend] = f"skipped: {unavailable_reason(backend)}"
            continue
        settings = {"source": {"type": "folder", "root": str(root)}, "batch_size": 4, "loader.shuffle": False,
                    "loader.workers": 1,
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
        results[f"{backend} on {device or 'its default device'}"] = {"raise_yielded": len(seen), "skip_kept": images,
                                                                     "skipped": skipped}
    return results


def check_pytest(data: Path, work: Path, dry_run: bool) -> dict[str, Any]:
    try:
        import pytest  # noqa: F401
    except ImportError:
        raise Skip("pytest is not importable here (run device_check.sh --stage on the build host and carry "
                   ".dali/pysite)") from None
    files = ["tests/test_gpu.py", "tests/test_gpu_logic.py"]
    # A dry run only collects them (the suite runs them anyway): they import and their skips are known.
    mode = ["--collect-only"] if dry_run else [f"--junitxml={work / 'pytest.xml'}"]
    run = subprocess.run([sys.executable, "-m", "pytest", *files, "-q", "-rs", "-p", "no:cacheprovider", *mode],
                         cwd=REPO, capture_output=True, text=True, check=False)
    tail = run.stdout.strip().splitlines()[-40:]
    if run.returncode != 0:
        raise AssertionError("pytest failed:\n" + "\n".join(tail))
    return {"files": files, "summary": tail[-1] if tail else "", "skips": [line for line in tail if "SKIP" in line]}


def check_memory_bench(data: Path, work: Path, dry_run: bool) -> dict[str, Any]:
    """(d): memory after each backend's build (a fresh process each), then a short bench."""
    why_not = need_gpu_dali(dry_run)
    if why_not:
        raise Skip(why_not)
    results: dict[str, Any] = {"memory_after_first_batch": {}}
    for backend in ("dali", "torchvision"):
        out = subprocess.run([sys.executable, __file__, "--memory-of", backend, "--data", str(data)],
                             capture_output=True, text=True, timeout=120, check=False)
        if out.returncode != 0:
            raise AssertionError(f"memory of {backend}: {out.stderr.strip().splitlines()[-3:]}")
        results["memory_after_first_batch"][backend] = json.loads(out.stdout.strip().splitlines()[-1])
    bench_json = work / "bench.json"
    bench = subprocess.run([sys.executable, "-m", "dali_bridge.cli", "bench", str(TRAIN), "--data", str(data),
                            "--backends", "dali,torchvision", "--baselines", "torchvision,dali", "--batches", "6",
                            "--warmup", "2", "--repeat", "3", "--json", str(bench_json), "-q"],
                           cwd=REPO, capture_output=True, text=True, check=False)
    results["bench_stdout"] = bench.stdout.strip().splitlines()[-30:]
    if bench.returncode != 0:
        raise AssertionError(f"bench failed: {bench.stderr.strip().splitlines()[-5:]}")
    results["bench"] = json.loads(bench_json.read_text())
    return results


def memory_of(backend: str, data: Path) -> dict[str, Any]:
    """Build ``backend``'s train loader, take one batch, and report memory (run in a fresh process)."""
    from dali_bridge import build_loader
    from dali_bridge.backends.device import memory_snapshot
    before = memory_snapshot()
    loader = build_loader(TRAIN, backend, overrides={"source": {"type": "folder", "root": str(data)}})
    next(iter(loader))
    return {"before": before, "after_first_batch": memory_snapshot(), "threads": getattr(loader._executor, "threads",
                                                                                         None)}


CHECKS: list[tuple[str, Callable[..., dict[str, Any]], int]] = [  # (name, check, time limit in seconds)
    ("env", check_env, 60), ("data", check_data, 90), ("device", check_device, 90), ("errors", check_errors, 90),
    ("equivalence", check_equivalence, 150), ("pytest", check_pytest, 180), ("memory_bench", check_memory_bench, 200),
]
DRY_RUN_IMAGES = 12


# ---------------------------------------------------------------------------------------------
# Running them: one process per check, a limit per check inside the budget, one JSON for all


def run_one(name: str, data: Path, work: Path, dry_run: bool, images: int) -> dict[str, Any]:
    """Run check ``name`` here; what it found (or why it failed or skipped) as data."""
    check = {n: c for n, c, _ in CHECKS}[name]
    try:
        found = check(data, work, dry_run, images=images) if name == "data" else check(data, work, dry_run)
    except Skip as exc:
        return {"status": "skipped", "reason": str(exc)}
    except Exception as exc:
        return {"status": "failed", "reason": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    return {"status": "passed", "results": found}


def orchestrate(out: Path, *, budget: float, dry_run: bool, images: int, data: Path | None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    work.mkdir(exist_ok=True)
    data = data or work / "data"
    started = time.monotonic()
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dry_run": dry_run,
                              "budget_s": budget, "images": images, "checks": []}
    for name, _, limit in CHECKS:
        left = budget - (time.monotonic() - started)
        entry: dict[str, Any] = {"name": name, "limit_s": round(min(limit, max(left, 0)))}
        if left < 10:
            entry.update(status="skipped", reason=f"not run: {max(left, 0):.0f} s of the {budget:.0f} s budget left")
        else:
            entry.update(run_in_process(name, data, work, dry_run, images, timeout=min(limit, left)))
        report["checks"].append(entry)
        print(f"device check {name}: {entry['status']}"
              + (f" ({entry['reason']})" if entry.get("reason") else "")
              + f" [{entry.get('seconds', 0):.0f} s]", flush=True)
    counts = {status: sum(c["status"] == status for c in report["checks"])
              for status in ("passed", "failed", "skipped")}
    report.update(elapsed_s=round(time.monotonic() - started, 1), summary=counts,
                  exit_status=0 if counts["failed"] == 0 else 1)
    target = out / "device_check.json"
    target.write_text(json.dumps(report, indent=2, default=str))
    print(f"device check: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
          f"in {report['elapsed_s']:.0f} s; results in {target}", flush=True)
    return report["exit_status"]


def run_in_process(name: str, data: Path, work: Path, dry_run: bool, images: int, *, timeout: float) -> dict[str, Any]:
    part = work / f"{name}.json"
    part.unlink(missing_ok=True)
    command = [sys.executable, __file__, "--one", name, "--data", str(data), "--work", str(work),
               "--images", str(images)] + (["--dry-run"] if dry_run else [])
    t0 = time.monotonic()
    # Its own session, so a check that times out is killed with every process it started
    # (DataLoader workers, pytest, the bench's children).
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                          start_new_session=True) as process:
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            return {"status": "failed", "reason": f"timed out after {timeout:.0f} s",
                    "seconds": round(time.monotonic() - t0, 1), "output_tail": output[-3000:]}
    entry: dict[str, Any] = {"seconds": round(time.monotonic() - t0, 1)}
    if part.exists():
        entry.update(json.loads(part.read_text()))
    else:
        entry.update(status="failed", reason=f"the check's process exited {process.returncode} without a result")
    if entry["status"] == "failed":
        entry["output_tail"] = output[-3000:]
    return entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="folder for device_check.json (default $OUT, else ./out)")
    parser.add_argument("--budget", type=float, default=float(os.environ.get("CHECK_BUDGET_S", "420")))
    parser.add_argument("--images", type=int, default=None, help="images in the generated set (default 256; 12 "
                                                                  "in a dry run)")
    parser.add_argument("--data", type=Path, help="an ImageFolder to use instead of a generated one")
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--one", help=argparse.SUPPRESS)         # run one check in this process
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    images = args.images or (DRY_RUN_IMAGES if args.dry_run else 256)
    if args.memory_of:
        print(json.dumps(memory_of(args.memory_of, args.data)))
        return 0
    if args.one:
        result = run_one(args.one, args.data, args.work, args.dry_run, images)
        (args.work / f"{args.one}.json").write_text(json.dumps(result, indent=2, default=str))
        return 0
    out = args.out or Path(os.environ.get("OUT") or REPO / "out")
    return orchestrate(out, budget=args.budget, dry_run=args.dry_run, images=images, data=args.data)


if __name__ == "__main__":
    sys.exit(main())
