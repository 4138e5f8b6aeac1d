"""Run one pipeline on two backends over the same samples and measure how far their batches differ.

Because the loader owns the sample order and every random parameter, two backends must yield the
same samples in the same order, with the same crop windows and flips; only resampling and
decoding arithmetic may differ. :func:`compare` checks that, batch by batch:

* ``index``, ``label`` and ``valid`` must be identical (the sample order is compared even when the
  pipeline does not output ``index``: it is always requested for the comparison);
* images are compared in uint8 levels of 255: float outputs are mapped back through the plan's
  normalisation (``level = (value * std + mean) * 255``), so a bound holds for any mean/std;
  per channel in the normalised units that is the level bound divided by ``255 * std``.

Default bounds (:data:`CPU_BOUNDS`): max |Δ| ≤ 1 level and mean |Δ| ≤ 0.25 level, plus one
float16 step when the output is float16. A comparison involving the GPU ``dali`` backend with
nvJPEG (``decode.device: mixed``) uses :data:`NVJPEG_BOUNDS` (see there for the reasoning).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
import torch

from .compare_bounds import CPU_BOUNDS, FLOAT32_SLACK, Bounds, default_bounds, float16_step
from ..ops.finish import Finish
from ..pipeline.plan import Plan, build_plan
from ..util.quoting import safe_name
from ..spec.pipeline import PipelineSpec, coerce_spec
from ..util.wording import plural

if TYPE_CHECKING:  # PIL is imported where pictures are drawn, not at import time
    from PIL import Image


def default_pair() -> tuple[str, str]:
    """The backends a user switches between: ``dali`` (GPU) vs ``torchvision`` where the GPU backend
    runs, else ``dali-cpu`` vs ``torchvision``."""
    from ..loader.select import available_backends

    return ("dali", "torchvision") if "dali" in available_backends() else ("dali-cpu", "torchvision")


@dataclass(frozen=True)
class SampleDiff:
    """One sample's image difference (uint8 levels): where it is and how far the backends differ."""
    index: int
    path: str
    batch: int
    row: int
    max_abs: float
    mean_abs: float
    output: str = "image"  # which image output: ``image``, or with views ``views[n]``


@dataclass(frozen=True)
class OutputDiff:
    """The difference of one output over every compared sample.

    Images: ``max_abs``/``mean_abs`` in uint8 levels, ``normalized_max_abs`` per channel in the
    output's own units. Exact outputs: ``mismatches`` counts differing entries.
    """
    name: str
    exact: bool
    max_abs: float
    mean_abs: float
    mismatches: int
    passed: bool
    limit: str
    max_limit: float = 0.0  # images: the max bound applied, levels (float16 step included)
    normalized_max_abs: tuple[float, ...] = ()
    normalized_limit: tuple[float, ...] = ()


@dataclass
class CompareResult:
    """What :func:`compare` found; ``passed`` is the verdict, :meth:`format` the report."""
    pipeline: str
    backends: tuple[str, str]
    batches: int
    samples: int
    bounds: Bounds
    outputs: list[OutputDiff]
    worst: list[SampleDiff]
    problems: list[str] = field(default_factory=list)
    saved: list[Path] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems and all(output.passed for output in self.outputs)

    def output(self, name: str) -> OutputDiff:
        return next(o for o in self.outputs if o.name == name)

    def format(self) -> str:
        a, b = self.backends
        lines = [f"compare {self.pipeline}: {a} vs {b}, {plural(self.batches, 'batch')}, "
                 f"{plural(self.samples, 'sample')}",
                 f"bounds: max |Δ| <= {self.bounds.max_abs:g} level, mean |Δ| <= {self.bounds.mean_abs:g} level "
                 f"of 255 ({self.bounds.reason})"]
        for output in self.outputs:
            verdict = "PASS" if output.passed else "FAIL"
            if output.exact:
                lines.append(f"  {output.name:<6} {verdict}  {output.mismatches} mismatching entries ({output.limit})")
            else:
                lines.append(f"  {output.name:<6} {verdict}  max |Δ| {output.max_abs:.3f}  mean |Δ| "
                             f"{output.mean_abs:.4f} levels ({output.limit})")
                if output.normalized_max_abs:
                    per_channel = ", ".join(f"{v:.5f} (<= {lim:.5f})" for v, lim in
                                            zip(output.normalized_max_abs, output.normalized_limit))
                    lines.append(f"         normalised units, max |Δ| per channel R, G, B: {per_channel}")
        for problem in self.problems:
            lines.append(f"  FAIL  {problem}")
        if self.worst:
            lines.append("worst samples (index, batch/row, max |Δ|, mean |Δ|, file):")
            for item in self.worst:
                view = "" if item.output == "image" else f"  ({item.output})"
                lines.append(f"  {item.index:>6}  {item.batch}/{item.row:<4} {item.max_abs:8.3f} {item.mean_abs:8.4f}  "
                             f"{safe_name(item.path)}{view}")
        for path in self.saved:
            lines.append(f"saved {path}")
        lines.append("PASS" if self.passed else "FAIL")
        return "\n".join(lines)


