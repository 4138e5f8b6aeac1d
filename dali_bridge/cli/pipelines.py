"""``dali-bridge pipelines``: the shipped pipelines, each with its one-line description."""
from __future__ import annotations

import argparse

from ..spec.shipped import shipped_folder, shipped_pipelines
from .options import AddCommand


def add_parser(add: AddCommand) -> None:
    p = add("pipelines", cmd_pipelines, "List the pipelines shipped with dali-bridge: each runs by name "
                                        "(dali-bridge run NAME --data DIR, build_loader(NAME, ...)).",
            "examples:\n  dali-bridge pipelines\n  dali-bridge init imagenet_train -o train.yaml   # a copy to edit\n"
            "  dali-bridge show imagenet_train")
    p.add_argument("--paths", action="store_true", help="also print where each file is installed")


def cmd_pipelines(args: argparse.Namespace) -> int:
    pipelines = shipped_pipelines()
    width = max((len(name) for name in pipelines), default=0)
    for name, pipeline in pipelines.items():
        print(f"{name:<{width}}  {pipeline.description()}")
        if args.paths:
            print(f"{'':<{width}}  {pipeline.path}")
    print(f"\n{len(pipelines)} shipped pipelines in {shipped_folder()}; a local file of the same name takes "
          f"their place.\nEach reads its images from source.root: give yours with --data DIR (an ImageFolder) "
          f"or --set source.root=DIR;\n'dali-bridge init NAME' writes a copy to edit.")
    return 0
