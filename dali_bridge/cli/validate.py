"""``dali-bridge validate``: check pipeline files; every problem with file:line:column."""
from __future__ import annotations

import argparse
import sys

from ..spec.pipeline import load_spec, missing_source_warnings
from ..spec.problems import MISSING_SOURCE
from ..spec.problems import SpecError
from ..util.wording import plural
from .options import EXIT_INVALID, AddCommand, add_spec_options, set_overrides


def add_parser(add: AddCommand) -> None:
    p = add("validate", cmd_validate, "Check pipeline files; print every problem with file:line:column.",
            "examples:\n  dali-bridge validate pipelines/*.yaml\n  dali-bridge validate my.yaml --set batch_size=32\n"
            "  dali-bridge validate my.yaml --no-source-check   # away from the data: missing sources only warn\n"
            "exit status: 0 all valid, 2 any invalid (a source path that does not exist included)")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--no-source-check", action="store_true",
                   help="a source folder, file list, shard or manifest that does not exist is a warning, not a problem "
                        "(for files validated away from their data)")
    add_spec_options(p, data=False)


def cmd_validate(args: argparse.Namespace) -> int:
    failed = 0
    for path in args.files:
        try:
            spec = load_spec(path, set_overrides(args), check_sources=not args.no_source_check)
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
                for warning in missing_source_warnings(spec, path, set_overrides(args)):
                    print(f"warning: {warning}", file=sys.stderr)
    return EXIT_INVALID if failed else 0
