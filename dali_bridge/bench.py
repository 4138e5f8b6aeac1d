"""``dali-bridge bench``: the bridge's loaders against hand-written baselines and the decode ceiling.

Every *candidate* — a bridge backend, a hand-written baseline, or the decode-only ceiling — runs
at each thread/worker count in a fresh Python process, so threads, worker processes, allocator
state and memory never carry over from one candidate to the next. Inside that process the
candidate yields one continuous stream of batches (epoch after epoch, in the bridge's sample
order): the first batch is timed from construction (``first_batch_s``), ``warmup`` batches are
discarded, then ``repeat`` windows of ``batches`` batches are timed. Per window: images/s,
megapixels/s of decoded input (sum of the source images' pixel counts, read once from their
headers) and CPU seconds of the whole process tree (the process, its threads and its worker
processes, from ``/proc``). Peak RSS of the process tree (workers included) is sampled from the
parent every 50 ms; PSS (shared pages split between processes) is read by the candidate itself
after the warm-up and after the timed windows, never inside them (reading it costs tens of ms).
``model_ms`` adds one window in which the consumer sleeps that long after each batch (a
simulated model step) and measures how long it waits for data.

Reference candidates, measured in the same run on the same samples:

* ``ceiling``: read + full decode (``torchvision.io.decode_image``, libjpeg-turbo) on a thread
  pool of N threads — the decoder releases the GIL, and threads avoid the inter-process copies a
  DataLoader would add, so this is the faster honest ceiling. No augmentation, no batching.
* ``torchvision``: the DataLoader a typical user writes from the docs: ImageFolder-style dataset
  reading with ``torchvision.io.decode_image``, ``transforms.v2`` geometry, ``ToDtype`` +
  ``Normalize`` in the workers, default collate into float batches, same worker count.
  ``torchvision-pil`` is the same with ImageFolder's default PIL loader (torchvision's reference
  training scripts' default).
* ``dali-cpu`` / ``dali``: a plain DALI pipeline + ``DALIGenericIterator``: ``fn.readers.file``,
  ``fn.decoders.image_random_crop`` (ROI decode) + ``fn.resize`` + ``fn.crop_mirror_normalize``
  (with DALI's own random draws), on the CPU / with ``mixed`` decode on the GPU.

The baselines' "label" is the sample's index (the same int the label would be, so the same cost):
it tells which samples each batch holds, so pixel counts are exact for every candidate.
"""
from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

PROTOCOL_FD_ENV = "DALI_BRIDGE_BENCH_FD"
BASELINE_NAMES = ("torchvision", "torchvision-pil", "dali-cpu", "dali")
REFERENCE_NAMES = ("ceiling",) + BASELINE_NAMES
SAMPLE_SET = {"images": 2000, "classes": 10, "seed": 0}   # the generated set `--data` defaults to
_MONITOR_INTERVAL_S = 0.05


class BenchError(RuntimeError):
    """The bench cannot do what was asked: a baseline for a pipeline it cannot express, a plot of nothing."""


@dataclass(frozen=True)
class Candidate:
    """One thing to measure: ``kind`` backend | baseline | ceiling, its ``name``, at ``threads``."""
    kind: str
    name: str
    threads: int

    @property
    def label(self) -> str:
        if self.kind == "backend":
            return self.name
        if self.kind == "ceiling":
            return "decode-only ceiling"
        return {"torchvision": "hand-written torchvision", "torchvision-pil": "hand-written torchvision (PIL)",
                "dali-cpu": "hand-written DALI (cpu)", "dali": "hand-written DALI (gpu)"}[self.name]


