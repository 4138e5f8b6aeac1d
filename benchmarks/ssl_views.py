"""DINO's multi-crop on the bridge against lightly's ``DINOTransform``, in one run on this machine.

Candidates, each measured in fresh processes, interleaved round by round (A B C ... A B C ...) so
that the ratios compare windows measured close together on a shared machine:

* ``dino-torchvision`` / ``dino-dali-cpu``: ``pipelines/dino_train.yaml`` (2 global views of 224,
  8 local views of 96, every view cut from one decode) on each CPU backend.
* ``lightly``: ``torchvision.datasets.ImageFolder(root, transform=DINOTransform(global_crop_size=224,
  local_crop_size=96, n_local_views=8))`` in a ``torch.utils.data.DataLoader`` with its default
  collate, shuffled, 2 workers: as lightly's DINO example writes it.
* ``dino-per-view-decode``: the same ten views as ten single-view pipelines (each view's chain and
  its per-view settings), each decoding the file itself, their loaders zipped (1 worker each), on
  the ``torchvision`` backend: the cost of decoding once per view.
* ``one-224-torchvision`` / ``one-224-dali-cpu``: one 224 view per image, the global views' chain
  as a single-view pipeline, on each backend.

img/s counts samples (images), whatever the views per sample. CPU per image is the CPU time of
the measuring process and its workers over the timed window. Writes ``results/ssl_views.json``;
``python -m dali_bridge.bench readme benchmarks/results/*.json --out benchmarks/README.md`` renders it.

    python benchmarks/ssl_views.py [--rounds 3] [--batches 8] [--batch-size 32]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dali_bridge.bench.procstats import tree_cpu_seconds  # noqa: E402
from dali_bridge.bench.results import loadavg, machine_description  # noqa: E402
from dali_bridge.bench.ssl_report import SSL_VIEWS_FORMAT  # noqa: E402

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
PIPELINE = ROOT / "dali_bridge" / "pipelines" / "dino_train.yaml"
DATA = ROOT / "data" / "sample"
OUT = ROOT / "benchmarks" / "results" / "ssl_views.json"
CANDIDATES = {
    "dino-torchvision": "dino_train on the torchvision backend (2 × 224 + 8 × 96 views, one decode per sample)",
    "dino-dali-cpu": "dino_train on the dali-cpu backend (2 × 224 + 8 × 96 views, one decoder output per sample)",
    "lightly": "lightly DINOTransform(global_crop_size=224, local_crop_size=96, n_local_views=8) on "
               "torchvision ImageFolder, torch DataLoader (default collate, shuffle), 2 workers",
    "dino-per-view-decode": "dino_train's ten views as ten single-view pipelines zipped, each decoding the file "
                            "(torchvision backend, 1 worker each)",
    "one-224-torchvision": "one 224 view per image (the global views' chain, single-view pipeline), "
                           "torchvision backend",
    "one-224-dali-cpu": "one 224 view per image (the global views' chain, single-view pipeline), dali-cpu backend",
}


def _dino_raw() -> dict[str, Any]:
    import yaml
    return yaml.safe_load(PIPELINE.read_text())


def _single_view(raw: dict[str, Any], group: str, changes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A pipeline without views whose chain is ``group``'s, with one view's ``per_view`` changes."""
    ops = copy.deepcopy(raw["views"][group]["ops"])
    for step in ops:
        (name, params), = step.items()
        params.update(changes.get(name, {}))
    single = {k: v for k, v in copy.deepcopy(raw).items() if k != "views"}
    return {**single, "ops": ops, "outputs": ["image", "label"]}


def _every_view(raw: dict[str, Any]) -> list[dict[str, Any]]:
    specs = []
    for group, body in raw["views"].items():
        per_view = body.get("per_view") or [{}] * body.get("count", 1)
        specs += [_single_view(raw, group, changes) for changes in per_view]
    return specs


def _bridge(spec: Any, backend: str, batch_size: int, workers: Any = "auto") -> tuple[Iterator, Callable]:
    from dali_bridge import build_loader

    loader = build_loader(spec, backend, overrides={"source.root": str(DATA), "batch_size": batch_size,
                                                     "loader.workers": workers})

    def stream() -> Iterator[int]:
        while True:
            for batch in loader:
                yield len(batch[-1])

    return stream(), loader.close


