"""``dali-bridge run``: run pipelines for an epoch on one or more backends and print a table of their speed."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..spec.pipeline import PipelineSpec
from ..spec.problems import SpecError
from .options import (EXIT_FAILED, EXIT_INVALID, EXIT_UNAVAILABLE, load_with_options,
                      add_spec_options, backend_list, check_writable_file, AddCommand)
from ..util.messages import package_log

log = package_log()


EPILOG_RUN = """examples:
  dali-bridge run imagenet_train --data DIR         # a shipped pipeline by name (dali-bridge pipelines)
  dali-bridge run pipelines/imagenet_train.yaml
  dali-bridge run pipelines/*.yaml --backends dali-cpu,torchvision --data data/sample
  dali-bridge run pipelines/imagenet_val.yaml --set batch_size=32 --batches 10
"""


RUN_COLUMNS = [("pipeline", "pipeline"), ("backend", "backend"), ("images_per_second", "images/s"),
               ("batches", "batches"), ("images", "images"), ("first_batch_seconds", "first batch s"),
               ("shape", "output shape"), ("dtype", "dtype"), ("device", "device"), ("skipped", "skipped")]


def add_parser(add: AddCommand) -> None:
    p = add("run", cmd_run, "Iterate pipelines for one epoch on each backend and print a table "
                            "(images/s, batches, output shape/dtype/device).", EPILOG_RUN)
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--backends", default="available",
                   help="comma-separated backends (dali, dali-cpu, torchvision, auto) or 'available' "
                        "for every backend this host can run (default: available)")
    p.add_argument("--batches", type=int, default=None, help="stop each run after N batches (default: one epoch)")
    p.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_spec_options(p)


def cmd_run(args: argparse.Namespace) -> int:
    from ..errors import SampleError
    from ..util.quoting import safe_name
    from ..bench.timing import format_table

    backends = backend_list(args.backends)
    if args.batches is not None and args.batches < 1:
        raise SystemExit(f"dali-bridge: --batches must be at least 1, found {args.batches} "
                         f"(leave it out for one whole epoch)")
    if args.json:
        check_writable_file(args.json, "--json")
    specs = [(path, load_with_options(path, args)) for path in args.files]  # every file valid before any work
    rows: list[dict[str, Any]] = []
    codes: list[int] = []
    errors: list[Exception] = []
    for path, spec in specs:
        for backend in backends:
            try:
                rows.append(_run_one(spec, backend, args))
            except Exception as exc:
                # One failure must not hide the other pipelines' and backends' figures: say where it
                # stopped, keep its row, carry on.
                errors.append(exc)
                codes.append(_report_run_failure(exc, f"{safe_name(path)} ({safe_name(spec.name)}) on backend "
                                                      f"{backend}"))
                rows.append({"pipeline": spec.name, "backend": backend, "error": str(exc)})
    failed = [row for row in rows if "error" in row]
    columns = RUN_COLUMNS + ([("error", "error")] if failed else [])
    shown = [{key: safe_name(value) if key in ("pipeline", "error") else value for key, value in row.items()}
             for row in rows]
    print(format_table(shown, columns))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    bad_samples = sum(isinstance(exc, SampleError) for exc in errors)
    if bad_samples:
        print(f"dali-bridge run: {bad_samples} of {len(rows)} run(s) stopped at a bad sample (above); "
              f"rerun with --set loader.on_error=skip to skip and count them", file=sys.stderr)
    if len(failed) > bad_samples:
        print(f"dali-bridge run: {len(failed) - bad_samples} of {len(rows)} run(s) failed (above)", file=sys.stderr)
    return max(codes, default=0)


def _report_run_failure(exc: Exception, where: str) -> int:
    """Print why one run of ``dali-bridge run`` stopped; its exit status (as ``main`` maps the error)."""
    from ..loader.select import BackendUnavailable
    from ..errors import SampleError
    from ..errors import SourceError

    if isinstance(exc, SampleError):
        print(f"dali-bridge run: {where} stopped at a bad sample: {exc}\n"
              f"  to leave bad samples out and count them: --set loader.on_error=skip", file=sys.stderr)
        return EXIT_FAILED
    print(f"dali-bridge run: {where} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
    log.info("the failure in full:", exc_info=exc)  # -v: the traceback, for a report
    if isinstance(exc, BackendUnavailable):
        return EXIT_UNAVAILABLE
    return EXIT_INVALID if isinstance(exc, (SpecError, SourceError)) else EXIT_FAILED


def _run_one(spec: PipelineSpec, backend: str, args: argparse.Namespace) -> dict[str, Any]:
    """One epoch (or ``--batches``) of ``spec`` on ``backend``: the table row."""
    from ..loader.loader import build_loader
    from ..bench.timing import measure_epoch

    loader = build_loader(spec, backend)
    try:
        return measure_epoch(loader, max_batches=args.batches, progress=not args.quiet).as_dict()
    finally:
        loader.close()
