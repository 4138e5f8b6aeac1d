"""``dali-bridge sample-data``: write the synthetic, photo-like sample set."""
from __future__ import annotations

import argparse

from ..util.wording import plural
from .options import AddCommand


def add_parser(add: AddCommand) -> None:
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


def cmd_sample_data(args: argparse.Namespace) -> int:
    from ..util.progress import progress as progress_bar
    from ..data.sources.synthetic import ensure_sample_data, generate_sample_data

    with progress_bar(total=args.images, unit="image", description=f"sample-data {args.dir}",
                      enabled=not args.quiet) as bar:
        def progress(done: int, total: int) -> None:
            bar.update(done - bar.n)

        generate = ensure_sample_data if args.if_absent else generate_sample_data
        extra = {} if args.if_absent else {"overwrite": args.overwrite}
        info = generate(args.dir, images=args.images, classes=args.classes, seed=args.seed, progress=progress, **extra)
    print(f"{info.root}: {plural(info.images, 'image')} in {plural(info.classes, 'class')} (seed {info.seed}, "
          f"{info.bytes_total / 2**20:.1f} MiB)")
    return 0