def _per_view_decode(batch_size: int) -> tuple[Iterator, Callable]:
    from dali_bridge import build_loader

    loaders = [build_loader(spec, "torchvision", overrides={"source.root": str(DATA), "batch_size": batch_size,
                                                             "loader.workers": 1})
               for spec in _every_view(_dino_raw())]

    def stream() -> Iterator[int]:
        while True:
            for batches in zip(*loaders):
                yield len(batches[0][-1])

    return stream(), lambda: [loader.close() for loader in loaders]


def _lightly(batch_size: int) -> tuple[Iterator, Callable]:
    import torch
    import torchvision
    from lightly.transforms.dino_transform import DINOTransform

    transform = DINOTransform(global_crop_size=224, local_crop_size=96, n_local_views=8)
    dataset = torchvision.datasets.ImageFolder(str(DATA), transform=transform)
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, drop_last=True,
                                         num_workers=2, persistent_workers=True)

    def stream() -> Iterator[int]:
        while True:
            for views, labels in loader:
                yield len(labels)

    return stream(), lambda: None


def _open(name: str, batch_size: int) -> tuple[Iterator, Callable]:
    if name == "lightly":
        return _lightly(batch_size)
    if name == "dino-per-view-decode":
        return _per_view_decode(batch_size)
    if name.startswith("dino-"):
        return _bridge(str(PIPELINE), name.removeprefix("dino-"), batch_size)
    single = _single_view(_dino_raw(), "global", {})
    return _bridge(single, name.removeprefix("one-224-"), batch_size)


def child(name: str, *, batch_size: int, warmup: int, batches: int) -> dict[str, Any]:
    """One candidate in this process: warm-up batches, then one timed window."""
    import torch  # noqa: F401  (imported before the clock, like every candidate's libraries)
    import torchvision  # noqa: F401
    if "dali" in name:
        import nvidia.dali  # noqa: F401
    stream, close = _open(name, batch_size)
    for _ in range(warmup):
        next(stream)
    cpu0, t0 = tree_cpu_seconds(), time.perf_counter()
    samples = sum(next(stream) for _ in range(batches))
    seconds, cpu = time.perf_counter() - t0, tree_cpu_seconds() - cpu0
    close()
    return {"samples": samples, "seconds": seconds, "cpu_seconds": cpu}


def _cpu_ms(clock: list[float], key: str, totals: dict[str, float]) -> None:
    now = time.thread_time()
    totals[key] = totals.get(key, 0.0) + 1000.0 * (now - clock[0])
    clock[0] = now


def profile_bridge(samples: int) -> dict[str, float]:
    """CPU ms per sample of each stage of dino_train on the torchvision backend's kernels, one
    thread, summed over the ten views: the whole decode, then each op of the views' chains."""
    import torch
    from dali_bridge.backends.torchvision import decode_checked
    from dali_bridge.data.sources.local import list_source
    from dali_bridge.pipeline.plan import build_plan
    from dali_bridge.pipeline.sampling import draws, sample_steps
    from dali_bridge.spec.pipeline import load_spec

    torch.set_num_threads(1)  # as in a DataLoader worker
    spec = load_spec(PIPELINE, {"source.root": str(DATA)})
    plan, listing = build_plan(spec), list_source(spec.source)
    found = [draws(view, spec.seed, 0, list(range(samples))) for view in plan.views]
    mean, std = (torch.tensor(v).view(3, 1, 1) for v in (IMAGENET_MEAN, IMAGENET_STD))
    totals: dict[str, float] = {}
    for sample in [0, *range(samples)]:  # the first pass warms the kernels up and is discarded
        totals = {} if sample == 0 else totals
        data = listing.read(sample)
        clock = [time.thread_time()]
        image = decode_checked(data)
        _cpu_ms(clock, "decode", totals)
        height, width = image.shape[-2:]
        for view, view_draws in zip(plan.views, found):
            steps = sample_steps(view, width, height, {pos: values[sample] for pos, values in view_draws.items()})
            clock = [time.thread_time()]
            out = image
            for step, (concrete, _) in zip(view.steps, steps):
                out = step.op.torchvision_kernel(out, concrete, step.params)
                _cpu_ms(clock, step.op.name, totals)
            out.float().div_(255).sub_(mean).div_(std)  # the finish, which the backend runs on the batch
            _cpu_ms(clock, "finish (float32, normalise)", totals)
    return {key: value / samples for key, value in totals.items()}


