"""dali-cpu decodes only the window a torch tail's first random resized crop keeps (the recipes under
``parity: exact``, where the crop runs in torch before a policy): the same pixels as the full decode."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.backends import MEAN, STD, needs_cpu_backends, plan_of
from tests.helpers.paths import TRAIN
from dali_bridge import build_loader
from dali_bridge.backends.dali.plan import TAIL_WINDOW_COLUMNS, dali_plan
from dali_bridge.ops.geometry import Crop
from dali_bridge.loader.placement import placement

POLICY_OPS = [{"random_resized_crop": {"size": 64}}, {"horizontal_flip": 0.5},
              {"trivial_augment_wide": {"interpolation": "bilinear"}},
              {"normalize": {"mean": MEAN, "std": STD}}]


def test_the_window_of_a_tails_first_crop_is_decoded_alone_on_dali_cpu_only():
    plan = plan_of(POLICY_OPS)
    assert not dali_plan(plan).steps and dali_plan(plan).torch_tail[0].name == "random_resized_crop"
    assert dali_plan(plan).tail_window_columns(gpu=False) == TAIL_WINDOW_COLUMNS
    assert dali_plan(plan).tail_window_columns(gpu=True) is None  # nvJPEG's window decode is not pinned
    assert placement(plan, "dali-cpu")[1].implementation.startswith("fn.decoders.image_slice")
    assert placement(plan, "dali")[1].implementation == "fn.decoders.image"
    # a crop in the graph reads its own window (the existing path); a tail that starts later reads none
    assert dali_plan(plan_of(POLICY_OPS, parity="fast")).tail_window_columns(gpu=False) is None
    later = plan_of([{"resize": 100}, *POLICY_OPS])
    assert dali_plan(later).tail_window_columns(gpu=False) is None


def test_a_graph_that_runs_no_step_before_the_tail_ends_with_its_decoder_on_both_devices():
    # the decoder's images are uint8 HWC already: a crop_mirror_normalize there would only copy them
    plan = plan_of(POLICY_OPS)
    assert dali_plan(plan).finish_step is None
    for backend in ("dali", "dali-cpu"):
        graph = [s.stage for s in placement(plan, backend) if not s.implementation.startswith("torch")]
        assert graph == ["read", "decode"], backend
    # a step in the graph before the tail (a flip folded into it, a border to finish) keeps the finish
    kept = dali_plan(plan_of(POLICY_OPS, parity="fast")).finish_step
    assert kept is not None and kept.params["dtype"] == "uint8" and kept.params["layout"] == "HWC"


@needs_cpu_backends
def test_the_feeder_sends_each_crop_window_and_the_tail_crops_the_whole_decoded_window(sample_root):
    from dali_bridge.backends.dali.feed import Feeder
    from dali_bridge.pipeline.plan import build_plan
    from dali_bridge.pipeline.sampling import rank_batches
    from dali_bridge.data.sources.local import list_source
    from dali_bridge.spec.pipeline import coerce_spec

    spec = coerce_spec(TRAIN, {"source": {"type": "folder", "root": str(sample_root)}, "batch_size": 4,
                               "ops": POLICY_OPS})
    plan, listing = build_plan(spec), list_source(spec.source)
    task = rank_batches(len(listing), 4, 0, 0)[0]
    whole, _ = Feeder(spec, listing, plan, gpu=True).prepare(task)   # no window columns on the GPU
    inputs, windowed = Feeder(spec, listing, plan, gpu=False).prepare(task)
    assert len(inputs) == len(whole) + 2
    anchors, shapes = inputs[-2:]
    _, full = Feeder(spec, listing, plan, gpu=True).prepare(task)
    for n, (steps, original) in enumerate(zip(windowed.tail, full.tail)):
        crop = original[0][0][0]
        assert isinstance(crop, Crop)
        assert anchors[n].tolist() == [crop.top, crop.left] and shapes[n].tolist() == [crop.height, crop.width]
        assert steps[0][0][0] == Crop(0, 0, crop.height, crop.width) and steps[0][1] == (crop.height, crop.width)
        assert steps[0][0][1:] == original[0][0][1:] and steps[1:] == original[1:]
    assert anchors.dtype == shapes.dtype == np.int32


@needs_cpu_backends
@pytest.mark.parametrize("ops", [POLICY_OPS, [{"random_resized_crop": {"size": 48}}, {"color_jitter": {
    "brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1}}, {"normalize": {"dtype": "uint8"}}]],
    ids=["trivial-augment", "color-jitter"])
@pytest.mark.parametrize("images", ["sample_root", "corpus_root"])  # the corpus: EXIF orientations, tiny images...
def test_dali_cpu_with_the_window_decoded_equals_torchvision_bit_for_bit(request, images, ops):
    root = request.getfixturevalue(images)
    overrides = {"source": {"type": "folder", "root": str(root)}, "batch_size": 8, "loader.workers": 1,
                 "ops": ops, "outputs": ["image", "index"]}
    batches = {}
    for backend in ("dali-cpu", "torchvision"):
        with build_loader(TRAIN, backend, overrides=overrides) as loader:
            if backend == "dali-cpu":
                assert loader._executor.feeder.columns.window == TAIL_WINDOW_COLUMNS
            batches[backend] = [(image.clone(), index.clone()) for image, index in loader]
    assert len(batches["dali-cpu"]) == len(batches["torchvision"]) > 1
    for (image, index), (theirs, their_index) in zip(batches["dali-cpu"], batches["torchvision"]):
        assert torch.equal(index, their_index)
        assert torch.equal(image, theirs)
