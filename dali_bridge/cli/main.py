"""The ``dali-bridge`` command line: the parser, built from one module per command (each holds its
``add_parser`` beside its handler), and :func:`main`, the entry point."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from typing import Callable, Sequence

from . import bench, compare, convert, doctor, init, pipelines, recipes, run, sample_data, show, validate, verify
from .. import __version__
from ..spec.problems import SpecError
from ..util.messages import scrubbed_output
from ..util.urls import redact
from ..spec.shipped import PipelineNotFound
from .options import EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_INVALID, EXIT_UNAVAILABLE, UsageError


# ---- parser

COMMANDS = (validate, show, run, pipelines, init, sample_data, convert, verify, doctor, bench, compare, recipes)


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

    for command in COMMANDS:
        command.add_parser(add)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; everything it prints, logs or shows as a warning or an error passes through
    the scrubber (:mod:`dali_bridge.util.messages`): no credential reaches the terminal or a log."""
    with scrubbed_output():
        return _run(argv)


def _run(argv: Sequence[str] | None) -> int:
    from ..loader.select import BackendUnavailable
    from ..errors import SampleError
    from ..errors import SourceError

    args = build_parser().parse_args(recipes.timm_arguments_apart(list(sys.argv[1:] if argv is None else argv)))
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
        if isinstance(exc, (SpecError, PipelineNotFound)):
            print(exc, file=sys.stderr)
        elif isinstance(exc, FileNotFoundError):
            print(f"dali-bridge: {exc.filename}: no such file", file=sys.stderr)
        else:
            print(f"dali-bridge: {exc}", file=sys.stderr)
        return next(code for kind, code in exit_codes if isinstance(exc, kind))
    except SystemExit as exc:
        if isinstance(exc.code, str):  # a command refused its arguments: say why, exit 2 as argparse does
            print(exc.code, file=sys.stderr)
            raise UsageError(redact(exc.code)) from None
        raise
    except BrokenPipeError:
        # `dali-bridge show FILE | head`: the reader has what it wanted. Point stdout at /dev/null so
        # the interpreter's final flush does not print a second traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        return 130
    except Exception:  # a bug or a library's own error: its traceback as Python prints it, scrubbed
        traceback.print_exc(file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