def profile_lightly(samples: int) -> dict[str, float]:
    """CPU ms per sample of each transform of lightly's DINOTransform (PIL), one thread, summed
    over the ten views; ``decode`` is ImageFolder's PIL load."""
    import torch
    import torchvision
    from lightly.transforms.dino_transform import DINOTransform

    torch.set_num_threads(1)
    transform = DINOTransform(global_crop_size=224, local_crop_size=96, n_local_views=8)
    dataset = torchvision.datasets.ImageFolder(str(DATA))
    totals: dict[str, float] = {}
    for sample in [0, *range(samples)]:  # the first pass warms up and is discarded
        totals = {} if sample == 0 else totals
        clock = [time.thread_time()]
        image = dataset.loader(dataset.samples[sample][0])
        image.load()
        _cpu_ms(clock, "decode", totals)
        for view in transform.transforms:
            clock = [time.thread_time()]
            out = image
            for step in view.transform.transforms if hasattr(view, "transform") else view.transforms:
                out = step(out)
                inner = getattr(step, "transforms", None) or [step]
                _cpu_ms(clock, "+".join(type(t).__name__ for t in inner), totals)
    return {key: value / samples for key, value in totals.items()}


def _run_child(name: str, args: argparse.Namespace) -> dict[str, Any]:
    before = loadavg()
    proc = subprocess.run([sys.executable, __file__, "--child", name, "--batch-size", str(args.batch_size),
                           "--warmup", str(args.warmup), "--batches", str(args.batches)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    after = loadavg()
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    window = json.loads(proc.stdout.strip().splitlines()[-1])
    window.update(images_per_s=window["samples"] / window["seconds"],
                  cpu_ms_per_image=1000.0 * window["cpu_seconds"] / window["samples"],
                  load_before=before[0] if before else None, load_after=after[0] if after else None)
    print(f"  {name}: {window['images_per_s']:.1f} img/s, {window['cpu_ms_per_image']:.1f} CPU ms/img", flush=True)
    return window


def _profile(args: argparse.Namespace) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--child", "profile", "--profile-samples",
                           str(args.profile_samples)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"the profile failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ratio(rounds: list[dict[str, dict[str, Any]]], top: str, bottom: str) -> dict[str, Any]:
    """``top``'s img/s over ``bottom``'s, per round (windows measured side by side) and their median."""
    per_round = [r[top]["images_per_s"] / r[bottom]["images_per_s"] for r in rounds]
    # the same ratio from CPU time per image (bottom's over top's): steadier where the cores are shared
    cpu = [r[bottom]["cpu_ms_per_image"] / r[top]["cpu_ms_per_image"] for r in rounds]
    return {"median": statistics.median(per_round), "per_round": per_round, "cpu_median": statistics.median(cpu)}


GOALS = [  # (name, numerator, denominator, bound, kind): kind "min" means ratio >= bound
    ("torchvision backend ≥ 2 × lightly's DataLoader", "dino-torchvision", "lightly", 2.0, "min"),
    ("dali-cpu ≥ 1.3 × the torchvision backend", "dino-dali-cpu", "dino-torchvision", 1.3, "min"),
    ("ten views ≤ 3 × one 224 view's time per image (torchvision)", "one-224-torchvision", "dino-torchvision",
     3.0, "max"),
    ("ten views ≤ 3 × one 224 view's time per image (dali-cpu)", "one-224-dali-cpu", "dino-dali-cpu", 3.0, "max"),
]
FIGURES = [("decoding once against decoding per view (torchvision)", "dino-torchvision", "dino-per-view-decode")]


def summarise(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per candidate: median img/s and CPU ms per image over rounds; the goals' ratios."""
    candidates = {}
    for name in rounds[0]:
        windows = [r[name] for r in rounds]
        candidates[name] = {
            "description": CANDIDATES[name],
            "images_per_s": statistics.median(w["images_per_s"] for w in windows),
            "images_per_s_min": min(w["images_per_s"] for w in windows),
            "images_per_s_max": max(w["images_per_s"] for w in windows),
            "cpu_ms_per_image": statistics.median(w["cpu_ms_per_image"] for w in windows),
            "views_per_sample": 1 if name.startswith("one-224") else 10,
        }
    goals = []
    for text, top, bottom, bound, kind in (g for g in GOALS if g[1] in candidates and g[2] in candidates):
        ratio = _ratio(rounds, top, bottom)
        met = ratio["median"] >= bound if kind == "min" else ratio["median"] <= bound
        goals.append({"goal": text, "numerator": top, "denominator": bottom, "bound": bound, "kind": kind,
                      **ratio, "met": met})
    figures = [{"figure": text, "numerator": top, "denominator": bottom, **_ratio(rounds, top, bottom)}
               for text, top, bottom in FIGURES if top in candidates and bottom in candidates]
    return {"candidates": candidates, "goals": goals, "figures": figures}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=3, help="batches discarded before the window")
    parser.add_argument("--batches", type=int, default=8, help="batches in each timed window")
    parser.add_argument("--profile-samples", type=int, default=24,
                        help="samples timed stage by stage (one thread) for the profile")
    parser.add_argument("--only", help="comma-separated candidates (default: all)")
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    if args.child == "profile":
        profile = {"samples": args.profile_samples, "bridge-torchvision": profile_bridge(args.profile_samples)}
        if not _lightly_version().startswith("unavailable"):
            profile["lightly"] = profile_lightly(args.profile_samples)
        print(json.dumps(profile))
        sys.stdout.flush()
        os._exit(0)
    if args.child:
        print(json.dumps(child(args.child, batch_size=args.batch_size, warmup=args.warmup, batches=args.batches)))
        sys.stdout.flush()
        os._exit(0)  # loaders' worker threads must not hold the exit
    if not DATA.is_dir():
        raise SystemExit(f"{DATA} is missing: generate the sample images first (python -m dali_bridge sample-data "
                         f"data/sample --images 2000 --classes 10 --seed 0)")
    names = args.only.split(",") if args.only else list(CANDIDATES)
    unknown = [name for name in names if name not in CANDIDATES]
    if unknown:
        raise SystemExit(f"--only: unknown candidate(s) {', '.join(unknown)}; choose from {', '.join(CANDIDATES)}")
    if "lightly" in names and _lightly_version().startswith("unavailable"):
        raise SystemExit("lightly is not installed, and this benchmark compares against its DINOTransform: "
                         "pip install lightly, or leave it out with --only")
    machine, start = machine_description(), time.perf_counter()
    rounds = []
    for number in range(args.rounds):
        print(f"round {number + 1}/{args.rounds}", flush=True)
        rounds.append({name: _run_child(name, args) for name in names})
    profile = _profile(args)
    machine["loadavg_at_end"] = loadavg()
    report = {"format": SSL_VIEWS_FORMAT, "command": "python benchmarks/ssl_views.py " + " ".join(sys.argv[1:]),
              "pipeline": "dino_train", "data": {"root": "data/sample", "images": 2000},
              "settings": {"batch_size": args.batch_size, "warmup": args.warmup, "batches": args.batches,
                           "rounds": args.rounds},
              "machine": {**machine, "versions": {**machine["versions"], "lightly": _lightly_version()}},
              "run_s": time.perf_counter() - start, "rounds": rounds, **summarise(rounds),
              "profile": profile}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


def _lightly_version() -> str:
    try:
        import lightly
        return lightly.__version__
    except Exception as exc:
        return f"unavailable ({type(exc).__name__})"


if __name__ == "__main__":
    raise SystemExit(main())