def to_levels(image: torch.Tensor, finish: Finish) -> np.ndarray:
    """A batch as float32 NCHW in uint8 levels (0-255): undoes the plan's dtype, layout and normalisation."""
    array = image.detach().to("cpu")
    if finish.layout == "HWC":
        array = array.permute(0, 3, 1, 2)
    array = array.to(torch.float32).numpy()
    if finish.dtype == "uint8":
        return array
    mean = np.asarray(finish.mean, dtype=np.float32).reshape(1, 3, 1, 1)
    std = np.asarray(finish.std, dtype=np.float32).reshape(1, 3, 1, 1)
    return (array * std + mean) * np.float32(255.0)


# The most worst samples kept as pixels for saving: each is held (both backends' images, float32)
# until the end, e.g. 100 x 2 x 3x224x224 x 4 bytes = 120 MB; 1024x1024 outputs take 2.5 GB.
MAX_SAVED_WORST = 100


class _ImageStats:
    """One image output's running difference (levels) over the batches: its largest and summed |Δ|,
    the largest per channel in its own units, and the mean |Δ| map's running sum."""

    def __init__(self, finish: Finish):
        self.finish = finish
        self.max, self.sum, self.count = 0.0, 0.0, 0
        self.normalized_max = np.zeros(3)
        self.delta_map: np.ndarray | None = None

    def add(self, delta: np.ndarray) -> None:
        if self.finish.dtype != "uint8":
            std = np.asarray(self.finish.std).reshape(1, 3, 1, 1)
            self.normalized_max = np.maximum(self.normalized_max, (delta / (255.0 * std)).max(axis=(0, 2, 3)))
        self.max = max(self.max, float(delta.max()) if delta.size else 0.0)
        self.sum += float(delta.sum(dtype=np.float64))
        self.count += delta.size
        per_pixel = delta.max(axis=1)  # N H W: the largest channel difference
        self.delta_map = per_pixel.sum(axis=0) if self.delta_map is None else self.delta_map + per_pixel.sum(axis=0)


