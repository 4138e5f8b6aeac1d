"""``dali-bridge from-torchvision`` and ``from-timm``: a ``transforms.v2`` Compose or timm's training arguments
as a pipeline file."""
from __future__ import annotations

import argparse
import itertools
import sys
from typing import Callable

from ..spec.overrides import parse_overrides
from ..spec.pipeline import PipelineSpec
from .options import EXIT_INVALID, AddCommand, add_spec_options


def add_parser(add: AddCommand) -> None:
    _add_from_torchvision(add)
    _add_from_timm(add)


def _add_from_torchvision(add: AddCommand) -> None:
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


def _add_from_timm(add: AddCommand) -> None:
    p = add("from-timm", cmd_from_timm, "Write the pipeline file of timm's training arguments (train.py's data and "
                                        "augmentation options), without timm.",
            "timm's arguments as train.py takes them, after --, or among this command's own options.\n"
            "examples:\n  dali-bridge from-timm --source data/train -- \\\n"
            "      --aa rand-m9-mstd0.5-inc1 --reprob 0.25 --remode pixel --mixup 0.8 --cutmix 1.0 > timm.yaml\n"
            "  dali-bridge from-timm --source data/train --aa rand-m9-mstd0.5-inc1 --reprob 0.25 > timm.yaml\n"
            "exit status: 0 written, 2 an argument has no op yet (each is named, with what to do)")
    p.add_argument("timm_args", nargs="*", metavar="TIMM_ARGS")
    _add_own_timm_options(p)


def _add_own_timm_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", required=True, metavar="DIR", help="image folder (ImageFolder layout) to read")
    p.add_argument("--batch-size", type=int, default=None, help="images per batch (default: -b from the arguments, "
                                                                 "else train.py's 128)")
    p.add_argument("--crop-interpolation", choices=("bilinear", "bicubic"), default=None,
                   help="the crop's filter where timm's --train-interpolation is random (its default)")
    p.add_argument("--name", default="from-timm", help="the pipeline's name (default from-timm)")
    add_spec_options(p, data=False)


def timm_arguments_apart(argv: list[str]) -> list[str]:
    """``from-timm``'s command line with timm's arguments moved behind ``--`` where they came without one
    (``--source data/train --aa rand-m9-mstd0.5-inc1``): argparse would take the first value among them
    for ``TIMM_ARGS`` and refuse the rest. Any other command line is returned as it is."""
    command = next((n for n, token in enumerate(argv) if not token.startswith("-")), None)
    if command is None or argv[command] != "from-timm" or "--" in argv:
        return argv
    own = argparse.ArgumentParser()   # with -h/--help, as the command has
    _add_own_timm_options(own)
    values = {option: 0 if action.nargs == 0 else 1 for action in own._actions for option in action.option_strings}
    kept, timm, rest = argv[:command + 1], [], iter(argv[command + 1:])
    for token in rest:
        name = token.split("=", 1)[0]
        if name in values:
            kept.append(token)
            kept += list(itertools.islice(rest, values[name] if "=" not in token else 0))
        else:
            timm.append(token)
    return kept + (["--", *timm] if timm else [])


def _print_recipe(make: Callable[[], PipelineSpec], origin: str) -> int:
    """A converted pipeline as YAML on stdout, its notes on stderr; a refusal: every problem, exit 2."""
    import warnings

    from ..errors import RecipeError
    from ..recipes.from_torchvision import RecipeWarning

    with warnings.catch_warnings(record=True) as notes:
        warnings.simplefilter("always", RecipeWarning)
        try:
            spec = make()
        except RecipeError as exc:
            print(exc, file=sys.stderr)
            return EXIT_INVALID
    for note in notes:
        print(f"note: {note.message}", file=sys.stderr)
    print(f"# {origin}\n{spec.to_yaml()}", end="")
    return 0


def cmd_from_torchvision(args: argparse.Namespace) -> int:
    from ..recipes.from_torchvision import from_torchvision
    from ..recipes.importing import import_transform

    def make() -> PipelineSpec:
        return from_torchvision(import_transform(args.reference), source=args.source, batch_size=args.batch_size,
                                name=args.name, overrides=parse_overrides(args.set or []))

    return _print_recipe(make, f"dali-bridge from-torchvision {args.reference}")


def cmd_from_timm(args: argparse.Namespace) -> int:
    from ..recipes.from_timm import from_timm

    def make() -> PipelineSpec:
        return from_timm(args.timm_args, source=args.source, batch_size=args.batch_size,
                         crop_interpolation=args.crop_interpolation, name=args.name,
                         overrides=parse_overrides(args.set or []))

    return _print_recipe(make, "dali-bridge from-timm -- " + " ".join(args.timm_args))