@dataclass
class CandidateResult:
    """Everything measured for one candidate (all windows of all rounds pooled)."""
    candidate: Candidate
    windows: list[dict[str, float]] = field(default_factory=list)
    first_batch_s: list[float] = field(default_factory=list)
    peak_rss_mib: float = 0.0
    pss_mib: float = 0.0
    gpu_mib: float | None = None
    wait: list[dict[str, float]] = field(default_factory=list)
    output: dict[str, Any] = field(default_factory=dict)
    loadavg: list[tuple[float, float]] = field(default_factory=list)   # 1-min load before/after each round
    error: str | None = None

    def summary(self, model_ms: float | None = None) -> dict[str, Any]:
        """The row of the table: medians and spreads over the windows."""
        c = self.candidate
        row: dict[str, Any] = {"candidate": c.label, "kind": c.kind, "name": c.name, "threads": c.threads}
        if self.error:
            return {**row, "error": self.error}
        rates = [w["images"] / w["seconds"] for w in self.windows]
        mpix = [w["megapixels"] / w["seconds"] for w in self.windows]
        images = sum(w["images"] for w in self.windows)
        median = statistics.median(rates)
        row.update(
            images_per_s=median, images_per_s_min=min(rates), images_per_s_max=max(rates),
            spread_pct=100.0 * (max(rates) - min(rates)) / median if median else 0.0,
            megapixels_per_s=statistics.median(mpix),
            cpu_ms_per_image=1000.0 * sum(w["cpu_seconds"] for w in self.windows) / images if images else 0.0,
            peak_rss_mib=self.peak_rss_mib, pss_mib=self.pss_mib, gpu_mib=self.gpu_mib,
            first_batch_s=statistics.median(self.first_batch_s), windows=len(self.windows), images=images,
            megapixels=sum(w["megapixels"] for w in self.windows),
        )
        if self.loadavg:  # absent where /proc/loadavg is (macOS)
            row.update(load_before=min(a for a, _ in self.loadavg), load_after=max(b for _, b in self.loadavg))
        if self.wait:
            waited = sum(w["wait_s"] for w in self.wait)
            stepped = sum(w["model_s"] for w in self.wait)
            row["data_wait_pct"] = 100.0 * waited / (waited + stepped) if waited + stepped else 0.0
            if model_ms and median:
                loader_ms = 1000.0 * self.output.get("batch_size", 0) / median
                row["data_wait_pct_from_throughput"] = 100.0 * max(0.0, loader_ms - model_ms) / max(loader_ms, model_ms)
        return row


# ---------------------------------------------------------------------------------------------
# The machine and the data

