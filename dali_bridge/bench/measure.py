"""The measuring process: one candidate, built after the heavy imports, yields a first batch
(timed from construction), ``warmup`` discarded batches, then ``repeat`` timed windows of
``batches`` batches, and reports them to the parent on a pipe (``PROTOCOL_FD_ENV``). PSS is read
after the warm-up and after the windows, never inside them (reading it costs tens of ms). A bridge
backend that splits its CPU by stage (``loader.stats()["stages"]``, the ``torchvision`` backend) has
that split recorded for each window too."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from .baselines import ceiling, dali_baseline, reference_description, torchvision_baseline
from .procstats import tree_cpu_seconds, tree_memory_mib
from .results import PROTOCOL_FD_ENV, BenchError


def _no_stages() -> None:
    return None


def _bridge(path: str, overrides: dict[str, Any], backend: str):
    from ..loader.loader import build_loader
    from ..spec.pipeline import load_spec

    spec = load_spec(path, overrides)
    outputs = list(spec.outputs)
    if "index" not in outputs:
        outputs.append("index")
    loader = build_loader(path, backend, overrides={**overrides, "outputs": outputs})
    # a pipeline with views gives a list of per-view tensors where another gives one image tensor
    pixels = [name for name in ("image", "views") if name in outputs]
    image_at, index_at = outputs.index(pixels[0]) if pixels else None, outputs.index("index")

    def stream() -> Iterator[tuple[Any, np.ndarray]]:
        while True:
            for batch in loader:
                image = batch[image_at] if image_at is not None else None
                yield image, batch[index_at].cpu().numpy()

    def stages() -> dict[str, Any] | None:
        return loader.stats().get("stages")

    return stream(), loader.close, stages


def _open_candidate(config: dict[str, Any]):
    """The candidate's batch stream, its close, and what reads its CPU split by stage (``loader.stats()
    ["stages"]`` for a bridge backend; a reader giving None for a reference)."""
    from ..backends.base import default_workers  # noqa: F401  (imports torch before timing starts)

    if config["kind"] == "backend":
        return _bridge(config["file"], config["overrides"], config["name"])
    return (*_open_reference(config), _no_stages)


def _open_reference(config: dict[str, Any]):
    from ..pipeline.plan import build_plan
    from ..data.sources.local import list_source
    from ..spec.pipeline import load_spec

    kind, name, threads = config["kind"], config["name"], config["threads"]
    spec = load_spec(config["file"], config["overrides"])
    listing = list_source(spec.source)
    if kind == "ceiling":
        return ceiling(spec, listing, threads)
    if listing.shards is not None:
        raise BenchError(f"hand-written baselines read local image files; this source is a {spec.source.type} "
                         f"read from {listing.root} (shards, Parquet row groups or objects at a URL): use "
                         f"--baselines ceiling or none")
    plan = build_plan(spec)
    if name in ("torchvision", "torchvision-pil"):
        import torch
        return torchvision_baseline(spec, listing, plan, threads, pil=name == "torchvision-pil",
                                    cuda=torch.cuda.is_available())
    if name in ("dali-cpu", "dali"):
        return dali_baseline(spec, listing, plan, threads, gpu=name == "dali")
    if name in ("spdl", "spdl-torchvision"):
        import torch

        from .spdl_baseline import spdl_baseline
        return spdl_baseline(spec, listing, plan, threads, name=name, cuda=torch.cuda.is_available())
    raise BenchError(f"unknown candidate {kind}:{name}")


def _preimport(config: dict[str, Any]) -> None:
    """Import the heavy libraries before the clock starts: first-batch time is the loader's own."""
    import torch  # noqa: F401
    import torchvision  # noqa: F401
    if "dali" in config["name"]:
        import nvidia.dali  # noqa: F401
        import nvidia.dali.plugin.pytorch  # noqa: F401
    if config["name"].startswith("spdl"):
        from .spdl_baseline import spdl_io_problem
        spdl_io_problem()  # imports spdl and loads FFmpeg (when it loads)


def _gpu_used_mib() -> float | None:
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        free, total = torch.cuda.mem_get_info()
        return (total - free) / 2**20
    except Exception:
        return None


def child_main() -> int:
    """Entry of a measuring process: config JSON path in argv[1]; reports on the protocol fd."""
    config = json.loads(Path(sys.argv[1]).read_text())
    channel = os.fdopen(int(os.environ[PROTOCOL_FD_ENV]), "w", buffering=1)

    def say(kind: str, payload: Any = None) -> None:
        channel.write(json.dumps([kind, payload]) + "\n")

    try:
        result = _measure(config, lambda: say("batch"))
    except Exception as exc:
        import traceback
        traceback.print_exc()
        say("error", f"{type(exc).__name__}: {exc}")
        channel.close()
        sys.stderr.flush()
        os._exit(1)  # a half-closed loader's threads must not hold the exit
    say("result", result)
    channel.close()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown: some libraries' atexit handlers are slow or noisy


