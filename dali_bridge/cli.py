"""The ``dali-bridge`` command line: a thin layer over the library functions the tests call."""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from .spec import PipelineSpec, SpecError, load_spec, parse_override

EXIT_FAILED = 1      # the job ran and failed (a bad sample, a comparison outside its bounds)
EXIT_INVALID = 2     # invalid pipeline, source or arguments
EXIT_UNAVAILABLE = 3  # an explicitly requested backend cannot run here

EPILOG_RUN = """examples:
  dali-bridge run pipelines/imagenet_train.yaml
  dali-bridge run pipelines/*.yaml --backends dali-cpu,torchvision --data data/sample
  dali-bridge run pipelines/imagenet_val.yaml --set batch_size=32 --batches 10
"""


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides = dict(parse_override(text) for text in (args.set or []))
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
            spec = _load(path, args)
        except SpecError as exc:
            print(exc, file=sys.stderr)
            failed += 1
        except OSError as exc:
            print(f"{path}: cannot read: {exc.strerror or exc}", file=sys.stderr)
            failed += 1
        else:
            print(f"{path}: ok ({spec.name}: {len(spec.ops)} ops, batch {spec.batch_size})")
    return EXIT_INVALID if failed else 0


def cmd_show(args: argparse.Namespace) -> int:
    from .backends.select import BACKEND_NAMES, choose_backend, unavailable_reason
    from .plan import build_plan, placement, unsupported_ops
    from .timing import format_table

    spec = _load(args.file, args)
    print(f"# resolved pipeline: {args.file}")
    print(spec.to_yaml())
    plan = build_plan(spec)
    print(f"# output per batch: {plan.output_shape(spec.batch_size)} {plan.finish.dtype} ({plan.finish.layout})")
    try:
        choice = choose_backend(spec.backend)
        print(f"# backend {spec.backend!r} picks {choice.backend} here: {choice.reason}")
    except Exception as exc:
        print(f"# backend {spec.backend!r}: {exc}")
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
    return 0


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
        raise SystemExit(f"dali-bridge: unknown backend(s) {', '.join(unknown)} "
                         f"(expected {', '.join(BACKEND_NAMES)}, auto or available)")
    return names


def cmd_run(args: argparse.Namespace) -> int:
    from .loader import build_loader
    from .timing import format_table, measure_epoch

    backends = _backend_list(args.backends)
    rows = []
    for path in args.files:
        spec = _load(path, args)
        for backend in backends:
            loader = build_loader(spec, backend)
            try:
                stats = measure_epoch(loader, max_batches=args.batches, progress=not args.quiet)
            finally:
                loader.close()
            rows.append(stats.as_dict())
    print(format_table(rows, [("pipeline", "pipeline"), ("backend", "backend"), ("images_per_second", "images/s"),
                              ("batches", "batches"), ("images", "images"), ("first_batch_seconds", "first batch s"),
                              ("shape", "output shape"), ("dtype", "dtype"), ("device", "device"),
                              ("skipped", "skipped")]))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


def cmd_sample_data(args: argparse.Namespace) -> int:
    from .samples import ensure_sample_data, generate_sample_data

    def progress(done: int, total: int) -> None:
        if not args.quiet and sys.stderr.isatty():
            print(f"\r{done}/{total} images", end="" if done < total else "\n", file=sys.stderr, flush=True)

    if args.if_absent:
        info = ensure_sample_data(args.dir, images=args.images, classes=args.classes, seed=args.seed)
    else:
        info = generate_sample_data(args.dir, images=args.images, classes=args.classes, seed=args.seed,
                                    overwrite=args.overwrite, progress=progress)
    print(f"{info.root}: {info.images} images in {info.classes} classes (seed {info.seed}, "
          f"{info.bytes_total / 2**20:.1f} MiB)")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import format_report, report

    info = report()
    print(json.dumps(info, indent=2) if args.json else format_report(info))
    return 0


# ---- parser

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dali-bridge",
        description="Run an image pipeline declared in YAML as a PyTorch loader on NVIDIA DALI (GPU) "
                    "or a torchvision CPU fallback.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run 'dali-bridge COMMAND --help' for each command's options.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every backend choice and skipped sample")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, func: Callable[[argparse.Namespace], int], help_text: str, epilog: str = "") -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=func)
        return p

    p = add("validate", cmd_validate, "Check pipeline files; print every problem with file:line:column.",
            "examples:\n  dali-bridge validate pipelines/*.yaml\n  dali-bridge validate my.yaml --set batch_size=32\n"
            "exit status: 0 all valid, 2 any invalid")
    p.add_argument("files", nargs="+", metavar="FILE")
    _add_spec_options(p, data=False)

    p = add("show", cmd_show, "Print the resolved pipeline (defaults filled in) and what each op becomes on "
                              "each backend, with the device it runs on.",
            "examples:\n  dali-bridge show pipelines/imagenet_train.yaml")
    p.add_argument("file", metavar="FILE")
    _add_spec_options(p)

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

    p = add("doctor", cmd_doctor, "Print the environment that matters: versions, CUDA devices, which backend "
                                  "auto picks and why, recommended worker counts.")
    p.add_argument("--json", action="store_true", help="print as JSON")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from .backends.select import BackendUnavailable
    from .images import SampleError
    from .sources import SourceError

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except SpecError as exc:
        print(exc, file=sys.stderr)
        return EXIT_INVALID
    except SourceError as exc:
        print(f"dali-bridge: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except BackendUnavailable as exc:
        print(f"dali-bridge: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except FileNotFoundError as exc:
        print(f"dali-bridge: {exc.filename}: no such file", file=sys.stderr)
        return EXIT_INVALID
    except SampleError as exc:
        print(f"dali-bridge: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
