"""``dali-bridge verify``: check shards (local or at a URL) against their manifest."""
from __future__ import annotations

import argparse
import json
import sys

from .options import EXIT_FAILED, EXIT_INVALID, AddCommand


def add_parser(add: AddCommand) -> None:
    p = add("verify", cmd_verify, "Check shards written by 'convert' against their manifest: every shard present, "
                                  "with the recorded size and sha256, and every index with the recorded sha256.",
            "examples:\n  dali-bridge verify shards/train.manifest.json\n"
            "  dali-bridge verify 'shards/train-%06d.tar'   # the manifest beside a shard pattern\n"
            "exit status: 0 all match, 1 a shard or index is missing or differs, 2 no readable manifest")
    p.add_argument("targets", nargs="+", metavar="MANIFEST_OR_PATTERN")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")


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