def machine_description() -> dict[str, Any]:
    """CPU model, cores, RAM, kernel, GPU and library versions: what a result was measured on."""
    info: dict[str, Any] = {"platform": f"{platform.system()} {platform.release()} {platform.machine()}",
                            "python": platform.python_version()}
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        models = [line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")]
        info["cpu_model"] = models[0] if models else platform.processor() or "unknown"
    except OSError:
        info["cpu_model"] = platform.processor() or "unknown"
    info["cpu_cores_total"] = os.cpu_count()
    try:
        info["cpu_cores_available"] = len(os.sched_getaffinity(0))
    except AttributeError:
        info["cpu_cores_available"] = os.cpu_count()
    try:
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        info["ram_gib"] = round(int(meminfo["MemTotal"].split()[0]) / 2**20, 1)
    except (OSError, KeyError, ValueError):
        info["ram_gib"] = None
    versions = {}
    for module in ("torch", "torchvision", "nvidia.dali", "numpy", "PIL"):
        try:
            versions[module] = __import__(module, fromlist=["__version__"]).__version__
        except Exception as exc:  # DALI absent or broken: say so
            versions[module] = f"unavailable ({type(exc).__name__})"
    info["versions"] = versions
    try:
        import torch
        info["gpus"] = [torch.cuda.get_device_name(n) for n in range(torch.cuda.device_count())]
    except Exception:
        info["gpus"] = []
    info["loadavg_at_start"] = loadavg()
    return info


def loadavg() -> list[float]:
    """The 1, 5 and 15 minute load averages (empty where /proc/loadavg does not exist)."""
    try:
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def source_pixels(listing) -> np.ndarray:
    """Pixel count of every sample's source image, from its header (int64 [N]); 0 where unreadable."""
    from .images import ImageError, probe

    pixels = np.zeros(len(listing), dtype=np.int64)
    for index in range(len(listing)):
        try:
            height, width = probe(listing.read(index))
        except ImageError:
            continue
        pixels[index] = height * width
    return pixels


def default_data_dir() -> Path:
    """Where the generated sample set lives for ``bench`` without ``--data``: ``./data/sample``."""
    return Path(os.environ.get("DALI_BRIDGE_SAMPLES", "data/sample"))


# ---------------------------------------------------------------------------------------------
# Process-tree accounting from /proc (Linux)

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                found += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
            except OSError:
                continue
    except OSError:
        pass
    return found


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant (threads are part of their process)."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo += _children(current)
    return tree


def tree_cpu_seconds(pid: int | None = None) -> float:
    """CPU seconds (user + system) of ``pid`` (default: this process), its threads and descendants.

    Live processes count their own time plus that of children they reaped; reaped children are
    already inside their parent's ``cutime``/``cstime``, so nothing is counted twice.
    """
    total = 0
    for member in process_tree(os.getpid() if pid is None else pid):
        try:
            fields = Path(f"/proc/{member}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return total / _CLOCK_TICKS


def tree_rss_mib(pid: int) -> float:
    """RSS of ``pid`` and its descendants in MiB (cheap: ``/proc/*/statm``). Shared pages count
    once per process, so forked workers each count the libraries they share with the parent."""
    rss = 0
    for member in process_tree(pid):
        try:
            rss += int(Path(f"/proc/{member}/statm").read_text().split()[1]) * _PAGE
        except (OSError, IndexError, ValueError):
            continue
    return rss / 2**20


def tree_memory_mib(pid: int) -> tuple[float, float]:
    """(RSS, PSS) of ``pid`` and its descendants in MiB. PSS splits shared pages between the
    processes sharing them, so it is what the loader really occupies. Reading PSS walks every
    mapping (tens of ms for a process with torch loaded): never call it inside a timed window."""
    pss = 0
    for member in process_tree(pid):
        try:
            for line in Path(f"/proc/{member}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
                    break
        except (OSError, IndexError, ValueError):
            continue
    return tree_rss_mib(pid), pss / 2**20


class _MemoryMonitor(threading.Thread):
    """Samples a process tree's RSS every 50 ms from the parent (about 0.1 ms a sample); keeps the
    peak. Also the watchdog: a candidate silent for ``stall_s`` seconds (no batch) is killed with
    its whole process group (its workers included)."""

    def __init__(self, pid: int, stall_s: float):
        super().__init__(daemon=True)
        self.pid, self.peak_rss, self.stall_s = pid, 0.0, stall_s
        self.last_activity = time.monotonic()
        self.stalled = False
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.peak_rss = max(self.peak_rss, tree_rss_mib(self.pid))
            if time.monotonic() - self.last_activity > self.stall_s and not self.stalled:
                self.stalled = True
                _kill_group(self.pid)
            self._stop_event.wait(_MONITOR_INTERVAL_S)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


# ---------------------------------------------------------------------------------------------
# Candidates as streams of (batch size, sample indices), built inside the measuring process

class _EpochOrderSampler:
    """The bridge's epoch orders (``epoch_order(n, seed, epoch)``), one epoch per ``iter()``: the
    baselines read the same samples in the same order as the bridge's loaders."""

    def __init__(self, count: int, seed: int, shuffle: bool):
        self.count, self.seed, self.shuffle, self.epoch = count, seed, shuffle, 0

    def __iter__(self) -> Iterator[int]:
        from .sampling import epoch_order

        order = epoch_order(self.count, self.seed, self.epoch, self.shuffle)
        self.epoch += 1
        return iter(order.tolist())

    def __len__(self) -> int:
        return self.count


class _ImageFolderStyle:
    """``torchvision.datasets.ImageFolder.__getitem__`` over the bench's listing: ``load(path)``,
    then ``transform``; the target is the sample's index (see the module docstring)."""

    def __init__(self, paths: Sequence[str], load: Callable[[str], Any], transform: Callable[[Any], Any]):
        self.paths, self.load, self.transform = list(paths), load, transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        return self.transform(self.load(self.paths[index])), index


def _decode_image_rgb(path: str):
    from torchvision.io import ImageReadMode, decode_image
    return decode_image(path, mode=ImageReadMode.RGB)


def _pil_rgb(path: str):
    from PIL import Image  # torchvision.datasets.folder.pil_loader
    with open(path, "rb") as handle:
        image = Image.open(handle)
        return image.convert("RGB")


def torchvision_baseline_transform(plan, pil: bool = False):
    """The ``transforms.v2`` pipeline a user writes for ``plan`` (on PIL images when ``pil``): each
    step's own ``transforms.v2`` counterpart, then the finish's."""
    from torchvision.transforms import v2

    steps: list = []
    for step in plan.steps:
        try:
            steps += step.op.torchvision_transforms(step.params)
        except NotImplementedError as exc:
            raise BenchError(f"no hand-written torchvision equivalent for step {step.kind!r}") from exc
    if pil:
        steps.append(v2.PILToTensor())
    steps += plan.finish_step.op.torchvision_transforms(plan.finish_step.params)
    return v2.Compose(steps)


def _torchvision_baseline(spec, listing, plan, threads: int, pil: bool, cuda: bool):
    import torch
    from torch.utils.data import DataLoader

    dataset = _ImageFolderStyle(listing.paths, _pil_rgb if pil else _decode_image_rgb,
                                torchvision_baseline_transform(plan, pil=pil))
    kwargs: dict[str, Any] = {}
    if threads > 0:
        kwargs.update(persistent_workers=True, prefetch_factor=spec.loader.prefetch)
    loader = DataLoader(dataset, batch_size=spec.batch_size, sampler=_EpochOrderSampler(len(listing), spec.seed,
                        spec.loader.shuffle), num_workers=threads, pin_memory=cuda,
                        drop_last=spec.loader.last_batch == "drop", **kwargs)
    device = torch.device("cuda") if cuda else None

    def stream() -> Iterator[tuple[Any, np.ndarray]]:
        while True:
            for images, indices in loader:
                if device is not None:
                    images = images.to(device, non_blocking=True)
                yield images, indices.numpy()

    return stream(), lambda: None


def dali_baseline_pipeline(spec, listing, plan, threads: int, gpu: bool):
    """The plain DALI pipeline a user writes for ``plan``: file reader in the bridge's epoch-0 order
    (DALI's reader cannot change order per epoch), then each step's plain DALI counterpart with
    DALI's own random draws (a first random resized crop decodes its random window), and
    crop_mirror_normalize (taking a last centre crop and flip)."""
    from nvidia.dali import fn, pipeline_def, types

    from .plan import graph_context
    from .sampling import epoch_order

    order = epoch_order(len(listing), spec.seed, 0, spec.loader.shuffle).tolist()
    decode_device = "mixed" if gpu else "cpu"

    @pipeline_def(batch_size=spec.batch_size, num_threads=threads, device_id=0 if gpu else None,
                  prefetch_queue_depth=spec.loader.prefetch)
    def plain():
        encoded, labels = fn.readers.file(files=[listing.paths[i] for i in order], labels=order,
                                          random_shuffle=False, name="Reader")
        ctx = graph_context(plan, "gpu" if gpu else "cpu")
        first = plan.steps[0] if plan.steps else None
        images = first.op.dali_baseline_decode(first, encoded, decode_device, ctx) if first else None
        start = 0 if images is None else 1  # the decoder did the first step (a random resized crop's window)
        if images is None:
            images = fn.decoders.image(encoded, device=decode_device, output_type=types.RGB)
        for ctx.position, step in enumerate(plan.steps):
            if ctx.position >= start:
                try:
                    images = step.op.dali_baseline(step, images, ctx)
                except NotImplementedError as exc:
                    raise BenchError(f"no hand-written DALI equivalent for step {step.kind!r}") from exc
        return plan.finish_step.op.dali_baseline(plan.finish_step, images, ctx), labels

    return plain()


def _dali_baseline(spec, listing, plan, threads: int, gpu: bool):
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    pipe = dali_baseline_pipeline(spec, listing, plan, threads, gpu)
    pipe.build()
    policy = {"partial": LastBatchPolicy.PARTIAL, "drop": LastBatchPolicy.DROP,
              "pad": LastBatchPolicy.FILL}[spec.loader.last_batch]
    iterator = DALIGenericIterator([pipe], ["image", "label"], reader_name="Reader", last_batch_policy=policy,
                                   auto_reset=True)

    def stream() -> Iterator[tuple[Any, np.ndarray]]:
        while True:
            for (batch,) in iterator:
                yield batch["image"], batch["label"].reshape(-1).cpu().numpy()

    return stream(), lambda: None


def _ceiling(spec, listing, threads: int):
    """Read + full decode of the same samples, in the bridge's order, on ``threads`` threads."""
    from concurrent.futures import ThreadPoolExecutor

    import torch
    from torchvision.io import ImageReadMode, decode_image

    from .sampling import epoch_order

    def decode(index: int):
        return decode_image(torch.frombuffer(bytearray(listing.read(index)), dtype=torch.uint8),
                            mode=ImageReadMode.RGB)

    pool = ThreadPoolExecutor(max(1, threads), thread_name_prefix="decode")

    def batches() -> Iterator[list[int]]:
        epoch = 0
        while True:
            order = epoch_order(len(listing), spec.seed, epoch, spec.loader.shuffle).tolist()
            for start in range(0, len(order), spec.batch_size):
                yield order[start:start + spec.batch_size]
            epoch += 1

    def stream() -> Iterator[tuple[Any, np.ndarray]]:
        pending = []  # two batches in flight keep every thread busy across batch boundaries
        for chunk in batches():
            pending.append((chunk, [pool.submit(decode, i) for i in chunk]))
            if len(pending) < 2:
                continue
            done, futures = pending.pop(0)
            images = [f.result() for f in futures]
            yield images, np.asarray(done, dtype=np.int64)

    return stream(), lambda: pool.shutdown(wait=False, cancel_futures=True)


def _bridge(path: str, overrides: dict[str, Any], backend: str):
    from .loader import build_loader
    from .spec import load_spec

    spec = load_spec(path, overrides)
    outputs = list(spec.outputs)
    if "index" not in outputs:
        outputs.append("index")
    loader = build_loader(path, backend, overrides={**overrides, "outputs": outputs})
    image_at, index_at = outputs.index("image") if "image" in outputs else None, outputs.index("index")

    def stream() -> Iterator[tuple[Any, np.ndarray]]:
        while True:
            for batch in loader:
                image = batch[image_at] if image_at is not None else None
                yield image, batch[index_at].cpu().numpy()

    return stream(), loader.close


def _open_candidate(config: dict[str, Any]):
    from .backends.base import default_workers  # noqa: F401  (imports torch before timing starts)
    from .plan import build_plan
    from .sources import list_source
    from .spec import load_spec

    kind, name, threads = config["kind"], config["name"], config["threads"]
    if kind == "backend":
        return _bridge(config["file"], config["overrides"], name)
    spec = load_spec(config["file"], config["overrides"])
    listing = list_source(spec.source)
    if kind == "ceiling":
        return _ceiling(spec, listing, threads)
    if listing.shards is not None:
        raise BenchError("hand-written baselines read image files; this source is webdataset shards")
    plan = build_plan(spec)
    if name in ("torchvision", "torchvision-pil"):
        import torch
        return _torchvision_baseline(spec, listing, plan, threads, pil=name == "torchvision-pil",
                                     cuda=torch.cuda.is_available())
    if name in ("dali-cpu", "dali"):
        return _dali_baseline(spec, listing, plan, threads, gpu=name == "dali")
    raise BenchError(f"unknown candidate {kind}:{name}")


def _preimport(config: dict[str, Any]) -> None:
    """Import the heavy libraries before the clock starts: first-batch time is the loader's own."""
    import torch  # noqa: F401
    import torchvision  # noqa: F401
    if "dali" in config["name"]:
        import nvidia.dali  # noqa: F401
        import nvidia.dali.plugin.pytorch  # noqa: F401


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
    gpu_peak = gpu_before
    start = time.perf_counter()
    stream, close = _open_candidate(config)
    try:
        images, indices = next(stream)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        first_batch_s = time.perf_counter() - start
        tick()
        output: dict[str, Any] = {"batch_size": len(indices)}
        if isinstance(images, torch.Tensor):
            output.update(shape=list(images.shape), dtype=str(images.dtype).replace("torch.", ""),
                          device=str(images.device))
        for _ in range(config["warmup"] - 1):
            next(stream)
            tick()
        peak_pss = tree_memory_mib(os.getpid())[1]  # outside the timed windows: reading PSS is slow
        windows = []
        for _ in range(config["repeat"]):
            count = megapixels = 0.0
            cpu0, t0 = tree_cpu_seconds(), time.perf_counter()
            for _ in range(config["batches"]):
                _, indices = next(stream)
                count += len(indices)
                megapixels += float(pixels[indices].sum()) / 1e6
                tick()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            t1, cpu1 = time.perf_counter(), tree_cpu_seconds()
            windows.append({"images": count, "seconds": t1 - t0, "megapixels": megapixels, "cpu_seconds": cpu1 - cpu0})
            used = _gpu_used_mib()
            if used is not None:
                gpu_peak = max(gpu_peak or 0.0, used)
        peak_pss = max(peak_pss, tree_memory_mib(os.getpid())[1])
        wait = None
        if config.get("model_ms"):
            step_s = config["model_ms"] / 1000.0
            waited = stepped = 0.0
            for _ in range(config["batches"]):
                t0 = time.perf_counter()
                next(stream)
                t1 = time.perf_counter()
                time.sleep(step_s)  # the simulated model step: the loader keeps working meanwhile
                waited, stepped = waited + (t1 - t0), stepped + (time.perf_counter() - t1)
                tick()
            wait = {"wait_s": waited, "model_s": stepped, "batches": config["batches"]}
    finally:
        stream.close()
        close()
    gpu_mib = None if gpu_before is None else gpu_peak - gpu_before
    return {"first_batch_s": first_batch_s, "windows": windows, "wait": wait, "output": output, "gpu_mib": gpu_mib,
            "pss_mib": peak_pss}


# ---------------------------------------------------------------------------------------------
# The parent: candidates in fresh processes, monitored

STALL_SECONDS = 300.0  # a candidate that yields no batch for this long is killed and reported


def _kill_group(pid: int) -> None:
    """Kill a candidate's process group (it runs in its own session: its workers share the group)."""
    import signal

    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass

def _run_candidate(candidate: Candidate, base: dict[str, Any], on_batch: Callable[[], None],
                   result: CandidateResult) -> None:
    overrides = dict(base["overrides"])
    if candidate.kind == "backend":
        overrides["loader.workers"] = candidate.threads
    config = {**base, "overrides": overrides, "kind": candidate.kind, "name": candidate.name,
              "threads": candidate.threads}
    with tempfile.TemporaryDirectory(prefix="dali-bridge-bench-") as tmp:
        config_path = Path(tmp, "config.json")
        config_path.write_text(json.dumps(config))
        log_path = Path(tmp, "log.txt")
        read_fd, write_fd = os.pipe()
        env = {**os.environ, PROTOCOL_FD_ENV: str(write_fd)}
        before = loadavg()
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-c", "import sys; from dali_bridge.bench import child_main; sys.exit(child_main())",
                 str(config_path)], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                pass_fds=(write_fd,), env=env, start_new_session=True)
        os.close(write_fd)
        monitor = _MemoryMonitor(process.pid, STALL_SECONDS)
        monitor.start()
        payload = error = None
        try:
            with os.fdopen(read_fd, "r") as channel:
                for line in channel:
                    kind, value = json.loads(line)
                    monitor.last_activity = time.monotonic()
                    if kind == "batch":
                        on_batch()
                    elif kind == "result":
                        payload = value
                    elif kind == "error":
                        error = value
            returncode = process.wait()
        except BaseException:  # Ctrl-C or a broken pipe: take the candidate's workers down too
            _kill_group(process.pid)
            process.wait()
            raise
        finally:
            monitor.stop()
            # Worker processes the candidate left behind (its exit skips teardown) would go on
            # decoding prefetched batches while the next candidate is timed: end them now.
            _kill_group(process.pid)
        after = loadavg()
        if monitor.stalled:
            error = f"no batch for {STALL_SECONDS:.0f} s: killed"
            payload = None
        if payload is None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-15:]
            result.error = (error or f"process exited with status {returncode}") + \
                ("\n    " + "\n    ".join(tail) if tail and not error else "")
            return
    result.windows += payload["windows"]
    result.first_batch_s.append(payload["first_batch_s"])
    result.peak_rss_mib = max(result.peak_rss_mib, monitor.peak_rss)
    result.pss_mib = max(result.pss_mib, payload["pss_mib"])
    if payload["gpu_mib"] is not None:
        result.gpu_mib = max(result.gpu_mib or 0.0, payload["gpu_mib"])
    if payload["wait"]:
        result.wait.append(payload["wait"])
    result.output = payload["output"]
    if before and after:
        result.loadavg.append((before[0], after[0]))