def _measure(config: dict[str, Any], tick: Callable[[], None]) -> dict[str, Any]:
    import torch

    _preimport(config)
    pixels = np.load(config["pixels"])
    gpu_before = _gpu_used_mib()
    start = time.perf_counter()
    stream, close, stages = _open_candidate(config)
    try:
        images, indices = next(stream)
        _synchronize(torch)
        first_batch_s = time.perf_counter() - start
        tick()
        output: dict[str, Any] = {"batch_size": len(indices)}
        if config["kind"] != "backend":
            output["description"] = reference_description(config["kind"], config["name"], config["threads"])
        # a bridge backend's list is a pipeline's views; a reference's (the ceiling's) is its decoded images
        output.update(_pixels_description(images, torch, views=config["kind"] == "backend"))
        for _ in range(config["warmup"] - 1):
            next(stream)
            tick()
        peak_pss = tree_memory_mib(os.getpid())[1]  # outside the timed windows: reading PSS is slow
        windows, gpu_peak = _timed_windows(stream, config=config, pixels=pixels, tick=tick, gpu_before=gpu_before,
                                           stages=stages)
        peak_pss = max(peak_pss, tree_memory_mib(os.getpid())[1])
        wait = _model_wait(stream, config=config, tick=tick) if config.get("model_ms") else None
    finally:
        stream.close()
        close()
    gpu_mib = None if gpu_before is None else gpu_peak - gpu_before
    return {"first_batch_s": first_batch_s, "windows": windows, "wait": wait, "output": output, "gpu_mib": gpu_mib,
            "pss_mib": peak_pss}


def _pixels_description(images: Any, torch, *, views: bool) -> dict[str, Any]:
    """Shape, dtype and device of a batch's pixels; for a list of ``views`` (one tensor each), how many
    views each sample gives and each one's shape: images/s counts samples, whatever their views."""
    if isinstance(images, torch.Tensor):
        return {"shape": list(images.shape), "dtype": str(images.dtype).replace("torch.", ""),
                "device": str(images.device)}
    if views and isinstance(images, (list, tuple)) and images and all(isinstance(v, torch.Tensor) for v in images):
        return {"views": len(images), "view_shapes": [list(v.shape) for v in images],
                "dtype": str(images[0].dtype).replace("torch.", ""), "device": str(images[0].device)}
    return {}


def _synchronize(torch) -> None:
    """Wait for queued GPU work, so a batch counts when its pixels exist, not when it was queued."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _stage_seconds(figures: dict[str, Any] | None) -> tuple[dict[str, float], int] | None:
    """CPU seconds per stage and the images they cover, from ``loader.stats()["stages"]``."""
    if not figures or not figures.get("images"):
        return None
    per_image = figures["cpu_ms_per_image"]
    return {stage: per_image[stage] * figures["images"] / 1e3 for stage in per_image}, figures["images"]


def _window_stages(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    """A window's share of the stage split (its batches' CPU per stage and their images), or nothing."""
    start, end = _stage_seconds(before) or ({}, 0), _stage_seconds(after)
    if end is None or end[1] <= start[1]:
        return {}
    return {"stage_cpu_seconds": {stage: seconds - start[0].get(stage, 0.0) for stage, seconds in end[0].items()},
            "stage_images": end[1] - start[1]}


def _timed_windows(stream: Iterator, *, config: dict[str, Any], pixels: np.ndarray, tick: Callable[[], None],
                   gpu_before: float | None, stages: Callable[[], dict[str, Any] | None] = _no_stages,
                   ) -> tuple[list[dict[str, Any]], float | None]:
    """``repeat`` windows of ``batches`` batches: images, seconds, source megapixels and CPU seconds
    of the process tree per window, and where the candidate splits its CPU by stage, that split
    over the window's batches; and the peak GPU memory in use seen after each window."""
    import torch

    windows, gpu_peak = [], gpu_before
    for _ in range(config["repeat"]):
        count = megapixels = 0.0
        stages_before = stages()
        cpu0, t0 = tree_cpu_seconds(), time.perf_counter()
        for _ in range(config["batches"]):
            _, indices = next(stream)
            count += len(indices)
            megapixels += float(pixels[indices].sum()) / 1e6
            tick()
        _synchronize(torch)
        t1, cpu1 = time.perf_counter(), tree_cpu_seconds()
        windows.append({"images": count, "seconds": t1 - t0, "megapixels": megapixels, "cpu_seconds": cpu1 - cpu0,
                        **_window_stages(stages_before, stages())})
        used = _gpu_used_mib()
        if used is not None:
            gpu_peak = max(gpu_peak or 0.0, used)
    return windows, gpu_peak


def _model_wait(stream: Iterator, *, config: dict[str, Any], tick: Callable[[], None]) -> dict[str, float]:
    """One window in which the consumer sleeps ``model_ms`` after each batch (a simulated model
    step): how long it waited for data, and how long it stepped."""
    step_s = config["model_ms"] / 1000.0
    waited = stepped = 0.0
    for _ in range(config["batches"]):
        t0 = time.perf_counter()
        next(stream)
        t1 = time.perf_counter()
        time.sleep(step_s)  # the simulated model step: the loader keeps working meanwhile
        waited, stepped = waited + (t1 - t0), stepped + (time.perf_counter() - t1)
        tick()
    return {"wait_s": waited, "model_s": stepped, "batches": config["batches"]}
