"""The ``dali-bridge`` command line: the parser (one function per command) and :func:`main`, the
entry point; the commands live in :mod:`dali_bridge.cli.commands` and :mod:`dali_bridge.cli.bench`,
a thin layer over the library functions the tests call."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Callable, Sequence

from .. import __version__
from .bench import EPILOG_BENCH, EPILOG_COMPARE, cmd_bench, cmd_compare
from .commands import (EPILOG_RUN, EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_INVALID, EXIT_UNAVAILABLE, UsageError,
    add_spec_options, cmd_convert, cmd_doctor, cmd_from_timm, cmd_from_torchvision, cmd_run, cmd_sample_data, cmd_show,
    cmd_validate, cmd_verify)
from ..spec.problems import SpecError


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
    add_spec_options(p, data=False)


def _add_show_command(add: AddCommand) -> None:
    p = add("show", cmd_show, "Print the resolved pipeline (defaults filled in) and what each op becomes on "
                              "each backend, with the device it runs on.",
            "examples:\n  dali-bridge show pipelines/imagenet_train.yaml")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--order", action="store_true",
                   help="list the source and show how the order mixes classes per batch (loader.shuffle: shards "
                        "at several windows against a global shuffle)")
    add_spec_options(p)


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
    add_spec_options(p)


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
                                  "with the recorded size and sha256, and every index with the recorded sha256.",
            "examples:\n  dali-bridge verify shards/train.manifest.json\n"
            "  dali-bridge verify 'shards/train-%06d.tar'   # the manifest beside a shard pattern\n"
            "exit status: 0 all match, 1 a shard or index is missing or differs, 2 no readable manifest")
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
    add_spec_options(p)


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
    add_spec_options(p, data=False)


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
    add_spec_options(p, data=False)


def main(argv: Sequence[str] | None = None) -> int:
    from ..loader.select import BackendUnavailable
    from ..errors import SampleError
    from ..errors import SourceError

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