def default_baselines(backends: Sequence[str]) -> list[str]:
    """The decode ceiling plus the hand-written counterpart of each backend measured."""
    names = ["ceiling"]
    for backend in backends:
        if backend in BASELINE_NAMES and backend not in names:
            names.append(backend)
    return names


def candidates_for(backends: Sequence[str], baselines: Sequence[str], threads: Sequence[int]) -> list[Candidate]:
    """Every candidate, grouped by thread count: references first, then the bridge's backends."""
    found = []
    for count in threads:
        found += [Candidate("ceiling", "decode", count)] if "ceiling" in baselines else []
        found += [Candidate("baseline", name, count) for name in BASELINE_NAMES if name in baselines]
        found += [Candidate("backend", name, count) for name in backends]
    return found


@dataclass
class BenchReport:
    """The run: machine, settings, one row per candidate (see :meth:`CandidateResult.summary`)."""
    machine: dict[str, Any]
    settings: dict[str, Any]
    data: dict[str, Any]
    rows: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        return {"format": "dali-bridge-bench/1", "machine": self.machine, "settings": self.settings,
                "data": self.data, "results": self.rows}


def run_bench(file: str | Path, *, backends: Sequence[str], baselines: Sequence[str], threads: Sequence[int],
              batches: int = 8, warmup: int = 3, repeat: int = 4, rounds: int = 1, model_ms: float | None = None,
              overrides: dict[str, Any] | None = None, progress: bool = True) -> BenchReport:
    """Measure every candidate at every thread count (see the module docstring).

    ``batches``: batches per timed window (default 8); ``warmup``: batches discarded first,
    including the first batch (default 3, at least 1); ``repeat``: timed windows per process
    (default 4); ``rounds``: fresh processes per candidate, interleaved across candidates
    (default 1); ``model_ms``: simulated model step per batch in milliseconds (default none).
    """
    from .sources import list_source
    from .spec import load_spec

    if batches < 1 or repeat < 1 or warmup < 1 or rounds < 1:
        raise ValueError("batches, repeat, warmup and rounds must each be at least 1")
    overrides = dict(overrides or {})
    spec = load_spec(file, overrides)
    listing = list_source(spec.source)
    pixels = source_pixels(listing)
    machine = machine_description()
    candidates = candidates_for(backends, baselines, threads)
    results = {c: CandidateResult(c) for c in candidates}
    per_process = warmup + batches * repeat + (batches if model_ms else 0)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=per_process * len(candidates) * rounds, unit="batch", desc="bench", dynamic_ncols=True,
                   leave=False, disable=None)
    with tempfile.TemporaryDirectory(prefix="dali-bridge-bench-") as tmp:
        pixels_path = str(Path(tmp, "pixels.npy"))
        np.save(pixels_path, pixels)
        base = {"file": str(Path(file).resolve()), "overrides": overrides, "pixels": pixels_path, "batches": batches,
                "warmup": warmup, "repeat": repeat, "model_ms": model_ms}
        try:
            for _ in range(rounds):
                for candidate in candidates:
                    if results[candidate].error:
                        continue
                    if bar is not None:
                        bar.set_description(f"{candidate.label} x{candidate.threads}")
                    _run_candidate(candidate, base, (lambda: bar.update(1)) if bar is not None else (lambda: None),
                                   results[candidate])
        finally:
            if bar is not None:
                bar.close()
    rows = [results[c].summary(model_ms) for c in candidates]
    add_ratios(rows)
    settings = {"pipeline": str(file), "pipeline_name": spec.name, "batch_size": spec.batch_size,
                "backends": list(backends), "baselines": list(baselines), "threads": list(threads),
                "batches": batches, "warmup": warmup, "repeat": repeat, "rounds": rounds, "model_ms": model_ms,
                "overrides": overrides,
                "model_ms_method": "measured: the consumer sleeps model_ms after each batch and times its waits"
                if model_ms else None}
    data = {"root": listing.root, "images": len(listing), "classes": len(listing.classes),
            "mean_megapixels": float(pixels.mean() / 1e6) if len(pixels) else 0.0}
    machine["loadavg_at_end"] = loadavg()
    return BenchReport(machine, settings, data, rows)


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """``vs_ceiling_pct`` (images/s over the decode ceiling at the same thread count) and
    ``vs_baseline`` (over the matching hand-written baseline at the same thread count)."""
    by_key = {(r["kind"], r["name"], r["threads"]): r for r in rows if "images_per_s" in r}
    for row in rows:
        if "images_per_s" not in row:
            continue
        ceiling = by_key.get(("ceiling", "decode", row["threads"]))
        if ceiling and row["kind"] != "ceiling":
            row["vs_ceiling_pct"] = 100.0 * row["images_per_s"] / ceiling["images_per_s"]
        if row["kind"] == "backend":
            baseline = by_key.get(("baseline", row["name"], row["threads"]))
            if baseline:
                row["vs_baseline"] = row["images_per_s"] / baseline["images_per_s"]


