"""``dali-bridge doctor``: the facts about this host that decide which backend runs and how fast."""
from __future__ import annotations

import argparse
import json

from .options import EXIT_INVALID, AddCommand


def add_parser(add: AddCommand) -> None:
    p = add("doctor", cmd_doctor, "Print the environment that matters: versions, CUDA devices, which backend "
                                  "auto picks and why, recommended worker counts.",
            "examples:\n  dali-bridge doctor\n  dali-bridge doctor --json > host.json\n"
            "  dali-bridge doctor pipelines/my_s3.yaml   # also: does this host reach its source?\n"
            "exit status: 0, or 2 when a named pipeline's source cannot be read from this host")
    p.add_argument("pipelines", nargs="*", metavar="PIPELINE",
                   help="also check that this host reaches each pipeline's source (a local path, or at a URL "
                        "listed or HEADed as the loader reads it, within source.timeout)")
    p.add_argument("--json", action="store_true", help="print as JSON")


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..tools.doctor import format_report, report
    from ..tools.doctor_sources import source_reach, storage_clients

    info = report()
    info["object_storage_clients"] = storage_clients()
    reached = {path: source_reach(path) for path in args.pipelines}
    for path, answer in reached.items():
        info[f"source of {path}"] = answer
    print(json.dumps(info, indent=2) if args.json else format_report(info))
    return EXIT_INVALID if any(answer["reached"].startswith("no") for answer in reached.values()) else 0
