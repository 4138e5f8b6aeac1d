"""``dali-bridge validate``: check pipeline files; every problem with file:line:column."""
from __future__ import annotations

import argparse
import sys

from ..spec.pipeline import PipelineSpec, load_spec, missing_source_warnings, positioned_source_problems
from ..spec.problems import MISSING_SOURCE
from ..spec.problems import SpecError
from ..util.wording import plural
from .options import EXIT_INVALID, AddCommand, add_spec_options, set_overrides


def add_parser(add: AddCommand) -> None:
    p = add("validate", cmd_validate, "Check pipeline files; print every problem with file:line:column.",
            "examples:\n  dali-bridge validate pipelines/*.yaml\n  dali-bridge validate my.yaml --set batch_size=32\n"
            "  dali-bridge validate my.yaml --no-source-check   # away from the data: missing sources only warn\n"
            "A source at a URL (s3://, gs://, http(s)://) is listed or HEADed as the loader reads it, within "
            "source.timeout.\n"
            "exit status: 0 all valid, 2 any invalid (a source that does not exist or cannot be reached included)")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--no-source-check", action="store_true",
                   help="a source folder, file list, shard or manifest that does not exist is a warning, not a "
                        "problem, and a source at a URL is not requested (for files validated away from their "
                        "data or the network)")
    add_spec_options(p, data=False)


def _load_checked(path: str, args: argparse.Namespace) -> PipelineSpec:
    """The pipeline at ``path``, its local source paths checked and, unless ``--no-source-check``,
    its source at a URL checked through the store as the loader reads it; :class:`SpecError`."""
    from ..data.sources.source_check import source_problems

    overrides = set_overrides(args)
    spec = load_spec(path, overrides, check_sources=not args.no_source_check)
    if not args.no_source_check:
        error = positioned_source_problems(path, source_problems(spec.source), overrides)
        if error is not None:
            raise error
    return spec


def cmd_validate(args: argparse.Namespace) -> int:
    failed = 0
    for path in args.files:
        try:
            spec = _load_checked(path, args)
        except SpecError as exc:
            print(exc, file=sys.stderr)
            if any(problem.kind == MISSING_SOURCE for problem in exc.problems):
                print("  (validating away from the data or the network? --no-source-check makes a missing "
                      "source a warning and reaches no store)", file=sys.stderr)
            failed += 1
        except OSError as exc:
            print(f"{path}: cannot read: {exc.strerror or exc}", file=sys.stderr)
            failed += 1
        else:
            views = sum(group.count for group in spec.views)
            what = (f"{plural(views, 'view')} in {plural(len(spec.views), 'group')}" if spec.views
                    else plural(len(spec.ops), 'op'))
            print(f"{path}: ok ({spec.name}: {what}, batch {spec.batch_size})")
            if args.no_source_check:
                for warning in missing_source_warnings(spec, path, set_overrides(args)):
                    print(f"warning: {warning}", file=sys.stderr)
    return EXIT_INVALID if failed else 0
