"""``dali-bridge convert``: pack an image folder, file list or Parquet files into WebDataset shards."""
from __future__ import annotations

import argparse
import sys

from .options import EXIT_INVALID, AddCommand


def add_parser(add: AddCommand) -> None:
    p = add("convert", cmd_convert, "Pack an image folder (or a 'path label' file list, or Parquet files) into "
                                    "WebDataset tar shards "
                                    "without re-encoding, with DALI index files and a manifest.",
            "examples:\n  dali-bridge convert data/sample shards/train-%06d.tar --shard-size 1000\n"
            "  dali-bridge convert train_list.txt /data/shards/train-%06d.tar --overwrite\n"
            "  dali-bridge convert 'hf/data/train-*.parquet' shards/train-%06d.tar\n"
            "Samples keep the source's order; each is KEY.cls (label) + KEY.<ext> (the original bytes).")
    p.add_argument("source", metavar="SRC", help="ImageFolder root (class sub-folders), a file list, or Parquet "
                                                 "files (a .parquet path, glob or brace pattern)")
    p.add_argument("out_pattern", metavar="OUT_PATTERN", help="printf-style shard path, e.g. shards/train-%%06d.tar")
    p.add_argument("--shard-size", type=int, default=1000, metavar="N", help="samples per shard (default 1000)")
    p.add_argument("--extensions", metavar="EXTS",
                   help="comma-separated image extensions to pack (default .jpg,.jpeg,.png,.webp)")
    p.add_argument("--overwrite", action="store_true", help="replace existing shards, indexes and manifest")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")


def cmd_convert(args: argparse.Namespace) -> int:
    from ..tools.convert import convert
    from ..tools.convert_staging import ConvertError
    from ..util.quoting import safe_name
    from ..spec.model import DEFAULT_EXTENSIONS

    extensions = tuple("." + e.strip().lstrip(".").lower() for e in args.extensions.split(",")) \
        if args.extensions else DEFAULT_EXTENSIONS
    try:
        result = convert(args.source, args.out_pattern, shard_size=args.shard_size, overwrite=args.overwrite,
                         progress=not args.quiet, extensions=extensions)
    except ConvertError as exc:
        print(f"dali-bridge convert: {exc}", file=sys.stderr)
        return EXIT_INVALID
    except OSError as exc:  # e.g. the output folder cannot be made: before anything is written
        print(f"dali-bridge convert: {safe_name(exc.filename or args.out_pattern)}: {exc.strerror or exc}",
              file=sys.stderr)
        return EXIT_INVALID
    print(f"wrote {len(result.shards)} shard(s), {result.samples} samples, {result.bytes_written / 2**20:.1f} MiB "
          f"in {result.seconds:.1f} s; DALI index files beside them")
    print(f"manifest: {result.manifest}")
    if result.skipped:
        print(result.describe_skipped(), file=sys.stderr)
    print(f"pipeline source:\n  source: {{type: webdataset, shards: \"{result.pattern}\"}}")
    return 0
