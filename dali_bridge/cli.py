"""The ``dali-bridge`` command line: a thin layer over the library functions the tests call."""
from __future__ import annotations

import argparse
import difflib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from . import __version__
from .spec import (MISSING_SOURCE, PipelineSpec, SpecError, load_spec, missing_source_warnings, parse_override,
                   parse_overrides)
from .wording import plural

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


def _load(path: str, args: argparse.Namespace) -> PipelineSpec:
    return load_spec(path, _overrides(args))


def _add_spec_options(parser: argparse.ArgumentParser, data: bool = True) -> None:
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
    from .backends.select import BACKEND_NAMES, choose_backend, unavailable_reason
    from .plan import build_plan, placement, unsupported_ops
    from .timing import format_table

    spec = _load(args.file, args)
    print(f"# resolved pipeline: {args.file}")
    print(_resolved_yaml(spec))
    plan = build_plan(spec)
    print(f"# output per batch: {plan.output_shape(spec.batch_size)} {plan.finish.dtype} ({plan.finish.layout})")
    from .ops.registry import op_origin
    for index, op in enumerate(spec.ops):
        if op_origin(op.name) is not None:
            print(f"# ops[{index}] {op.name}: from {op_origin(op.name)}")
    try:
        choice = choose_backend(spec.backend)
        print(f"# backend {spec.backend!r} picks {choice.backend} here: {choice.reason}")
    except Exception as exc:
        print(f"# backend {spec.backend!r}: {exc}")
    from .backends.base import default_workers
    from .backends.device import describe_dali_threads
    print(f"# {describe_dali_threads(spec.loader.workers, auto_cores=default_workers())}")
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
                for s in placement(plan, backend, cuda=_cuda())]
        print(format_table(rows, [("stage", "stage"), ("device", "device"), ("implementation", "implementation")]))
        if backend == "torchvision":
            from .region_decode import describe_decode
            print(f"  decoder here: {describe_decode(plan)}")
    if args.order:
        _show_order(spec)
    return 0


def _show_order(spec) -> None:
    """How the epoch order mixes classes: the shard-aware order at a few windows against a global shuffle."""
    from .shard_order import quality_report
    from .sources import list_source
    from .timing import format_table

    listing = list_source(spec.source)
    chosen = spec.loader.shuffle_window if spec.loader.shuffle == "shards" else None
    print(f"\n## order quality (epoch 0, batch {spec.batch_size}, {len(listing)} samples)")
    if listing.shards is None:
        print("  this source has no shards: only the global shuffle applies")
        return
    rows = quality_report(listing.labels, listing.shards.shard, spec.batch_size, spec.seed, [1, 4, 16, 64], chosen)
    print(format_table(rows, [("order", "order"), ("window", "window (shards)"), ("classes", "classes/batch"),
                              ("entropy", "label entropy (bits)"), ("share", "of global")]))


def _resolved_yaml(spec: PipelineSpec) -> str:
    """The spec as YAML with ``workers: auto`` kept as the docs write it (the spec stores None), and a
    comment with the figure auto resolves to here; the text still loads back to the same spec."""
    import yaml

    from .backends.base import worker_share

    data = spec.to_dict()
    if spec.loader.workers is not None:
        return spec.to_yaml()
    data["loader"]["workers"] = "auto"
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
    share = worker_share()
    return text + f"# loader.workers: auto ({share.workers}): {share.reason()}\n"


def _cuda() -> bool:
    from .backends.select import probe
    return probe().cuda_devices > 0


def _backend_list(text: str) -> list[str]:
    from .backends.select import BACKEND_NAMES, available_backends

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
    from .images import SampleError
    from .quoting import safe_name
    from .timing import format_table

    backends = _backend_list(args.backends)
    if args.batches is not None and args.batches < 1:
        raise SystemExit(f"dali-bridge: --batches must be at least 1, found {args.batches} "
                         f"(leave it out for one whole epoch)")
    if args.json:
        check_writable_file(args.json, "--json")
    specs = [(path, _load(path, args)) for path in args.files]  # every file valid before any work
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
    from .backends.select import BackendUnavailable
    from .images import SampleError
    from .sources import SourceError

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
    from .loader import build_loader
    from .timing import measure_epoch

    loader = build_loader(spec, backend)
    try:
        return measure_epoch(loader, max_batches=args.batches, progress=not args.quiet).as_dict()
    finally:
        loader.close()


def cmd_sample_data(args: argparse.Namespace) -> int:
    from .progress import progress as progress_bar
    from .synthetic import ensure_sample_data, generate_sample_data

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
    from .doctor import format_report, report

    info = report()
    print(json.dumps(info, indent=2) if args.json else format_report(info))
    return 0


