"""The per-sample core below every executor: what must be identical on every backend, once.

For each sample of a batch, in order: read its bytes (the byte cap, the structural checks and
its decoded size from one walk of the header), its draws, its steps' concrete parameters for
that size (:func:`~dali_bridge.pipeline.sampling.sample_steps`; with views, each view's from its own
draws: :class:`ViewSteps`), then what the executor needs of it —
``load(data, info, steps)``: the encoded bytes for DALI's graph, the decoded and transformed image on
the torchvision backend. A sample that fails any of these (an :class:`ImageError`) meets the
``on_error`` policy here, in :meth:`SampleCore.refusal`: skipped and counted, or the batch's error under
``raise`` — as does a sample the DALI executor finds its graph cannot decode. An executor only decides
where and how in parallel it calls :meth:`SampleCore.prepare`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generic, Sequence, TypeVar

from ..data.sources.formats import ImageInfo
from ..errors import ImageError, SampleError
from ..pipeline.plan import Plan
from ..pipeline.sampling import BatchTask, draws, sample_steps
from ..data.sources.listing import Listing
from ..spec.pipeline import PipelineSpec
from .base import BatchOutcome, SkippedSample

Item = TypeVar("Item")


class ViewSteps(list):
    """A sample's steps in a pipeline with views: one :func:`~dali_bridge.pipeline.sampling.sample_steps`
    list per view, in output order (:attr:`~dali_bridge.pipeline.plan.Plan.view_plans`), each from the
    view's own draws; the one decode every view is cut from is the executor's."""


@dataclass
class PreparedBatch(Generic[Item]):
    """One task's samples as the core left them: its :class:`BatchOutcome` (the kept rows, the skipped
    samples, or the sample error under ``raise``), and for each kept row what ``load`` made of it and
    its steps."""
    outcome: BatchOutcome
    items: list[Item] = field(default_factory=list)
    steps: list[list] = field(default_factory=list)


class SampleCore:
    """Reads, sizes, draws and loads the samples of a task under the loader's error policy.

    ``bad`` holds samples an executor found undecodable after reading them (a failed DALI run):
    index → (reason, the file's signature then). Such a sample is refused with that reason
    without being read again while its file stays as it was, and read again once it changed.
    """

    def __init__(self, spec: PipelineSpec, listing: Listing, plan: Plan):
        self.listing, self.plan = listing, plan
        self.seed, self.on_error = spec.seed, spec.loader.on_error
        self.bad: dict[int, tuple[str, tuple[int, int] | None]] = {}

    def prepare(self, task: BatchTask, load: Callable[[bytes, ImageInfo, list], Item],
                ahead: Sequence = ()) -> PreparedBatch[Item]:
        """The task's samples through the core, ``load(data, info, steps)`` making each kept one's item
        (``info``: the header's :class:`~dali_bridge.data.sources.formats.ImageInfo`).
        ``load`` may raise :class:`ImageError` (a decoder refusing the bytes): that sample meets the
        error policy like one that could not be read. ``ahead``: the sample indices of the batches this
        thread prepares next, read ahead where the source can (shards at a URL)."""
        view_draws = [draws(view, self.seed, task.epoch, task.indices, task.repeats) for view in self.plan.view_plans]
        rows: list[int] = []
        skipped: list[SkippedSample] = []
        items: list[Item] = []
        kept_steps: list[list] = []
        # shards at a URL: the batch's GETs in flight together, then the next batches'
        self.listing.prefetch(task.indices.tolist(), ahead)
        for row, index in enumerate(task.indices.tolist()):
            try:
                data, info, steps = self._read(index, [{name: values[row] for name, values in found.items()}
                                                       for found in view_draws])
                item = load(data, info, steps)
            except ImageError as exc:  # unreadable, or no geometry fits it (too thin for a max_size resize)
                refused = self.refusal(task, index, str(exc))
                if isinstance(refused, SampleError):
                    # Returned, not raised: the executor raises it when the consumer reaches this batch,
                    # after the batches before it (which may be prepared later, in another thread).
                    return PreparedBatch(BatchOutcome(task, skipped=skipped, error=refused))
                skipped.append(refused)
                continue
            rows.append(row)
            items.append(item)
            kept_steps.append(steps)
        return PreparedBatch(BatchOutcome(task, rows, skipped), items, kept_steps)

    def refusal(self, task: BatchTask, index: int, reason: str) -> SkippedSample | SampleError:
        """The ``on_error`` policy, for every backend and every way a sample fails (read, checks, decode,
        geometry, or a DALI graph that cannot decode it): sample ``index`` of ``task`` cannot be used
        for ``reason``. Under ``skip``, the record its batch's outcome counts it by; under ``raise``, the
        error that stops the epoch at its batch. Returned, not raised: the caller knows when to raise."""
        path = self.listing.paths[index]
        if self.on_error == "raise":
            return SampleError(index, path, reason)
        return SkippedSample(index, path, task.epoch, reason)

    def _read(self, index: int, view_draws: list[dict]) -> tuple[bytes, ImageInfo, list]:
        """Sample ``index``'s checked bytes (as the decoders get them: see
        :meth:`~dali_bridge.data.sources.listing.Listing.read_info`), their header and its steps for its
        decoded size (``view_draws``: the sample's draws for each view's plan; with views, the steps of
        each view as :class:`ViewSteps`)."""
        if index in self.bad:
            reason, signature = self.bad[index]
            if self.listing.signature(index) == signature:
                raise ImageError(reason)
            del self.bad[index]  # replaced or gone since it failed: read it again
        data, info = self.listing.read_info(index)
        if not self.plan.views:
            return data, info, sample_steps(self.plan, *info.size, view_draws[0])
        return data, info, ViewSteps(sample_steps(view, *info.size, found)
                                     for view, found in zip(self.plan.views, view_draws))
