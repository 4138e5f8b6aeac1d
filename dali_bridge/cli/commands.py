"""The ``dali-bridge`` commands but bench and compare (validate, show, run, sample-data, doctor, convert,
verify, from-torchvision, from-timm) and what every command shares: the exit statuses, the spec
options (--set, --data), the checks of a path to write."""
from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable

from ..spec.overrides import parse_overrides
from ..spec.pipeline import PipelineSpec, load_spec, missing_source_warnings
from ..spec.problems import MISSING_SOURCE, SpecError
from ..util.wording import plural

log = logging.getLogger("dali_bridge")

EXIT_FAILED = 1      # the job ran and failed (a bad sample, a comparison outside its bounds)
EXIT_INVALID = 2     # invalid pipeline, source or arguments
EXIT_UNAVAILABLE = 3  # an explicitly requested backend cannot run here
EXIT_BROKEN_PIPE = 141  # stdout closed by the reader (`| head`): what a shell reports for SIGPIPE


class UsageError(SystemExit):
    """A command-line argument found invalid after parsing: its message was printed; exit status 2,
    as argparse's own errors. ``str()`` is the message."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = EXIT_INVALID

EPILOG_RUN = """examples:
  dali-bridge run pipelines/imagenet_train.yaml
  dali-bridge run pipelines/*.yaml --backends dali-cpu,torchvision --data data/sample
  dali-bridge run pipelines/imagenet_val.yaml --set batch_size=32 --batches 10
"""


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The --set flags (and --data) as overrides whose problems name the flag."""
    overrides = parse_overrides(args.set or [])
    if getattr(args, "data", None):
        overrides["source"] = {"type": "folder", "root": str(Path(args.data).resolve())}
    return overrides


def load_with_options(path: str, args: argparse.Namespace) -> PipelineSpec:
    return load_spec(path, _overrides(args))


def add_spec_options(parser: argparse.ArgumentParser, data: bool = True) -> None:
    parser.add_argument("--set", action="append", metavar="KEY=VALUE",
                        help="override a key by dotted path, value read as YAML (repeatable), "
                             "e.g. --set batch_size=32 --set source.root=/data/train")
    if data:
        parser.add_argument("--data", metavar="DIR",
                            help="image folder to read instead of the pipeline's source (ImageFolder layout)")


# ---- commands

def cmd_validate(args: argparse.Namespace) -> int:
    failed = 0
    for path in args.files:
        try:
            spec = load_spec(path, _overrides(args), check_sources=not args.no_source_check)
        except SpecError as exc:
            print(exc, file=sys.stderr)
            if any(problem.kind == MISSING_SOURCE for problem in exc.problems):
                print("  (validating away from the data? --no-source-check makes a missing source a warning)",
                      file=sys.stderr)
            failed += 1
        except OSError as exc:
            print(f"{path}: cannot read: {exc.strerror or exc}", file=sys.stderr)
            failed += 1
        else:
            print(f"{path}: ok ({spec.name}: {plural(len(spec.ops), 'op')}, batch {spec.batch_size})")
            if args.no_source_check:
                for warning in missing_source_warnings(spec, path, _overrides(args)):
                    print(f"warning: {warning}", file=sys.stderr)
    return EXIT_INVALID if failed else 0


def cmd_show(args: argparse.Namespace) -> int:
    from ..loader.select import BACKEND_NAMES, choose_backend, unavailable_reason
    from ..loader.placement import placement
    from ..pipeline.plan import build_plan, unsupported_ops
    from ..bench.timing import format_table

    spec = load_with_options(args.file, args)
    print(f"# resolved pipeline: {args.file}")
    print(_resolved_yaml(spec))
    plan = build_plan(spec)
    print(f"# output per batch: {plan.output_shape(spec.batch_size)} {plan.finish.dtype} ({plan.finish.layout})")
    from ..ops.registry import op_origin
    for index, op in enumerate(spec.ops):
        if op_origin(op.name) is not None:
            print(f"# ops[{index}] {op.name}: from {op_origin(op.name)}")
    try:
        choice = choose_backend(spec.backend)
        print(f"# backend {spec.backend!r} picks {choice.backend} here: {choice.reason}")
    except Exception as exc:
        print(f"# backend {spec.backend!r}: {exc}")
    from ..backends.base import default_workers
    from ..backends.dali.plan import dali_plan
    from ..backends.device import describe_dali_threads
    host_tail = bool(dali_plan(plan).torch_tail)
    threads = describe_dali_threads(spec.loader.workers, auto_cores=default_workers(), host_tail=host_tail,
                                    tail_in=spec.loader.executor)
    print(f"# {threads}")
    for backend in BACKEND_NAMES:
        missing = unsupported_ops(spec, backend)
        reason = unavailable_reason(backend)
        status = "available here" if reason is None else f"not available here: {reason}"
        print(f"\n## {backend} ({status})")
        if missing:
            print("  cannot run this pipeline: " + "; ".join(f"ops[{i}] {n} (runs on {', '.join(b)})"
                                                        for i, n, b in missing))
            continue
        rows = [{"stage": s.stage, "implementation": s.implementation, "device": s.device}
                for s in placement(plan, backend, cuda=_cuda(), executor=spec.loader.executor)]
        print(format_table(rows, [("stage", "stage"), ("device", "device"), ("implementation", "implementation")]))
        if backend == "torchvision":
            from ..pipeline.region_decode import describe_decode
            print(f"  decoder here: {describe_decode(plan)}")
    if args.order:
        _show_order(spec)
    return 0


def _show_order(spec) -> None:
    """How the epoch order mixes classes: the shard-aware order at a few windows against a global shuffle."""
    from ..pipeline.sampling import epoch_order
    from ..data.shards.order import quality_report
    from ..data.sources.local import list_source
    from ..bench.timing import format_table

    listing = list_source(spec.source)
    chosen = spec.loader.shuffle_window if spec.loader.shuffle == "shards" else None
    print(f"\n## order quality (epoch 0, batch {spec.batch_size}, {len(listing)} samples)")
    if listing.shards is None:
        print("  this source has no shards: only the global shuffle applies")
        return
    rows = quality_report(listing.labels, listing.shards.shard, spec.batch_size, spec.seed, [1, 4, 16, 64], chosen,
                          global_order=epoch_order(len(listing.labels), spec.seed, 0, True))
    print(format_table(rows, [("order", "order"), ("window", "window (shards)"), ("classes", "classes/batch"),
                              ("entropy", "label entropy (bits)"), ("share", "of global")]))


def _resolved_yaml(spec: PipelineSpec) -> str:
    """The spec as YAML with ``workers: auto`` kept as the docs write it (the spec stores None), and a
    comment with the figure auto resolves to here; the text still loads back to the same spec."""
    import yaml

    from ..backends.base import worker_share

    data = spec.to_dict()
    if spec.loader.workers is not None:
        return spec.to_yaml()
    data["loader"]["workers"] = "auto"
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
    share = worker_share()
    return text + f"# loader.workers: auto ({share.workers}): {share.reason()}\n"


def _cuda() -> bool:
    from ..loader.select import probe
    return probe().cuda_devices > 0


def backend_list(text: str) -> list[str]:
    from ..loader.select import BACKEND_NAMES, available_backends

    if text == "available":
        return available_backends()
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in BACKEND_NAMES + ("auto",)]
    if unknown:
        hints = [f"did you mean '{match[0]}' for '{name}'?" for name in unknown
                 if (match := difflib.get_close_matches(name, BACKEND_NAMES + ("auto", "available"), n=1))]
        raise SystemExit(f"dali-bridge: unknown backend(s) {', '.join(unknown)} "
                         f"(expected {', '.join(BACKEND_NAMES)}, auto or available)" + "".join(f"; {h}" for h in hints))
    return names


RUN_COLUMNS = [("pipeline", "pipeline"), ("backend", "backend"), ("images_per_second", "images/s"),
               ("batches", "batches"), ("images", "images"), ("first_batch_seconds", "first batch s"),
               ("shape", "output shape"), ("dtype", "dtype"), ("device", "device"), ("skipped", "skipped")]


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


def check_writable_file(path: str, flag: str) -> None:
    """Refuse (exit 2) an output file that cannot be written, before the work that fills it: it is
    opened for appending (created if absent, then removed), so a missing folder, a directory in its
    place or a read-only file system are found now rather than after a long run."""
    existed = os.path.lexists(path)
    try:  # without blocking: a FIFO in the file's place is refused, not waited on
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, 0o666))
    except OSError as exc:
        raise SystemExit(f"dali-bridge: {flag} {path}: cannot write it: {exc.strerror or exc}") from None
    if not existed:
        os.remove(path)


def check_writable_folder(path: str, flag: str) -> None:
    """Refuse (exit 2) an output folder that cannot be made or written, before the work that fills it:
    the folder, or the nearest existing one above it, must take a new file."""
    import tempfile

    folder = Path(path).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise SystemExit(f"dali-bridge: {flag} {path}: {folder} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise SystemExit(f"dali-bridge: {flag} {path}: cannot write in {folder}: {exc.strerror or exc}") from None


def _run_one(spec: PipelineSpec, backend: str, args: argparse.Namespace) -> dict[str, Any]:
    """One epoch (or ``--batches``) of ``spec`` on ``backend``: the table row."""
    from ..loader.loader import build_loader
    from ..bench.timing import measure_epoch

    loader = build_loader(spec, backend)
    try:
        return measure_epoch(loader, max_batches=args.batches, progress=not args.quiet).as_dict()
    finally:
        loader.close()


def cmd_sample_data(args: argparse.Namespace) -> int:
    from ..util.progress import progress as progress_bar
    from ..data.sources.synthetic import ensure_sample_data, generate_sample_data

    with progress_bar(total=args.images, unit="image", description=f"sample-data {args.dir}",
                      enabled=not args.quiet) as bar:
        def progress(done: int, total: int) -> None:
            bar.update(done - bar.n)

        generate = ensure_sample_data if args.if_absent else generate_sample_data
        extra = {} if args.if_absent else {"overwrite": args.overwrite}
        info = generate(args.dir, images=args.images, classes=args.classes, seed=args.seed, progress=progress, **extra)
    print(f"{info.root}: {plural(info.images, 'image')} in {plural(info.classes, 'class')} (seed {info.seed}, "
          f"{info.bytes_total / 2**20:.1f} MiB)")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..tools.doctor import format_report, report

    info = report()
    print(json.dumps(info, indent=2) if args.json else format_report(info))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from ..tools.convert import convert
    from ..tools.convert_staging import ConvertError
    from ..util.quoting import safe_name
    from ..spec.model import DEFAULT_EXTENSIONS

    extensions = tuple("." + e.strip().lstrip(".").lower() for e in args.extensions.split(",")) \
        if args.extensions else DEFAULT_EXTENSIONS
    try:
        result = convert(args.source, args.out_pattern, shard_size=args.shard_size, overwrite=args.overwrite,
                         progress=not args.quiet, extensions=extensions)
    except ConvertError as exc:
        print(f"dali-bridge convert: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except OSError as exc:  # e.g. the output folder cannot be made: before anything is written
        print(f"dali-bridge convert: {safe_name(exc.filename or args.out_pattern)}: {exc.strerror or exc}",
              file=sys.stderr)
        return EXIT_INVALID
    print(f"wrote {len(result.shards)} shard(s), {result.samples} samples, {result.bytes_written / 2**20:.1f} MiB "
          f"in {result.seconds:.1f} s; DALI index files beside them")
    print(f"manifest: {result.manifest}")
    if result.skipped:
        print(result.describe_skipped(), file=sys.stderr)
    print(f"pipeline source:\n  source: {{type: webdataset, shards: \"{result.pattern}\"}}")
    return 0


def _print_recipe(make: Callable[[], PipelineSpec], origin: str) -> int:
    """A converted pipeline as YAML on stdout, its notes on stderr; a refusal: every problem, exit 2."""
    import warnings

    from ..errors import RecipeError
    from ..recipes.from_torchvision import RecipeWarning

    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always", RecipeWarning)
        try:
            spec = make()
        except RecipeError as exc:
            print(exc, file=sys.stderr)
            return EXIT_INVALID
    for note in notes:
        print(f"note: {note.message}", file=sys.stderr)
    print(f"# {origin}\n{spec.to_yaml()}", end="")
    return 0


def cmd_from_torchvision(args: argparse.Namespace) -> int:
    from ..recipes.from_torchvision import from_torchvision
    from ..recipes.importing import import_transform

    def make() -> PipelineSpec:
        return from_torchvision(import_transform(args.reference), source=args.source, batch_size=args.batch_size,
                                name=args.name, overrides=parse_overrides(args.set or []))

    return _print_recipe(make, f"dali-bridge from-torchvision {args.reference}")


def cmd_from_timm(args: argparse.Namespace) -> int:
    from ..recipes.from_timm import from_timm

    def make() -> PipelineSpec:
        return from_timm(args.timm_args, source=args.source, batch_size=args.batch_size,
                         crop_interpolation=args.crop_interpolation, name=args.name,
                         overrides=parse_overrides(args.set or []))

    return _print_recipe(make, "dali-bridge from-timm -- " + " ".join(args.timm_args))


def cmd_verify(args: argparse.Namespace) -> int:
    from ..tools.convert import verify_shards
    from ..data.shards.tar import manifest_path

    failed = False
    for target in args.targets:
        manifest = target if target.endswith(".json") else manifest_path(target)
        try:
            problems = verify_shards(manifest, progress=not args.quiet)
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            print(f"dali-bridge verify: {manifest}: not a dali-bridge shard manifest ({exc})", file=sys.stderr)
            return EXIT_INVALID
        for problem in problems:
            print(problem)  # "<shard>: <what differs>"
        print(f"{manifest}: " + (f"{len(problems)} file(s) missing or different" if problems
                                 else "every shard matches its recorded size and sha256, every index its sha256"))
        failed = failed or bool(problems)
    return EXIT_FAILED if failed else 0