def cmd_convert(args: argparse.Namespace) -> int:
    from .convert import ConvertError, convert
    from .quoting import safe_name
    from .spec import DEFAULT_EXTENSIONS

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

    from .recipes import RecipeError, RecipeWarning

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
    from .recipes import from_torchvision
    from .recipes.importing import import_transform

    def make() -> PipelineSpec:
        return from_torchvision(import_transform(args.reference), source=args.source, batch_size=args.batch_size,
                                name=args.name, overrides=parse_overrides(args.set or []))

    return _print_recipe(make, f"dali-bridge from-torchvision {args.reference}")


def cmd_from_timm(args: argparse.Namespace) -> int:
    from .recipes import from_timm

    def make() -> PipelineSpec:
        return from_timm(args.timm_args, source=args.source, batch_size=args.batch_size,
                         crop_interpolation=args.crop_interpolation, name=args.name,
                         overrides=parse_overrides(args.set or []))

    return _print_recipe(make, "dali-bridge from-timm -- " + " ".join(args.timm_args))


def cmd_verify(args: argparse.Namespace) -> int:
    from .convert import verify_shards
    from .shards import manifest_path

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
        print(f"{manifest}: " + (f"{len(problems)} shard(s) missing or different" if problems
                                 else "every shard matches its recorded size and sha256"))
        failed = failed or bool(problems)
    return EXIT_FAILED if failed else 0


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"dali-bridge: {what} must be comma-separated integers, found {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"dali-bridge: {what} must be integers >= 1, found {text!r}")
    return values


def cmd_bench(args: argparse.Namespace) -> int:
    from . import bench
    from .backends.select import BackendUnavailable, unavailable_reason

    backends = [] if args.backends == "none" else _backend_list(args.backends)
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
        baselines = bench.default_baselines(backends)
    elif args.baselines == "none":
        baselines = []
    else:
        baselines = [n.strip() for n in args.baselines.split(",") if n.strip()]
        unknown = [n for n in baselines if n not in bench.REFERENCE_NAMES]
        if unknown:
            raise SystemExit(f"dali-bridge: unknown baseline(s) {', '.join(unknown)} "
                             f"(expected {', '.join(bench.REFERENCE_NAMES)}, default or none)")
    if args.json:
        check_writable_file(args.json, "--json")
    if args.plot:
        check_writable_file(args.plot, "--plot")
    overrides = dict(parse_override(text) for text in (args.set or []))
    overrides.update(bench.data_overrides(args.data))  # default: the pipeline's own source
    report = bench.run_bench(args.file, backends=backends, baselines=baselines, threads=threads,
                             batches=args.batches, warmup=args.warmup, repeat=args.repeat, rounds=args.rounds,
                             model_ms=args.model_ms, overrides=overrides, progress=not args.quiet)
    print(bench.format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report.as_dict(), indent=2))
    if args.plot:
        bench.plot_report(report, args.plot)
    return EXIT_FAILED if any("error" in row for row in report.rows) else 0


def _default_threads() -> int:
    from .backends.base import default_workers
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

    from .compare import MAX_SAVED_WORST, compare, default_bounds, default_pair

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
    spec = _load(args.file, args)
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


# ---- parser

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dali-bridge",
        description="Run an image pipeline declared in YAML as a PyTorch loader on NVIDIA DALI (GPU) "
                    "or a torchvision CPU fallback.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run 'dali-bridge COMMAND --help' for each command's options.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every backend choice and skipped sample")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, func: Callable[[argparse.Namespace], int], help_text: str,
            epilog: str = "") -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=func)
        return p

    for add_command in (_add_validate_command, _add_show_command, _add_run_command,
                        _add_sample_data_command, _add_convert_command, _add_verify_command,
                        _add_doctor_command, _add_bench_command, _add_compare_command,
                        _add_from_torchvision_command, _add_from_timm_command):
        add_command(add)
    return parser


# One function per command: each receives build_parser's `add` (name, handler, help, epilog → subparser).
AddCommand = Callable[..., argparse.ArgumentParser]


def _add_validate_command(add: AddCommand) -> None:
    p = add("validate", cmd_validate, "Check pipeline files; print every problem with file:line:column.",
            "examples:\n  dali-bridge validate pipelines/*.yaml\n  dali-bridge validate my.yaml --set batch_size=32\n"
            "  dali-bridge validate my.yaml --no-source-check   # away from the data: missing sources only warn\n"
            "exit status: 0 all valid, 2 any invalid (a source path that does not exist included)")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--no-source-check", action="store_true",
                   help="a source folder, file list, shard or manifest that does not exist is a warning, not a problem "
                        "(for files validated away from their data)")
    _add_spec_options(p, data=False)


