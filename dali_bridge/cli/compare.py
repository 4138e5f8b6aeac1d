"""``dali-bridge compare``: run one pipeline on two backends over the same samples and compare the batches."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from .options import (EXIT_FAILED, load_with_options, add_spec_options, check_writable_file,
                      check_writable_folder, AddCommand)


EPILOG_COMPARE = """examples:
  dali-bridge compare pipelines/imagenet_val.yaml --data data/sample
  dali-bridge compare my.yaml --backends dali-cpu,torchvision --batches 20 --save compare-out/
  dali-bridge compare my.yaml --set batch_size=16 --max-delta 2
Samples are matched by index (order, labels and index must be identical); float images are mapped
back to uint8 levels through the pipeline's mean/std before comparing. Default bounds: max 1 level,
mean 0.25 level (plus one float16 step for float16 outputs); with the GPU backend's nvJPEG decoder
max 4, mean 0.5.
exit status: 0 PASS, 1 FAIL, 2 invalid pipeline or arguments, 3 a backend cannot run here
"""


def add_parser(add: AddCommand) -> None:
    p = add("compare", cmd_compare, "Run a pipeline on two backends over the same samples and check that their "
                                    "batches match: max and mean |difference| per output (images in uint8 levels), "
                                    "the worst samples, PASS/FAIL against the bounds.", EPILOG_COMPARE)
    p.add_argument("file", metavar="FILE")
    p.add_argument("--backends", default="default", metavar="A,B",
                   help="the two backends to compare (dali, dali-cpu, torchvision; torchvision:ray runs one on a Ray "
                        "cluster, as loader.executor: ray); default: dali,torchvision "
                        "where the GPU backend runs, else dali-cpu,torchvision")
    p.add_argument("--batches", type=int, default=5, metavar="N",
                   help="batches of the first epoch to compare (default 5; 0 = the whole epoch)")
    p.add_argument("--save", metavar="DIR",
                   help="write side-by-side PNGs of the worst samples (A | B | difference heat map) and "
                        "mean_delta.png, the mean difference per pixel position")
    p.add_argument("--worst", type=int, default=5, metavar="K",
                   help="worst samples to list, and to save with --save (default 5)")
    p.add_argument("--max-delta", type=float, default=None, metavar="LEVELS",
                   help="bound on max |difference| in uint8 levels (default 1; 4 with nvJPEG)")
    p.add_argument("--mean-delta", type=float, default=None, metavar="LEVELS",
                   help="bound on mean |difference| in uint8 levels (default 0.25; 0.5 with nvJPEG)")
    p.add_argument("--json", metavar="OUT", help="also write the result as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    add_spec_options(p)


def cmd_compare(args: argparse.Namespace) -> int:
    from dataclasses import asdict, replace

    from ..tools.compare import MAX_SAVED_WORST, compare, default_pair
    from ..tools.compare_bounds import default_bounds

    if args.backends == "default":
        backends = list(default_pair())
    else:
        backends = [name.strip() for name in args.backends.split(",") if name.strip()]
        unknown = [name for name in backends if name.partition(":")[0] not in ("dali", "dali-cpu", "torchvision")
                   or name.partition(":")[2] not in ("", "processes", "threads", "ray")]
        if len(backends) != 2 or unknown:
            raise SystemExit(f"dali-bridge: --backends takes two of dali, dali-cpu, torchvision separated by a "
                             f"comma, each optionally with its loader.executor after a colon (torchvision:ray), "
                             f"found {args.backends!r}")
    if args.batches < 0 or args.worst < 0:
        raise SystemExit("dali-bridge: --batches and --worst must be >= 0")
    if args.save:
        if args.worst > MAX_SAVED_WORST:
            raise SystemExit(f"dali-bridge: --worst {args.worst} with --save: at most {MAX_SAVED_WORST} samples "
                             f"are saved (each is held as pixels until the end); pass --worst {MAX_SAVED_WORST} "
                             f"or less")
        check_writable_folder(args.save, "--save")
    if args.json:
        check_writable_file(args.json, "--json")
    spec = load_with_options(args.file, args)
    bounds = default_bounds(spec, backends)
    if args.max_delta is not None or args.mean_delta is not None:
        bounds = replace(bounds, max_abs=bounds.max_abs if args.max_delta is None else args.max_delta,
                         mean_abs=bounds.mean_abs if args.mean_delta is None else args.mean_delta,
                         reason="set on the command line")
    result = compare(spec, backends, batches=args.batches or None, bounds=bounds, keep_worst=args.worst,
                     save_dir=args.save, progress=not args.quiet)
    print(result.format())
    if args.json:
        data = asdict(result)
        data["passed"] = result.passed
        Path(args.json).write_text(json.dumps(data, indent=2, default=str))
    return 0 if result.passed else EXIT_FAILED
