"""``dali-bridge bench``: measure the bridge's backends against hand-written loaders and the decode ceiling."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..spec.overrides import parse_override
from .options import EXIT_FAILED, AddCommand, backend_list, check_writable_file


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


def add_parser(add: AddCommand) -> None:
    p = add("bench", cmd_bench, "Benchmark backends on the same samples against hand-written torchvision/DALI "
                                "loaders and the decode-only ceiling; median and spread over repeated windows.",
            EPILOG_BENCH)
    p.add_argument("file", metavar="FILE")
    p.add_argument("--data", metavar="DIR|sample",
                   help="image folder (ImageFolder layout) to read instead of the pipeline's source (default: "
                        "the pipeline's own source); 'sample': the generated sample set ./data/sample, made if "
                        "absent (write ./sample for a folder of that name)")
    p.add_argument("--backends", default="available",
                   help="comma-separated backends, 'available' or 'none' (default: available)")
    p.add_argument("--baselines", default="default",
                   help="comma-separated references: ceiling, torchvision, torchvision-pil, dali-cpu, dali, spdl, "
                        "spdl-torchvision (the spdl ones need the [bench] extra); 'none'; default: the ceiling "
                        "and the hand-written counterpart of each backend")
    p.add_argument("--threads", metavar="N[,N...]",
                   help="thread/worker counts to measure, e.g. 1,2 (default: the cores available)")
    p.add_argument("--batches", type=int, default=8, help="batches per timed window (default 8)")
    p.add_argument("--warmup", type=int, default=3, help="batches discarded before timing, first included (default 3)")
    p.add_argument("--repeat", type=int, default=4, help="timed windows per process (default 4)")
    p.add_argument("--rounds", type=int, default=1,
                   help="fresh processes per candidate, interleaved across candidates (default 1)")
    p.add_argument("--model-ms", type=float, default=None, metavar="T",
                   help="simulate a model step of T ms per batch and report the share of step time spent "
                        "waiting for data (measured, not computed)")
    p.add_argument("--json", metavar="OUT", help="write the machine, settings and results as JSON")
    p.add_argument("--plot", metavar="OUT.png", help="write a bar chart of images/s (PNG)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a pipeline key by dotted path (repeatable), e.g. --set batch_size=32")


def cmd_bench(args: argparse.Namespace) -> int:
    from ..bench.plot import plot_report
    from ..bench.report import format_report
    from ..bench.results import REFERENCE_NAMES
    from ..bench.runner import data_overrides, default_baselines, run_bench
    from ..spec.pipeline import load_spec
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
    overrides = dict(parse_override(text) for text in (args.set or []))
    overrides.update(data_overrides(args.data))  # default: the pipeline's own source
    if args.baselines == "default":
        baselines = default_baselines(backends, views=bool(load_spec(args.file, overrides).views))
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
    report = run_bench(args.file, backends=backends, baselines=baselines, threads=threads,
                             batches=args.batches, warmup=args.warmup, repeat=args.repeat, rounds=args.rounds,
                             model_ms=args.model_ms, overrides=overrides, progress=not args.quiet)
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report.as_dict(), indent=2))
    if args.plot:
        plot_report(report, args.plot)
    return EXIT_FAILED if any("error" in row for row in report.rows) else 0


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"dali-bridge: {what} must be comma-separated integers, found {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"dali-bridge: {what} must be integers >= 1, found {text!r}")
    return values


def _default_threads() -> int:
    from ..backends.base import default_workers
    return default_workers()
