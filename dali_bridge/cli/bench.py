"""The ``dali-bridge bench`` and ``dali-bridge compare`` commands: their argument lists, epilogs and
reports."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from .commands import EXIT_FAILED, backend_list, load_with_options, check_writable_file, check_writable_folder
from ..spec.overrides import parse_override


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"dali-bridge: {what} must be comma-separated integers, found {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"dali-bridge: {what} must be integers >= 1, found {text!r}")
    return values


def cmd_bench(args: argparse.Namespace) -> int:
    from ..bench.plot import plot_report
    from ..bench.report import format_report
    from ..bench.results import REFERENCE_NAMES
    from ..bench.runner import data_overrides, default_baselines, run_bench
    from ..loader.select import BackendUnavailable, unavailable_reason

    backends = [] if args.backends == "none" else backend_list(args.backends)
    threads = _int_list(args.threads, "--threads") if args.threads else [_default_threads()]
    for option in ("batches", "warmup", "repeat", "rounds"):
        if getattr(args, option) < 1:
            raise SystemExit(f"dali-bridge: --{option} must be at least 1, found {getattr(args, option)}")
    if args.model_ms is not None and args.model_ms <= 0:
        raise SystemExit(f"dali-bridge: --model-ms must be a positive number of milliseconds, found {args.model_ms}")
    for name in backends:  # an explicitly named backend that cannot run here is an error, not a skip
        reason = unavailable_reason(name) if name != "auto" else None
        if reason and args.backends != "available":
            raise BackendUnavailable(f"backend '{name}' cannot run here: {reason}")
    if args.baselines == "default":
        baselines = default_baselines(backends)
    elif args.baselines == "none":
        baselines = []
    else:
        baselines = [n.strip() for n in args.baselines.split(",") if n.strip()]
        unknown = [n for n in baselines if n not in REFERENCE_NAMES]
        if unknown:
            raise SystemExit(f"dali-bridge: unknown baseline(s) {', '.join(unknown)} "
                             f"(expected {', '.join(REFERENCE_NAMES)}, default or none)")
    if args.json:
        check_writable_file(args.json, "--json")
    if args.plot:
        check_writable_file(args.plot, "--plot")
    overrides = dict(parse_override(text) for text in (args.set or []))
    overrides.update(data_overrides(args.data))  # default: the pipeline's own source
    report = run_bench(args.file, backends=backends, baselines=baselines, threads=threads,
                             batches=args.batches, warmup=args.warmup, repeat=args.repeat, rounds=args.rounds,
                             model_ms=args.model_ms, overrides=overrides, progress=not args.quiet)
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report.as_dict(), indent=2))
    if args.plot:
        plot_report(report, args.plot)
    return EXIT_FAILED if any("error" in row for row in report.rows) else 0


def _default_threads() -> int:
    from ..backends.base import default_workers
    return default_workers()


EPILOG_BENCH = """examples:
  dali-bridge bench pipelines/imagenet_train.yaml                       # the pipeline's source, all cores
  dali-bridge bench pipelines/imagenet_train.yaml --threads 1,2 --json out.json --plot out.png
  dali-bridge bench pipelines/imagenet_train.yaml --data /data/train --model-ms 80
  dali-bridge bench my.yaml --data sample --batches 16 --repeat 4 --rounds 3   # generated set, stable figures
columns: img/s median over windows (spread = (max-min)/median); MP/s = megapixels of source images
decoded per second; CPU ms/img = CPU time of the process tree (threads and workers) per image;
peak RSS of the process tree; PSS (shared pages split) after warm-up and windows; first batch s = construction to the
first batch; % of ceiling = img/s over read+decode-only at the same thread count; x hand-written =
img/s over the hand-written loader of the same backend family at the same thread count.
A warning follows the table when windows hold too few images (< 256) or img/s varies by more
than 25 % between windows; it names the flags that give a stable figure.
exit status: 0 every candidate ran, 1 some failed (listed after the table)
"""


EPILOG_COMPARE = """examples:
  dali-bridge compare pipelines/imagenet_val.yaml --data data/sample
  dali-bridge compare my.yaml --backends dali-cpu,torchvision --batches 20 --save compare-out/
  dali-bridge compare my.yaml --set batch_size=16 --max-delta 2
Samples are matched by index (order, labels and index must be identical); float images are mapped
back to uint8 levels through the pipeline's mean/std before comparing. Default bounds: max 1 level,
mean 0.25 level (plus one float16 step for float16 outputs); with the GPU backend's nvJPEG decoder
max 4, mean 0.5.
exit status: 0 PASS, 1 FAIL, 2 invalid pipeline or arguments, 3 a backend cannot run here
"""


def cmd_compare(args: argparse.Namespace) -> int:
    from dataclasses import asdict, replace

    from ..tools.compare import MAX_SAVED_WORST, compare, default_pair
    from ..tools.compare_bounds import default_bounds

    if args.backends == "default":
        backends = list(default_pair())
    else:
        backends = [name.strip() for name in args.backends.split(",") if name.strip()]
        unknown = [name for name in backends if name not in ("dali", "dali-cpu", "torchvision")]
        if len(backends) != 2 or unknown:
            raise SystemExit(f"dali-bridge: --backends takes two of dali, dali-cpu, torchvision separated by a "
                             f"comma, found {args.backends!r}")
    if args.batches < 0 or args.worst < 0:
        raise SystemExit("dali-bridge: --batches and --worst must be >= 0")
    if args.save:
        if args.worst > MAX_SAVED_WORST:
            raise SystemExit(f"dali-bridge: --worst {args.worst} with --save: at most {MAX_SAVED_WORST} samples "
                             f"are saved (each is held as pixels until the end); pass --worst {MAX_SAVED_WORST} "
                             f"or less")
        check_writable_folder(args.save, "--save")
    if args.json:
        check_writable_file(args.json, "--json")
    spec = load_with_options(args.file, args)
    bounds = default_bounds(spec, backends)
    if args.max_delta is not None or args.mean_delta is not None:
        bounds = replace(bounds, max_abs=bounds.max_abs if args.max_delta is None else args.max_delta,
                         mean_abs=bounds.mean_abs if args.mean_delta is None else args.mean_delta,
                         reason="set on the command line")
    result = compare(spec, backends, batches=args.batches or None, bounds=bounds, keep_worst=args.worst,
                     save_dir=args.save, progress=not args.quiet)
    print(result.format())
    if args.json:
        data = asdict(result)
        data["passed"] = result.passed
        Path(args.json).write_text(json.dumps(data, indent=2, default=str))
    return 0 if result.passed else EXIT_FAILED
