"""``dali-bridge show``: a pipeline's resolved file, its plan, where each stage runs on each backend, and its order."""
from __future__ import annotations

import argparse

from ..spec.pipeline import PipelineSpec
from ..util.wording import plural
from .options import AddCommand, add_spec_options, load_with_options


def add_parser(add: AddCommand) -> None:
    p = add("show", cmd_show, "Print the resolved pipeline (defaults filled in) and what each op becomes on "
                              "each backend, with the device it runs on.",
            "examples:\n  dali-bridge show pipelines/imagenet_train.yaml\n"
            "  dali-bridge show imagenet_train        # a shipped pipeline by name (dali-bridge pipelines)")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--order", action="store_true",
                   help="list the source and show how the order mixes classes per batch (loader.shuffle: shards "
                        "at several windows against a global shuffle)")
    add_spec_options(p)


def cmd_show(args: argparse.Namespace) -> int:
    from ..loader.select import BACKEND_NAMES, choose_backend, unavailable_reason
    from ..loader.placement import placement
    from ..pipeline.plan import build_plan, unsupported_places
    from ..bench.timing import format_table
    from ..spec.shipped import resolve_pipeline

    spec = load_with_options(args.file, args)
    print(f"# resolved pipeline: {resolve_pipeline(args.file).describe(args.file)}")
    print(_resolved_yaml(spec))
    plan = build_plan(spec)
    groups = _group_plans(plan)
    if plan.views:
        print(f"# output per batch: a list of {len(plan.views)} views, each cut from the sample's one decode")
    for name, first, views in groups:
        shown = f"views {views[0]}-{views[-1]} ({name}): " if name else ""
        print(f"# output per batch: {shown}{first.output_shape(spec.batch_size)} {first.finish.dtype} "
              f"({first.finish.layout})")
    from ..ops.registry import op_origin
    for index, op in enumerate(spec.ops):
        if op_origin(op.name) is not None:
            print(f"# ops[{index}] {op.name}: from {op_origin(op.name)}")
    try:
        choice = choose_backend(spec.backend, executor=spec.loader.executor)
        print(f"# backend {spec.backend!r} picks {choice.backend} here: {choice.reason}")
    except Exception as exc:
        print(f"# backend {spec.backend!r}: {exc}")
    from ..backends.base import default_workers
    from ..backends.dali.plan import dali_plan
    from ..backends.device import describe_dali_threads
    host_tail = bool(dali_plan(plan).torch_tail)
    threads = describe_dali_threads(spec.loader.workers, auto_cores=default_workers(), host_tail=host_tail,
                                    tail_in=spec.loader.executor)
    print(f"# {threads}")
    for backend in BACKEND_NAMES:
        missing = unsupported_places(spec, backend)
        reason = unavailable_reason(backend)
        status = "available here" if reason is None else f"not available here: {reason}"
        print(f"\n## {backend} ({status})")
        if missing:
            print("  cannot run this pipeline: " + "; ".join(f"{where} {n} (runs on {', '.join(b)})"
                                                        for where, n, b in missing))
            continue
        for name, first, views in groups:
            if name:  # each group's chain, after the one decode (the stages of its first view)
                print(f"### views group {name}: {plural(len(views), 'view')} ({', '.join(map(str, views))})")
            rows = [{"stage": s.stage, "implementation": s.implementation, "device": s.device}
                    for s in placement(first, backend, cuda=_cuda(), executor=spec.loader.executor)]
            print(format_table(rows, [("stage", "stage"), ("device", "device"), ("implementation", "implementation")]))
        if backend == "torchvision":
            from ..pipeline.region_decode import describe_decode
            print(f"  decoder here: {describe_decode(plan)}")
            print("  where a run's CPU goes, by stage: loader.stats()['stages'] (in the workers: per-sample "
                  "Python, decode, kernels, collate; in the loader's process: transfer, finish)")
    if args.order:
        _show_order(spec)
    return 0


def _group_plans(plan) -> list[tuple[str, object, list[int]]]:
    """(group name, its first view's plan, its view numbers) of each views group; one unnamed entry
    for a pipeline without views."""
    if not plan.views:
        return [("", plan, [0])]
    groups: dict[str, tuple[object, list[int]]] = {}
    for view in plan.views:
        groups.setdefault(view.group, (view, []))[1].append(view.view)
    return [(name, first, numbers) for name, (first, numbers) in groups.items()]


def _show_order(spec) -> None:
    """How the epoch order mixes classes: the shard-aware order at a few windows against a global shuffle."""
    from ..pipeline.sampling import epoch_order
    from ..data.shards.order import quality_report
    from ..data.sources.local import list_source
    from ..bench.timing import format_table

    listing = list_source(spec.source)
    chosen = spec.loader.shuffle_window if spec.loader.shuffle == "shards" else None
    print(f"\n## order quality (epoch 0, batch {spec.batch_size}, {len(listing)} samples)")
    if listing.shards is None:
        print("  this source has no shards: only the global shuffle applies")
        return
    rows = quality_report(listing.labels, listing.shards.shard, spec.batch_size, spec.seed, [1, 4, 16, 64], chosen,
                          global_order=epoch_order(len(listing.labels), spec.seed, 0, True))
    print(format_table(rows, [("order", "order"), ("window", "window (shards)"), ("classes", "classes/batch"),
                              ("entropy", "label entropy (bits)"), ("share", "of global")]))


def _resolved_yaml(spec: PipelineSpec) -> str:
    """The spec as YAML with ``workers: auto`` kept as the docs write it (the spec stores None), and a
    comment with the figure auto resolves to here; the text still loads back to the same spec."""
    import yaml

    from ..backends.base import worker_share

    data = spec.to_dict()
    if spec.loader.workers is not None:
        return spec.to_yaml()
    data["loader"]["workers"] = "auto"
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=None)
    share = worker_share()
    return text + f"# loader.workers: auto ({share.workers}): {share.reason()}\n"


def _cuda() -> bool:
    from ..loader.select import probe
    return probe().cuda_devices > 0
