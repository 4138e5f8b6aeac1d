"""The per-sample core both executors share: the size it reads from a header is the size the
decoder gives (the steps are computed before decoding), and a failure of what an executor loads
meets the same error policy as a failure to read."""
from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.paths import TRAIN
from dali_bridge.backends.per_sample import SampleCore
from dali_bridge.errors import ImageError
from dali_bridge.data.sources.images import decode_checked
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.pipeline.sampling import BatchTask
from dali_bridge.data.sources.local import list_source
from dali_bridge.spec.pipeline import coerce_spec


def core_for(root, on_error: str):
    spec = coerce_spec(TRAIN, {"source": {"type": "folder", "root": str(root)}, "loader.on_error": on_error})
    listing = list_source(spec.source)
    return SampleCore(spec, listing, build_plan(spec)), listing


def task_of(indices: list[int]) -> BatchTask:
    count = len(indices)
    return BatchTask(number=0, epoch=0, indices=np.array(indices, dtype=np.int64), valid=np.ones(count, dtype=bool),
                     repeats=np.zeros(count, dtype=np.int64))


def test_the_size_read_from_the_header_is_the_decoded_size_for_every_corpus_image(corpus_root):
    _, listing = core_for(corpus_root, "skip")
    for index in range(len(listing)):
        data, size = listing.read_sized(index)
        assert tuple(decode_checked(data).shape[-2:]) == size, listing.paths[index]


@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_a_load_that_refuses_a_sample_meets_the_error_policy(sample_root, on_error):
    core, listing = core_for(sample_root, on_error)

    def load(data: bytes, info, steps: list) -> int:
        if len(loaded) == 1:
            loaded.append(None)
            raise ImageError("decode failed: refused by the test")
        loaded.append(len(data))
        return len(data)

    loaded: list = []
    batch = core.prepare(task_of([4, 9, 2]), load)
    if on_error == "skip":
        outcome = batch.outcome
        assert outcome.rows == [0, 2] and len(batch.items) == len(batch.steps) == 2 and outcome.error is None
        assert [(s.index, s.path, s.epoch, s.reason) for s in outcome.skipped] == \
            [(9, listing.paths[9], 0, "decode failed: refused by the test")]
    else:
        assert batch.outcome.rows == [] and batch.items == [] and batch.outcome.skipped == []
        assert (batch.outcome.error.index, batch.outcome.error.path, batch.outcome.error.reason) == \
            (9, listing.paths[9], "decode failed: refused by the test")
        assert len(loaded) == 2  # stops at the failing sample: the rest is not read


def test_the_torchvision_dataset_pickles_for_workers_started_by_spawn(sample_root):
    import pickle

    import torch

    from dali_bridge import build_loader

    with build_loader(TRAIN, "torchvision", overrides={"source": {"type": "folder", "root": str(sample_root)},
                                                       "loader.workers": 1}) as loader:
        dataset = pickle.loads(pickle.dumps(loader._executor.dataset))
        task, size = loader.tasks(0)[0], loader.plan.output_size
        item = dataset.batch(task, lambda count: torch.empty((count, 3, *size), dtype=torch.uint8))
        assert item["outcome"].rows == list(range(len(task.indices)))


def test_the_batch_outcome_is_what_the_loader_is_handed_or_the_error_it_raises():
    from dali_bridge.backends.base import BatchOutcome, SkippedSample
    from dali_bridge.errors import SampleError

    task = BatchTask(number=3, epoch=1, indices=np.array([7, 8, 9]), valid=np.array([True, True, False]),
                     repeats=np.array([0, 1, 0]))
    skipped = [SkippedSample(8, "b.jpg", 1, "broken")]
    raw = BatchOutcome(task, [0, 2], skipped).raw_batch("images")
    assert raw.image == "images" and raw.skipped is skipped
    assert (raw.indices.tolist(), raw.valid.tolist(), raw.repeats.tolist()) == ([7, 9], [True, False], [0, 0])
    assert BatchOutcome(task, [0, 2]).kept == 2 and BatchOutcome(task).kept == 0
    error = SampleError(8, "b.jpg", "broken")
    with pytest.raises(SampleError) as info:
        BatchOutcome(task, skipped=skipped, error=error).raw_batch(None)
    assert info.value is error