def _add_show_command(add: AddCommand) -> None:
    p = add("show", cmd_show, "Print the resolved pipeline (defaults filled in) and what each op becomes on "
                              "each backend, with the device it runs on.",
            "examples:\n  dali-bridge show pipelines/imagenet_train.yaml")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--order", action="store_true",
                   help="list the source and show how the order mixes classes per batch (loader.shuffle: shards "
                        "at several windows against a global shuffle)")
    _add_spec_options(p)


def _add_run_command(add: AddCommand) -> None:
    p = add("run", cmd_run, "Iterate pipelines for one epoch on each backend and print a table "
                            "(images/s, batches, output shape/dtype/device).", EPILOG_RUN)
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--backends", default="available",
                   help="comma-separated backends (dali, dali-cpu, torchvision, auto) or 'available' "
                        "for every backend this host can run (default: available)")
    p.add_argument("--batches", type=int, default=None, help="stop each run after N batches (default: one epoch)")
    p.add_argument("--json", metavar="OUT", help="also write the rows as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _add_spec_options(p)


def _add_sample_data_command(add: AddCommand) -> None:
    p = add("sample-data", cmd_sample_data, "Generate a natural-looking synthetic ImageFolder JPEG set.",
            "examples:\n  dali-bridge sample-data data/sample --images 2000 --classes 10 --seed 0\n"
            "  dali-bridge sample-data data/sample --if-absent   # no-op when the same set exists")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("--images", type=int, default=2000, help="number of images (default 2000)")
    p.add_argument("--classes", type=int, default=10, help="number of class folders (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seed; the same seed gives byte-identical files (default 0)")
    p.add_argument("--if-absent", action="store_true", help="do nothing when DIR already holds this sample set")
    p.add_argument("--overwrite", action="store_true", help="replace a previous sample set in DIR")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def _add_convert_command(add: AddCommand) -> None:
    p = add("convert", cmd_convert, "Pack an image folder (or a 'path label' file list, or Parquet files) into "
                                    "WebDataset tar shards "
                                    "without re-encoding, with DALI index files and a manifest.",
            "examples:\n  dali-bridge convert data/sample shards/train-%06d.tar --shard-size 1000\n"
            "  dali-bridge convert train_list.txt /data/shards/train-%06d.tar --overwrite\n"
            "  dali-bridge convert 'hf/data/train-*.parquet' shards/train-%06d.tar\n"
            "Samples keep the source's order; each is KEY.cls (label) + KEY.<ext> (the original bytes).")
    p.add_argument("source", metavar="SRC", help="ImageFolder root (class sub-folders), a file list, or Parquet "
                                                 "files (a .parquet path, glob or brace pattern)")
    p.add_argument("out_pattern", metavar="OUT_PATTERN", help="printf-style shard path, e.g. shards/train-%%06d.tar")
    p.add_argument("--shard-size", type=int, default=1000, metavar="N", help="samples per shard (default 1000)")
    p.add_argument("--extensions", metavar="EXTS",
                   help="comma-separated image extensions to pack (default .jpg,.jpeg,.png,.webp)")
    p.add_argument("--overwrite", action="store_true", help="replace existing shards, indexes and manifest")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def _add_verify_command(add: AddCommand) -> None:
    p = add("verify", cmd_verify, "Check shards written by 'convert' against their manifest: every shard present, "
                                  "with the recorded size and sha256.",
            "examples:\n  dali-bridge verify shards/train.manifest.json\n"
            "  dali-bridge verify 'shards/train-%06d.tar'   # the manifest beside a shard pattern\n"
            "exit status: 0 all match, 1 a shard is missing or differs, 2 no readable manifest")
    p.add_argument("targets", nargs="+", metavar="MANIFEST_OR_PATTERN")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")


def _add_doctor_command(add: AddCommand) -> None:
    p = add("doctor", cmd_doctor, "Print the environment that matters: versions, CUDA devices, which backend "
                                  "auto picks and why, recommended worker counts.",
            "examples:\n  dali-bridge doctor\n  dali-bridge doctor --json > host.json")
    p.add_argument("--json", action="store_true", help="print as JSON")


def _add_bench_command(add: AddCommand) -> None:
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


def _add_compare_command(add: AddCommand) -> None:
    p = add("compare", cmd_compare, "Run a pipeline on two backends over the same samples and check that their "
                                    "batches match: max and mean |difference| per output (images in uint8 levels), "
                                    "the worst samples, PASS/FAIL against the bounds.", EPILOG_COMPARE)
    p.add_argument("file", metavar="FILE")
    p.add_argument("--backends", default="default", metavar="A,B",
                   help="the two backends to compare (dali, dali-cpu, torchvision); default: dali,torchvision "
                        "where the GPU backend runs, else dali-cpu,torchvision")
    p.add_argument("--batches", type=int, default=5, metavar="N",
                   help="batches of the first epoch to compare (default 5; 0 = the whole epoch)")
    p.add_argument("--save", metavar="DIR",
                   help="write side-by-side PNGs of the worst samples (A | B | difference heat map) and "
                        "mean_delta.png, the mean difference per pixel position")
    p.add_argument("--worst", type=int, default=5, metavar="K",
                   help="worst samples to list, and to save with --save (default 5)")
    p.add_argument("--max-delta", type=float, default=None, metavar="LEVELS",
                   help="bound on max |difference| in uint8 levels (default 1; 4 with nvJPEG)")
    p.add_argument("--mean-delta", type=float, default=None, metavar="LEVELS",
                   help="bound on mean |difference| in uint8 levels (default 0.25; 0.5 with nvJPEG)")
    p.add_argument("--json", metavar="OUT", help="also write the result as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    _add_spec_options(p)


def _add_from_torchvision_command(add: AddCommand) -> None:
    p = add("from-torchvision", cmd_from_torchvision,
            "Write the pipeline file of a torchvision transforms.v2 Compose (v1 classes of the same names too).",
            "MODULE:ATTRIBUTE names a Compose (or an object holding one in .transforms, as torchvision's reference\n"
            "presets), or a function of no arguments returning one; the current folder is importable.\n"
            "examples:\n  dali-bridge from-torchvision my_transforms:train_transform --source data/train > train.yaml\n"
            "  dali-bridge from-torchvision my_transforms:make_eval --source data/val --set loader.shuffle=false\n"
            "exit status: 0 written, 2 a transform has no op (each is named, with the closest op)")
    p.add_argument("reference", metavar="MODULE:ATTRIBUTE")
    p.add_argument("--source", required=True, metavar="DIR", help="image folder (ImageFolder layout) to read")
    p.add_argument("--batch-size", type=int, default=32, help="images per batch (default 32, torchvision's train.py)")
    p.add_argument("--name", default="from-torchvision", help="the pipeline's name (default from-torchvision)")
    _add_spec_options(p, data=False)


def _add_from_timm_command(add: AddCommand) -> None:
    p = add("from-timm", cmd_from_timm, "Write the pipeline file of timm's training arguments (train.py's data and "
                                        "augmentation options), without timm.",
            "timm's arguments come after --.\n"
            "examples:\n  dali-bridge from-timm --source data/train --crop-interpolation bilinear -- \\\n"
            "      --aa rand-m9-mstd0.5-inc1 --reprob 0.25 --remode pixel --mixup 0.8 --cutmix 1.0 > timm.yaml\n"
            "exit status: 0 written, 2 an argument has no op yet (each is named, with what to do)")
    p.add_argument("timm_args", nargs="*", metavar="TIMM_ARGS")
    p.add_argument("--source", required=True, metavar="DIR", help="image folder (ImageFolder layout) to read")
    p.add_argument("--batch-size", type=int, default=None, help="images per batch (default: -b from the arguments, "
                                                                 "else train.py's 128)")
    p.add_argument("--crop-interpolation", choices=("bilinear", "bicubic"), default=None,
                   help="the crop's filter where timm's --train-interpolation is random (its default)")
    p.add_argument("--name", default="from-timm", help="the pipeline's name (default from-timm)")
    _add_spec_options(p, data=False)


def main(argv: Sequence[str] | None = None) -> int:
    from .backends.select import BackendUnavailable
    from .images import SampleError
    from .sources import SourceError

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    # Errors users can act on: one line (SpecError: every problem), no traceback.
    exit_codes = ((SpecError, EXIT_INVALID), (SourceError, EXIT_INVALID), (BackendUnavailable, EXIT_UNAVAILABLE),
                  (FileNotFoundError, EXIT_INVALID), (SampleError, EXIT_FAILED))
    try:
        code = args.func(args)
        sys.stdout.flush()  # here, not at exit, so a reader that went away is handled below
        return code
    except tuple(kind for kind, _ in exit_codes) as exc:
        if isinstance(exc, SpecError):
            print(exc, file=sys.stderr)
        elif isinstance(exc, FileNotFoundError):
            print(f"dali-bridge: {exc.filename}: no such file", file=sys.stderr)
        else:
            print(f"dali-bridge: {exc}", file=sys.stderr)
        return next(code for kind, code in exit_codes if isinstance(exc, kind))
    except SystemExit as exc:
        if isinstance(exc.code, str):  # a command refused its arguments: say why, exit 2 as argparse does
            print(exc.code, file=sys.stderr)
            raise UsageError(exc.code) from None
        raise
    except BrokenPipeError:
        # `dali-bridge show FILE | head`: the reader has what it wanted. Point stdout at /dev/null so
        # the interpreter's final flush does not print a second traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