class _Accumulator:
    """Running statistics over batches: per-output totals, the worst samples, a mean |Δ| map.

    ``images``: the image outputs and the finish of each (``{"image": finish}``; with views, one
    ``views[n]`` per view); every other output must be identical."""

    def __init__(self, images: Mapping[str, Finish], paths: Sequence[str], keep_worst: int, keep_pixels: bool):
        self.images = {name: _ImageStats(finish) for name, finish in images.items()}
        self.paths = paths
        self.keep_worst = keep_worst
        self.keep_pixels = keep_pixels
        self.samples = 0
        self.mismatches: dict[str, int] = {}
        self.heap: list[tuple[float, float, int, SampleDiff, Any]] = []
        self.counter = 0

    @property
    def delta_map(self) -> np.ndarray | None:
        """The first image output's mean |Δ| map's running sum (what ``mean_delta.png`` shows)."""
        return next(iter(self.images.values())).delta_map if self.images else None

    def add(self, number: int, a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> None:
        for name in a:
            if name in self.images:
                continue
            left, right = a[name].detach().cpu(), b[name].detach().cpu()
            differing = int((left != right).sum()) if left.shape == right.shape else max(left.numel(), right.numel())
            self.mismatches[name] = self.mismatches.get(name, 0) + differing
        indices = a["index"].cpu().numpy()
        for name, stats in self.images.items():
            if name in a:
                self._add_image(number, name, stats, to_levels(a[name], stats.finish), to_levels(b[name], stats.finish),
                                indices)
        self.samples += len(indices)

    def _add_image(self, number: int, name: str, stats: _ImageStats, levels_a: np.ndarray, levels_b: np.ndarray,
                   indices: np.ndarray) -> None:
        delta = np.abs(levels_a - levels_b)
        stats.add(delta)
        for row in range(delta.shape[0]):
            sample_max = float(delta[row].max())
            sample_mean = float(delta[row].mean())
            index = int(indices[row])
            item = SampleDiff(index, self.paths[index] if 0 <= index < len(self.paths) else "?", number, row,
                              sample_max, sample_mean, name)
            pixels = (levels_a[row], levels_b[row]) if self.keep_pixels else None
            self.counter += 1
            # Rank by max (to 0.01 level: float16/float32 noise must not reorder), then by mean.
            entry = (round(sample_max, 2), sample_mean, -self.counter, item, pixels)
            if len(self.heap) < self.keep_worst:
                heapq.heappush(self.heap, entry)
            elif self.keep_worst and entry[:3] > self.heap[0][:3]:
                heapq.heapreplace(self.heap, entry)

    def worst(self) -> list[tuple[SampleDiff, Any]]:
        return [(entry[3], entry[4]) for entry in sorted(self.heap, key=lambda e: e[:3], reverse=True)]


def compare_batches(batches_a: Iterable[Sequence[torch.Tensor]], batches_b: Iterable[Sequence[torch.Tensor]],
                    outputs: Sequence[str], finish: Finish, paths: Sequence[str], *,
                    bounds: Bounds = CPU_BOUNDS, backends: tuple[str, str] = ("a", "b"), pipeline: str = "pipeline",
                    max_batches: int | None = None, keep_worst: int = 5, save_dir: str | Path | None = None,
                    worst_to_save: int | None = None, images: Mapping[str, Finish] | None = None) -> CompareResult:
    """Compare two streams of batches (tuples in the order of ``outputs``, which must include ``index``).

    ``images``: the image outputs and each one's finish (default ``{"image": finish}``); with views,
    one ``views[n]`` per view, each compared under the bounds.

    ``paths`` maps sample indices to files (for the report). Stops after ``max_batches`` (default:
    when both streams end); a stream ending before the other is a failure. ``save_dir`` writes
    side-by-side PNGs of the ``worst_to_save`` worst samples (default: the ``keep_worst`` listed, so
    the report and the folder show the same samples) and a mean |Δ| heat map.
    """
    if "index" not in outputs:
        raise ValueError("compare_batches needs the 'index' output to match samples")
    worst_to_save = keep_worst if worst_to_save is None else worst_to_save
    if save_dir is not None and worst_to_save > MAX_SAVED_WORST:
        raise ValueError(f"at most {MAX_SAVED_WORST} worst samples can be saved (each is held as pixels until "
                         f"the end), found {worst_to_save}")
    images = dict(images) if images is not None else {"image": finish}
    acc = _Accumulator({name: found for name, found in images.items() if name in outputs}, paths,
                       keep_worst=max(keep_worst, worst_to_save if save_dir else 0), keep_pixels=save_dir is not None)
    number, problems = _walk_batches(acc, iter(batches_a), iter(batches_b), outputs=outputs, backends=backends,
                                     max_batches=max_batches)
    result = CompareResult(pipeline, backends, number, acc.samples, bounds,
                           _verdicts(acc, outputs=outputs, bounds=bounds),
                           [item for item, _ in acc.worst()][:keep_worst], problems)
    if save_dir is not None:
        image = next((output for output in result.outputs if not output.exact), None)
        result.saved = save_pictures(Path(save_dir), acc, backends, worst_to_save,
                                     bound=image.max_limit if image is not None else bounds.max_abs)
    return result


def _batch_problem(number: int, named_a: dict, named_b: dict, images: Iterable[str]) -> tuple[str | None, bool]:
    """Why two batches cannot be compared (and whether that stops the walk), or (None, False)."""
    index_a, index_b = named_a["index"].cpu(), named_b["index"].cpu()
    if index_a.shape != index_b.shape or not torch.equal(index_a, index_b):
        return (f"batch {number}: the backends yielded different samples (indices {index_a.tolist()[:8]}"
                f"... vs {index_b.tolist()[:8]}...); pixels of different samples are not compared"), True
    for name in images:
        if name in named_a and named_a[name].shape != named_b[name].shape:
            return (f"batch {number}: {name} shapes differ: {tuple(named_a[name].shape)} vs "
                    f"{tuple(named_b[name].shape)}"), True
        if name in named_a and named_a[name].dtype != named_b[name].dtype:
            return f"batch {number}: {name} dtypes differ: {named_a[name].dtype} vs {named_b[name].dtype}", False
    return None, False


def _walk_batches(acc: "_Accumulator", iter_a: Iterator, iter_b: Iterator, *, outputs: Sequence[str],
                  backends: tuple[str, str], max_batches: int | None) -> tuple[int, list[str]]:
    """Feed both streams' batches to ``acc`` side by side: (batches compared, problems found)."""
    problems: list[str] = []
    number = 0
    while max_batches is None or number < max_batches:
        batch_a, batch_b = next(iter_a, None), next(iter_b, None)
        if batch_a is None and batch_b is None:
            break
        if batch_a is None or batch_b is None:
            ended, other = (backends[0], backends[1]) if batch_a is None else (backends[1], backends[0])
            problems.append(f"{ended} ended after {plural(number, 'batch')} while {other} yielded more")
            break
        named_a, named_b = dict(zip(outputs, batch_a)), dict(zip(outputs, batch_b))
        problem, stop = _batch_problem(number, named_a, named_b, acc.images)
        if problem:
            problems.append(problem)
        if stop:
            break
        acc.add(number, named_a, named_b)
        number += 1
    if number == 0 and not problems:
        problems.append("no batch to compare")
    return number, problems


def _verdicts(acc: "_Accumulator", *, outputs: Sequence[str], bounds: Bounds) -> list[OutputDiff]:
    """Each output's difference and whether it is within ``bounds`` (every output but the images: identical)."""
    results: list[OutputDiff] = []
    for name in outputs:
        stats = acc.images.get(name)
        if stats is None:
            count = acc.mismatches.get(name, 0)
            results.append(OutputDiff(name, True, float(count > 0), 0.0, count, count == 0, "must be identical"))
            continue
        finish = stats.finish
        tolerance = float16_step(finish)
        max_limit = bounds.max_abs + tolerance
        mean = stats.sum / stats.count if stats.count else 0.0
        normalized: tuple[float, ...] = ()
        normalized_limit: tuple[float, ...] = ()
        if finish.dtype != "uint8":
            normalized = tuple(float(v) for v in stats.normalized_max)
            normalized_limit = tuple((max_limit + FLOAT32_SLACK) / (255.0 * s) for s in finish.std)
        limit = f"<= {max_limit:g} max, <= {bounds.mean_abs:g} mean"
        if tolerance:
            limit += f"; max includes one float16 step, {tolerance:.3f} level"
        results.append(OutputDiff(name, False, stats.max, mean, 0,
                                  stats.max <= max_limit + FLOAT32_SLACK and mean <= bounds.mean_abs,
                                  limit, max_limit, normalized, normalized_limit))
    return results


def compare(pipeline: PipelineSpec | str | Path | Mapping, backends: Sequence[str] = ("dali-cpu", "torchvision"),
            *, overrides: Mapping[str, Any] | list[str] | None = None, batches: int | None = 5,
            bounds: Bounds | None = None, keep_worst: int = 5, save_dir: str | Path | None = None,
            worst_to_save: int | None = None, progress: bool = False) -> CompareResult:
    """Run ``pipeline`` on two backends (default ``dali-cpu`` vs ``torchvision``) and compare the batches.

    ``batches``: how many batches of the first epoch to compare (default 5; None = the whole
    epoch). ``bounds`` default to :func:`default_bounds`. The ``index`` output is added for the
    comparison when the pipeline lacks it. Raises what :func:`~dali_bridge.loader.loader.build_loader`
    raises when a backend cannot run the pipeline. ``progress``: batches compared so far on stderr.
    """
    from ..loader.loader import build_loader
    from ..util.progress import progress as progress_bar

    if len(backends) != 2:
        raise ValueError(f"compare needs exactly two backends, found {list(backends)}")
    for name in backends:
        backend_and_executor(name)  # refused before anything is built
    spec = coerce_spec(pipeline, overrides)
    outputs = list(spec.outputs) if "index" in spec.outputs else list(spec.outputs) + ["index"]
    spec = spec.replace(outputs=outputs)
    plan: Plan = build_plan(spec)
    # With views, each view is an image output of its own: views[0], views[1], ... each under its finish.
    images = ({f"views[{view.view}]": view.finish for view in plan.views} if plan.views else {"image": plan.finish})
    compared = [name for output in outputs for name in (images if output == "views" else [output])]
    loaders = []
    try:
        for name in backends:  # inside the try: the first closes if the second cannot be built
            backend, executor = backend_and_executor(name)
            loaders.append(build_loader(spec.replace(**{"loader.executor": executor}) if executor else spec, backend))
        names = tuple(f"{loader.backend}:{executor}" if executor else loader.backend
                      for loader, (_, executor) in zip(loaders, map(backend_and_executor, backends)))
        total = len(loaders[0]) if batches is None else min(batches, len(loaders[0]))
        with progress_bar(total=total, unit="batch", description=f"compare {spec.name} ({names[0]} vs {names[1]})",
                          enabled=progress) as bar:
            return compare_batches(_counted(_cpu(loaders[0]), bar), _cpu(loaders[1]), compared, plan.finish,
                                   loaders[0].listing.paths, bounds=bounds or default_bounds(spec, names),
                                   backends=names, pipeline=spec.name, max_batches=batches, keep_worst=keep_worst,
                                   save_dir=save_dir, worst_to_save=worst_to_save, images=images)
    finally:
        for loader in loaders:
            loader.close()


def backend_and_executor(name: str) -> tuple[str, str | None]:
    """``torchvision:ray`` → (``torchvision``, ``ray``): a backend, and the ``loader.executor`` that runs
    it when named after a colon (else the pipeline's own)."""
    from ..spec.model import BACKENDS, EXECUTORS

    backend, _, executor = name.partition(":")
    if backend not in BACKENDS or (executor and executor not in EXECUTORS):
        raise ValueError(f"unknown backend {name!r}: expected one of {', '.join(b for b in BACKENDS if b != 'auto')}, "
                         f"optionally with a loader.executor after a colon ({', '.join(EXECUTORS)}), e.g. "
                         f"torchvision:ray")
    return backend, executor or None


def _cpu(batches: Iterable[Sequence[Any]]) -> Iterator[tuple[torch.Tensor, ...]]:
    """Each batch on the host, a list of views laid out flat (``views[0]``, ``views[1]``, ... in its place)."""
    for batch in batches:
        yield tuple(t.detach().to("cpu") for item in batch for t in (item if isinstance(item, list) else [item]))


def _counted(batches: Iterator, bar) -> Iterator:
    """``batches``, counting each one on ``bar`` as it arrives (the walk may stop without asking past
    the last one it compares)."""
    for batch in batches:
        bar.update(1)
        yield batch


# --------------------------------------------------------------------------------------------
# Pictures

def _heat(delta: np.ndarray, top: float) -> np.ndarray:
    """|Δ| (H, W) → RGB uint8: black (0) → red → yellow → white (>= ``top`` levels)."""
    t = np.clip(delta / top, 0.0, 1.0)
    red = np.clip(t * 3.0, 0, 1)
    green = np.clip(t * 3.0 - 1.0, 0, 1)
    blue = np.clip(t * 3.0 - 2.0, 0, 1)
    return (np.stack([red, green, blue], axis=-1) * 255.0 + 0.5).astype(np.uint8)


MEAN_MAP_OVER = 8.0  # the mean map's white: this many times the bound


def _bound_heat(delta: np.ndarray, bound: float) -> np.ndarray:
    """|Δ| (H, W) → RGB uint8 against the comparison's ``bound`` (levels): within it, black → mid grey
    (ordinary rounding reads as a dim field, not an alarm); beyond it, red → yellow → white at
    :data:`MEAN_MAP_OVER` × the bound."""
    bound = max(bound, 1e-6)
    grey = (np.clip(delta / bound, 0.0, 1.0) * 96.0 + 0.5).astype(np.uint8)
    beyond = _heat(1.0 / 3.0 + 2.0 / 3.0 * np.clip((delta - bound) / ((MEAN_MAP_OVER - 1.0) * bound), 0.0, 1.0), 1.0)
    return np.where((delta > bound)[..., None], beyond, np.repeat(grey[..., None], 3, axis=-1))


def _labelled(panels: list[np.ndarray], captions: list[str], title: str, scale: int) -> "Image.Image":
    from PIL import Image, ImageDraw

    height, width = panels[0].shape[:2]
    gap, header = 8, 34
    canvas = Image.new("RGB", (len(panels) * (width * scale + gap) - gap, height * scale + header), (40, 40, 40))
    draw = ImageDraw.Draw(canvas)
    draw.text((4, 2), title, fill=(255, 255, 255))
    for n, (panel, caption) in enumerate(zip(panels, captions)):
        x = n * (width * scale + gap)
        image = Image.fromarray(panel)
        if scale != 1:
            image = image.resize((width * scale, height * scale), Image.NEAREST)
        canvas.paste(image, (x, header))
        draw.text((x + 4, 18), caption, fill=(255, 255, 0))
    return canvas


def save_pictures(folder: Path, acc: _Accumulator, backends: tuple[str, str], count: int,
                  bound: float = CPU_BOUNDS.max_abs) -> list[Path]:
    """Write ``worst_<n>_sample_<index>.png`` (backend a | backend b | |Δ| heat map) and ``mean_delta.png``,
    the mean |Δ| at each pixel position coloured against ``bound``, the max bound in levels
    (:func:`_bound_heat`)."""
    folder.mkdir(parents=True, exist_ok=True)
    saved: list[Path] = []
    for rank, (item, pixels) in enumerate(acc.worst()[:count], start=1):
        if pixels is None:
            continue
        left, right = pixels
        delta = np.abs(left - right).max(axis=0)
        top = max(4.0, float(delta.max()))
        panels = [np.clip(left.transpose(1, 2, 0) + 0.5, 0, 255).astype(np.uint8),
                  np.clip(right.transpose(1, 2, 0) + 0.5, 0, 255).astype(np.uint8), _heat(delta, top)]
        scale = 2 if max(delta.shape) < 320 else 1
        picture = _labelled(panels, [backends[0], backends[1], f"|diff|: black 0 .. white {top:g} levels"],
                            f"sample {item.index} (batch {item.batch} row {item.row}): max {item.max_abs:.2f}, "
                            f"mean {item.mean_abs:.3f} levels  {Path(item.path).name}", scale)
        path = folder / f"worst_{rank}_sample_{item.index}.png"
        picture.save(path)
        saved.append(path)
    if acc.delta_map is not None and acc.samples:
        mean_map = acc.delta_map / acc.samples
        scale = 2 if max(mean_map.shape) < 320 else 1
        caption = (f"grey: within the bound (black 0 .. grey {bound:g} level); red .. white: beyond "
                   f"({bound:g} .. {MEAN_MAP_OVER * bound:g} levels); largest {float(mean_map.max()):.2f}")
        picture = _labelled([_bound_heat(mean_map, bound)], [caption],
                            f"mean |diff| per pixel over {plural(acc.samples, 'sample')}", scale)
        path = folder / "mean_delta.png"
        picture.save(path)
        saved.append(path)
    return saved
