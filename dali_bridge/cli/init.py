"""``dali-bridge init``: write a copy of a shipped pipeline, comments and all, to edit."""
from __future__ import annotations

import argparse
import os
import sys

from ..spec.shipped import SUFFIX, PipelineNotFound, shipped_pipelines
from .options import EXIT_INVALID, AddCommand


def add_parser(add: AddCommand) -> None:
    p = add("init", cmd_init, "Write a copy of a shipped pipeline (comments kept) to edit; an existing file is "
                              "never overwritten.",
            "examples:\n  dali-bridge init imagenet_train                 # writes imagenet_train.yaml here\n"
            "  dali-bridge init timm_train -o configs/train.yaml\n"
            "exit status: 0 written, 2 unknown name or the file exists")
    p.add_argument("name", metavar="NAME", help="a shipped pipeline (dali-bridge pipelines lists them)")
    p.add_argument("-o", "--output", metavar="FILE", help="where to write the copy (default: NAME.yaml here; a "
                                                          "folder: NAME.yaml in it)")


def cmd_init(args: argparse.Namespace) -> int:
    pipelines = shipped_pipelines()
    name = args.name[: -len(SUFFIX)] if args.name.endswith(SUFFIX) else args.name
    if name not in pipelines:
        raise PipelineNotFound(args.name, list(pipelines))
    output = args.output or f"{name}{SUFFIX}"
    if os.path.isdir(output):  # -o configs/: the copy goes inside, under its own name
        output = os.path.join(output, f"{name}{SUFFIX}")
    text = pipelines[name].path.read_bytes()
    try:
        with open(output, "xb") as handle:  # "x": refuses a file that exists, atomically
            handle.write(text)
    except FileExistsError:
        print(f"dali-bridge init: {output} exists; not overwritten (choose another name with -o FILE, or remove "
              f"it first)", file=sys.stderr)
        return EXIT_INVALID
    except OSError as exc:
        print(f"dali-bridge init: cannot write {output}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_INVALID
    print(f"wrote {output}: a copy of the shipped pipeline {name}. Its source.root is relative to the file's folder;\n"
          f"point it at your images (an ImageFolder), then: dali-bridge run {output}")
    return 0
