"""Where a batch's CPU goes on the ``torchvision`` backend, stage by stage: the split
:meth:`~dali_bridge.loader.loader.Loader.stats` reports under ``stages``.

Measured in the user's own run as thread CPU time, not wall-clock: a stage's figure is its own work,
whatever else shares the cores, and waiting costs none. The worker's stages are timed in the worker
and travel with its batch (a few floats); the receipt and the finish are timed in the loader's
process. Two clock reads per stage and sample, a microsecond or so against the decode's milliseconds.
"""
from __future__ import annotations

from typing import Any

# The stages of the ``torchvision`` backend's work on a batch, in the order a batch meets them: where
# its CPU goes, against the decode alone (the decode-only ceiling of ``dali-bridge bench``).
STAGES = {
    "sample_python": "worker: reading, header checks and draws (per-sample Python)",
    "decode": "worker: decode",
    "kernels": "worker: the steps' kernels",
    "collate": "worker: copy into the shared batch (collate)",
    "transfer": "loader's process: receiving the batch from the worker (transfer between processes)",
    "finish": "loader's process: the finish (uint8 to the output dtype, normalise)",
}


class StageTimes:
    """CPU seconds per stage of a batch (:data:`STAGES`), summed over the batches handed over: thread
    CPU time, so a stage's figure is its own work whatever else shares the cores (a worker's stages
    are timed in the worker and travel with its batch). Two clock reads per stage and sample."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)
        self.images = 0

    def add(self, seconds: dict[str, float], *, images: int = 0) -> None:
        for stage, value in seconds.items():
            self.seconds[stage] += value
        self.images += images

    def figures(self) -> dict[str, Any]:
        """``cpu_ms_per_image`` per stage, each stage's ``share`` of their sum, and what each stage is."""
        per_image = {stage: (1e3 * value / self.images if self.images else None)
                     for stage, value in self.seconds.items()}
        total = sum(self.seconds.values())
        return {"images": self.images,
                "cpu_ms_per_image": per_image,
                "share": {stage: (value / total if total > 0 else None) for stage, value in self.seconds.items()},
                "stages": dict(STAGES)}
