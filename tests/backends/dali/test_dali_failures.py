"""How the DALI backend answers a failed batch: which batch is blamed, what is re-raised, and that
every retry is bounded — on ``dali-cpu`` here (the executor's loop is the same on ``dali``).

* A batch with nothing to feed (every sample skipped; a sample error under ``raise``) never
  reaches DALI, so its outcome cannot depend on a stand-in image fitting the plan.
* A failure after DALI's run (the torch tail, DLPack, a CUDA allocation) is that batch's and is
  raised as what it is, with no culprit search.
* DALI's own message (the operator and what it encountered) is kept when no sample is to blame.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.backends import backend_params
from dali_bridge import build_loader
from dali_bridge.backends.dali import executor as dali_backend
from dali_bridge.errors import SampleError
from tests.helpers.hostile import break_file, tiny_jpeg, write_image_folder

DALI_CPU = backend_params(["dali-cpu"])
BOTH = backend_params(["dali-cpu", "torchvision"])
MAX_BUILDS = 4  # a bounded run builds its pipeline at most a few times; an endless retry loop hits this


def blur_first(root: Path, *, on_error: str) -> dict[str, Any]:
    """A plan that cannot take a small image: a 17-pixel blur before any resize."""
    return {"version": 1, "name": "blur-first", "source": {"type": "folder", "root": str(root)}, "batch_size": 4,
            "seed": 1, "ops": [{"gaussian_blur": {"kernel_size": 17, "sigma": 2.0}}, {"center_crop": 16},
                               {"normalize": {"dtype": "uint8"}}],
            "outputs": ["image", "label", "index"],
            "loader": {"workers": 1, "on_error": on_error, "shuffle": False}}


@pytest.fixture
def counted_builds(monkeypatch) -> list[int]:
    """Counts DALI pipeline builds and fails the test past MAX_BUILDS instead of looping for ever."""
    builds: list[int] = []
    real_build = dali_backend.build_pipeline

    def build(*args, **kwargs):
        builds.append(1)
        if len(builds) > MAX_BUILDS:
            raise AssertionError(f"DALI pipeline built {len(builds)} times: a retry loop that does not end")
        return real_build(*args, **kwargs)

    monkeypatch.setattr(dali_backend, "build_pipeline", build)
    return builds


def epoch_indices(loader) -> list[list[int]]:
    return [index.tolist() for _, _, index in loader]


@pytest.mark.parametrize("backend", BOTH)
@pytest.mark.parametrize("bad", [[4, 5, 6, 7], [8, 9]], ids=["middle-batch", "last-batch"])
def test_an_all_bad_batch_under_skip_ends_with_one_skip_each_when_the_plan_cannot_take_a_tiny_image(
        tmp_path, counted_builds, backend, bad):
    files = write_image_folder(tmp_path / "data", classes=2, per_class=5)   # 10 samples: batches 4, 4, 2
    for index in bad:
        break_file(files[index], "cut_halfway")
    loader = build_loader(blur_first(tmp_path / "data", on_error="skip"), backend)
    kept = [i for i in range(10) if i not in bad]
    expected = [batch for batch in (kept[:4], kept[4:8], kept[8:]) if batch]
    for _ in range(2):   # the next epoch too: the end of the first one rewound the pipeline
        assert epoch_indices(loader) == expected
    assert sorted(item.index for item in loader.skipped) == sorted(bad * 2)
    assert len(counted_builds) <= 1   # no DALI run failed: the empty batch never reached DALI
    loader.close()


@pytest.mark.parametrize("backend", BOTH)
def test_a_valid_image_too_small_for_the_plan_under_raise_is_reported_not_a_stand_in(tmp_path, counted_builds,
                                                                                     backend):
    files = write_image_folder(tmp_path / "data", classes=2, per_class=5)
    files[4].write_bytes(tiny_jpeg(4, 6, 6))   # decodes fine; too small for a 17-pixel blur
    loader = build_loader(blur_first(tmp_path / "data", on_error="raise"), backend)
    seen = []
    with pytest.raises(SampleError) as info:
        for _, _, index in loader:
            seen.append(index.tolist())
    assert seen == [[0, 1, 2, 3]]
    assert (info.value.index, info.value.path) == (4, str(files[4]))
    assert info.value.reason.startswith("too small to blur") and "6x6" in info.value.reason.replace(" ", "")
    assert "8x8" not in str(info.value)
    loader.close()


class TailFailure(Exception):
    """What a failing torch-tail kernel (or a CUDA allocation) raises after DALI ran the batch."""


@pytest.mark.parametrize("backend", DALI_CPU)
@pytest.mark.parametrize("failing", [1, 2], ids=["middle-batch", "last-batch"])  # blaming the next: IndexError
def test_a_failure_converting_a_batch_blames_that_batch_and_is_raised_as_it_is(tmp_path, monkeypatch,
                                                                               counted_builds, backend, failing):
    write_image_folder(tmp_path / "data", classes=2, per_class=6)   # batches [0-3] [4-7] [8-11]
    searched = []
    monkeypatch.setattr(dali_backend.DaliExecutor, "_find_culprits", lambda self, task: searched.append(task) or [])
    real_convert = dali_backend.DaliExecutor._convert

    def convert(self, outputs, batch, sent=None):
        if batch.outcome.task.number == failing:
            raise TailFailure(f"the tail's kernel failed on batch {failing}")
        return real_convert(self, outputs, batch, sent)

    monkeypatch.setattr(dali_backend.DaliExecutor, "_convert", convert)
    loader = build_loader(blur_first(tmp_path / "data", on_error="skip"), backend)
    seen = []
    with pytest.raises(TailFailure, match=f"batch {failing}"):
        for _, _, index in loader:
            seen.append(index.tolist())
    assert seen == [list(range(4 * n, 4 * n + 4)) for n in range(failing)]
    assert loader.state_dict()["batch"] == failing and searched == []   # no culprit search: DALI did not fail
    loader.close()


@pytest.mark.parametrize("backend", DALI_CPU)
def test_a_dali_failure_no_sample_explains_keeps_the_operators_message(tmp_path, monkeypatch, backend):
    files = write_image_folder(tmp_path / "data", classes=2, per_class=6)
    break_file(files[7], "bad_huffman_table")   # passes the header checks: only the decoder fails
    monkeypatch.setattr(dali_backend, "decode_rgb", lambda data: None)   # the culprit search finds nothing
    loader = build_loader(blur_first(tmp_path / "data", on_error="skip"), backend)
    with pytest.raises(dali_backend.DaliBatchError) as info:
        epoch_indices(loader)
    message = str(info.value)
    assert message.startswith("DALI failed on epoch 0 batch 1 (samples [4, 5, 6, 7]), yet each of them reads")
    assert "operator `nvidia.dali.fn.decoders.image" in message and "no longer valid" not in message
    loader.close()


@pytest.mark.parametrize("backend", DALI_CPU)
def test_a_batch_dali_keeps_failing_on_known_culprits_is_raised_after_one_rebuild(tmp_path, monkeypatch,
                                                                                 counted_builds, backend):
    files = write_image_folder(tmp_path / "data", classes=2, per_class=6)
    break_file(files[7], "bad_huffman_table")
    # A culprit search that always names sample 5 (wrongly): skipping it cannot fix the batch.
    monkeypatch.setattr(dali_backend.DaliExecutor, "_find_culprits", lambda self, task: [(5, "blamed")])
    loader = build_loader(blur_first(tmp_path / "data", on_error="skip"), backend)
    with pytest.raises(dali_backend.DaliBatchError, match="epoch 0 batch 1 .*yet each of them reads"):
        epoch_indices(loader)
    assert len(counted_builds) == 2   # the first build, one rebuild skipping sample 5, then the error
    loader.close()


def test_dali_message_keeps_the_operator_and_what_it_encountered():
    text = ("Critical error in pipeline:\nCritical error in pipeline:\nError in CPU operator "
            "`nvidia.dali.fn.decoders.image`,\nwhich was used in the pipeline definition with the following "
            "traceback:\n\n  File \"x.py\", line 6, in g\n    return fn.decoders.image(e)\n\nencountered:\n\n"
            "nvImageCodec failure: '#3'\nCurrent pipeline object is no longer valid.\n"
            "Current pipeline object is no longer valid.")
    assert dali_backend.dali_message(RuntimeError(text)) == ("Error in CPU operator `nvidia.dali.fn.decoders.image`: "
                                                             "nvImageCodec failure: '#3'")
    assert dali_backend.dali_message(ValueError("from the feeder")) == "ValueError: from the feeder"


@pytest.fixture
def refusals(monkeypatch) -> list:
    """Every verdict of the one ``on_error`` function (:meth:`SampleCore.refusal`), in order."""
    from dali_bridge.backends.per_sample import SampleCore

    given: list = []
    real = SampleCore.refusal

    def refusal(self, task, index, reason):
        given.append(real(self, task, index, reason))
        return given[-1]

    monkeypatch.setattr(SampleCore, "refusal", refusal)
    return given


@pytest.mark.parametrize("backend", BOTH)
def test_a_bad_file_and_a_sample_only_dalis_decoder_fails_are_skipped_and_counted_by_the_one_policy(
        tmp_path, refusals, backend):
    files = write_image_folder(tmp_path / "data", classes=2, per_class=6)
    break_file(files[2], "cut_halfway")         # refused by the shared reader, before any decoder
    break_file(files[6], "bad_huffman_table")   # passes the reader: on dali-cpu only DALI's decoder fails
    spec = blur_first(tmp_path / "data", on_error="skip")
    # No blur (DALI's decoder is the only one to fail sample 6); torchvision's batches in this process,
    # where the records are made (workers: 0).
    spec.update(ops=[{"center_crop": 16}, {"normalize": {"dtype": "uint8"}}], loader={**spec["loader"], "workers": 0})
    with build_loader(spec, backend) as loader:
        assert epoch_indices(loader) == [[0, 1, 3], [4, 5, 7], [8, 9, 10, 11]]
        assert [(s.index, s.epoch) for s in loader.skipped] == [(2, 0), (6, 0)]
        # What the loader counts is what the policy returned, the very records: no second accounting.
        assert all(any(record is given for given in refusals) for record in loader.skipped)


@pytest.mark.parametrize("backend", DALI_CPU)
def test_under_raise_a_sample_only_dalis_decoder_fails_raises_the_policys_own_error_with_dalis_cause(
        tmp_path, refusals, backend):
    files = write_image_folder(tmp_path / "data", classes=2, per_class=6)
    break_file(files[6], "bad_huffman_table")
    seen = []
    with build_loader(blur_first(tmp_path / "data", on_error="raise"), backend) as loader:
        with pytest.raises(SampleError) as info:
            for _, _, index in loader:
                seen.append(index.tolist())
    assert seen == [[0, 1, 2, 3]] and info.value.index == 6
    assert info.value is refusals[-1] and "nvidia.dali.fn.decoders" in str(info.value.__cause__)
