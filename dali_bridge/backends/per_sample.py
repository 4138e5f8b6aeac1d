"""The per-sample core below every executor: what must be identical on every backend, once.

For each sample of a batch, in order: read its bytes (the byte cap, the structural checks and
its decoded size from one walk of the header), its draws, its steps' concrete parameters for
that size (:func:`~dali_bridge.pipeline.sampling.sample_steps`), then what the executor needs of it —
``load(data, info, steps)``: the encoded bytes for DALI's graph, the decoded and transformed image on
the torchvision backend. A sample that fails any of these (an :class:`ImageError`) meets the
``on_error`` policy here: skipped and counted, or the batch's error under ``raise``. An executor
only decides where and how in parallel it calls :meth:`SampleCore.prepare`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Generic, TypeVar

from ..data.sources.formats import ImageInfo
from ..errors import ImageError, SampleError
from ..pipeline.plan import Plan
from ..pipeline.sampling import BatchTask, draws, sample_steps
from ..data.sources.listing import Listing
from ..spec.pipeline import PipelineSpec
from .base import SkippedSample

Item = TypeVar("Item")


@dataclass
class PreparedBatch(Generic[Item]):
    """One task's samples as the core left them: the kept rows (positions in the task), what
    ``load`` made of each and each one's steps; the skipped samples; under ``on_error: raise`` the
    first sample's error instead (no rows then: the batch is not delivered)."""
    rows: list[int] = field(default_factory=list)
    items: list[Item] = field(default_factory=list)
    steps: list[list] = field(default_factory=list)
    skipped: list[SkippedSample] = field(default_factory=list)
    error: SampleError | None = None


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

    def prepare(self, task: BatchTask, load: Callable[[bytes, ImageInfo, list], Item]) -> PreparedBatch[Item]:
        """The task's samples through the core, ``load(data, info, steps)`` making each kept one's item
        (``info``: the header's :class:`~dali_bridge.data.sources.formats.ImageInfo`).
        ``load`` may raise :class:`ImageError` (a decoder refusing the bytes): that sample meets the
        error policy like one that could not be read."""
        sample_draws = draws(self.plan, self.seed, task.epoch, task.indices, task.repeats)
        batch: PreparedBatch[Item] = PreparedBatch()
        self.listing.prefetch(task.indices.tolist())  # shards at a URL: the batch's GETs in flight together
        for row, index in enumerate(task.indices.tolist()):
            try:
                data, info, steps = self._read(index, {name: values[row] for name, values in sample_draws.items()})
                item = load(data, info, steps)
            except ImageError as exc:  # unreadable, or no geometry fits it (too thin for a max_size resize)
                path = self.listing.paths[index]
                if self.on_error == "raise":
                    # Returned, not raised: the executor raises it when the consumer reaches this batch,
                    # after the batches before it (which may be prepared later, in another thread).
                    return PreparedBatch(skipped=batch.skipped, error=SampleError(index, path, str(exc)))
                batch.skipped.append(SkippedSample(index, path, task.epoch, str(exc)))
                continue
            batch.rows.append(row)
            batch.items.append(item)
            batch.steps.append(steps)
        return batch

    def _read(self, index: int, sample_draws: dict) -> tuple[bytes, ImageInfo, list]:
        """Sample ``index``'s checked bytes (as the decoders get them: see
        :meth:`~dali_bridge.data.sources.local.Listing.read_info`), their header and its steps for its decoded size."""
        if index in self.bad:
            reason, signature = self.bad[index]
            if self.listing.signature(index) == signature:
                raise ImageError(reason)
            del self.bad[index]  # replaced or gone since it failed: read it again
        data, info = self.listing.read_info(index)
        return data, info, sample_steps(self.plan, *info.size, sample_draws)
