"""``dali-bridge doctor``: the facts about this host that decide which backend runs and how fast."""
from __future__ import annotations

import argparse
import json

from .options import AddCommand


def add_parser(add: AddCommand) -> None:
    p = add("doctor", cmd_doctor, "Print the environment that matters: versions, CUDA devices, which backend "
                                  "auto picks and why, recommended worker counts.",
            "examples:\n  dali-bridge doctor\n  dali-bridge doctor --json > host.json")
    p.add_argument("--json", action="store_true", help="print as JSON")


def cmd_doctor(args: argparse.Namespace) -> int:
    from ..tools.doctor import format_report, report

    info = report()
    print(json.dumps(info, indent=2) if args.json else format_report(info))
    return 0