# ---------------------------------------------------------------------------------------------
# Output: the table and the plot

TABLE_COLUMNS = [("candidate", "candidate"), ("threads", "threads"), ("images_per_s", "img/s"),
                 ("spread_pct", "spread %"), ("megapixels_per_s", "MP/s"), ("cpu_ms_per_image", "CPU ms/img"),
                 ("peak_rss_mib", "peak RSS MiB"), ("pss_mib", "PSS MiB"),
                 ("first_batch_s", "first batch s"), ("vs_ceiling_pct", "% of ceiling"),
                 ("vs_baseline", "x hand-written")]


def table_columns(rows: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The table's columns; GPU memory and data-wait columns only where some row has them."""
    columns = list(TABLE_COLUMNS)
    if any(r.get("gpu_mib") is not None for r in rows):
        columns.append(("gpu_mib", "GPU MiB"))
    if any("data_wait_pct" in r for r in rows):
        columns.append(("data_wait_pct", "data wait %"))
    return columns


def format_report(report: BenchReport) -> str:
    """The plain-text table printed at the end of ``bench``, with the machine and the errors."""
    from .timing import format_table

    m = report.machine
    lines = [f"{report.settings['pipeline_name']} on {m['cpu_model']} ({m['cpu_cores_available']} cores, "
             f"{m['ram_gib']} GiB RAM{', ' + ', '.join(m['gpus']) if m['gpus'] else ''}); "
             f"{report.data['images']} images, mean {report.data['mean_megapixels']:.3f} MP; batch "
             f"{report.settings['batch_size']}, {report.settings['repeat'] * report.settings['rounds']} windows x "
             f"{report.settings['batches']} batches; 1-min load average {_first(m['loadavg_at_start'])} at start, "
             f"{_first(m['loadavg_at_end'])} at end"]
    good = [r for r in report.rows if "error" not in r]
    rows = [{**r, "threads": str(r["threads"])} for r in good]
    lines.append(format_table(rows, table_columns(good)))
    if report.settings.get("model_ms"):
        lines.append(f"data wait %: share of step time the consumer waited for data with a "
                     f"{report.settings['model_ms']:g} ms model step per batch ({report.settings['model_ms_method']})")
    for row in report.rows:
        if "error" in row:
            lines.append(f"{row['candidate']} x{row['threads']}: FAILED: {row['error']}")
    return "\n".join(lines)


def _first(values: list[float]) -> str:
    return f"{values[0]:.2f}" if values else "n/a"


_COLOURS = {"decode-only ceiling": (120, 120, 120), "hand-written torchvision": (243, 166, 148),
            "hand-written torchvision (PIL)": (250, 205, 160), "hand-written DALI (cpu)": (160, 200, 160),
            "hand-written DALI (gpu)": (150, 190, 230), "torchvision": (214, 69, 65), "dali-cpu": (46, 139, 87),
            "dali": (40, 100, 190)}


def plot_report(report: BenchReport, out: str | Path, width: int = 1100, height: int = 560) -> None:
    """Bar chart (Pillow): images/s per candidate, grouped by thread count, with min–max whiskers;
    the decode-only ceiling of each group drawn as a dashed line across it."""
    from PIL import Image, ImageDraw, ImageFont

    rows = [r for r in report.rows if "images_per_s" in r]
    if not rows:
        raise BenchError("nothing to plot: every candidate failed")
    groups = sorted({r["threads"] for r in rows})
    bars = [label for label in dict.fromkeys(r["candidate"] for r in rows if r["kind"] != "ceiling")]
    top = max(r["images_per_s_max"] for r in rows) * 1.12
    step = 10 ** math.floor(math.log10(top / 5)) if top > 0 else 1
    step = next(s * step for s in (1, 2, 5, 10) if top / (s * step) <= 7)

    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    try:
        font, small = ImageFont.load_default(size=14), ImageFont.load_default(size=12)
    except TypeError:  # Pillow < 10.1: one bitmap size
        font = small = ImageFont.load_default()
    left, right, top_px, bottom = 80, width - 250, 50, height - 60
    scale = (bottom - top_px) / top
    y_of = lambda value: bottom - value * scale  # noqa: E731
    title = f"{report.settings['pipeline_name']}: images/s, {report.machine['cpu_model']}, " \
            f"{report.machine['cpu_cores_available']} cores"
    draw.text((left, 8), title, fill="black", font=font)
    loads = [r for r in rows if "load_before" in r]
    if loads:
        draw.text((left, 28), f"median of {rows[0].get('windows', '?')} windows per bar; 1-min load average "
                  f"{min(r['load_before'] for r in loads):.2f}-{max(r['load_after'] for r in loads):.2f}",
                  fill=(90, 90, 90), font=small)
    tick = 0.0
    while tick <= top:
        y = y_of(tick)
        draw.line([(left, y), (right, y)], fill=(230, 230, 230))
        draw.text((left - 8, y), f"{tick:,.0f}", fill="black", font=small, anchor="rm")
        tick += step
    draw.line([(left, top_px), (left, bottom), (right, bottom)], fill="black")
    group_w = (right - left) / len(groups)
    bar_w = group_w * 0.8 / max(1, len(bars))
    for g, threads in enumerate(groups):
        x0 = left + g * group_w + group_w * 0.1
        draw.text((left + (g + 0.5) * group_w, bottom + 18), f"{threads} thread{'s' if threads != 1 else ''} / worker"
                  f"{'s' if threads != 1 else ''}", fill="black", font=font, anchor="mm")
        for b, label in enumerate(bars):
            row = next((r for r in rows if r["candidate"] == label and r["threads"] == threads), None)
            if row is None:
                continue
            xa, xb = x0 + b * bar_w + 2, x0 + (b + 1) * bar_w - 2
            draw.rectangle([xa, y_of(row["images_per_s"]), xb, bottom], fill=_COLOURS.get(label, (100, 100, 100)))
            xm = (xa + xb) / 2
            draw.line([(xm, y_of(row["images_per_s_min"])), (xm, y_of(row["images_per_s_max"]))], fill="black")
            label_y = y_of(max(row["images_per_s"], row["images_per_s_max"])) - 4  # above the whisker
            draw.text((xm, label_y), f"{row['images_per_s']:,.0f}", fill="black", font=small, anchor="mb")
        ceiling = next((r for r in rows if r["kind"] == "ceiling" and r["threads"] == threads), None)
        if ceiling:
            y = y_of(ceiling["images_per_s"])
            x = left + g * group_w + 4
            while x < left + (g + 1) * group_w - 4:
                draw.line([(x, y), (min(x + 8, left + (g + 1) * group_w - 4), y)], fill=(60, 60, 60), width=2)
                x += 14
            draw.text((left + (g + 1) * group_w - 6, y - 3), f"decode ceiling {ceiling['images_per_s']:,.0f}",
                      fill=(60, 60, 60), font=small, anchor="rb")
    legend_y = top_px
    for label in bars:
        draw.rectangle([right + 20, legend_y, right + 34, legend_y + 14], fill=_COLOURS.get(label, (100, 100, 100)))
        draw.text((right + 40, legend_y), label, fill="black", font=small)
        legend_y += 22
    draw.line([(right + 20, legend_y + 7), (right + 34, legend_y + 7)], fill=(60, 60, 60), width=2)
    draw.text((right + 40, legend_y), "decode-only ceiling", fill="black", font=small)
    draw.text((right + 20, legend_y + 30), "whiskers: min-max over windows", fill=(90, 90, 90), font=small)
    image.save(out, format="PNG")
