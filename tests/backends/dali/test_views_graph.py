"""The DALI graph of a pipeline with views: one decoder whose output feeds every view's branch, each
branch slicing its own crop window from the whole decode and ending in its group's finish."""
from __future__ import annotations

import re

import numpy as np
import pytest

from dali_bridge.pipeline.plan import build_plan
from dali_bridge.spec.pipeline import spec_from_dict

pytest.importorskip("nvidia.dali", reason="needs DALI (nvidia-dali-cuda120) to define DALI graphs")

SPEC = {"version": 1, "source": {"type": "folder", "root": "/nonexistent"}, "batch_size": 2,
        "views": {"global": {"count": 2, "ops": [{"random_resized_crop": {"size": 32}}, "horizontal_flip",
                                                 {"gaussian_blur": {"kernel_size": 5}}, "normalize"]},
                  "local": {"count": 3, "ops": [{"random_resized_crop": {"size": 16}}, "normalize"]}},
        "outputs": ["views", "label"]}


def graph(monkeypatch, *, gpu: bool):
    """(operator name, its inputs, its outputs) of each operator the real builder defines, without DALI's
    backend build (which needs CUDA for gpu), and the feeder's count of each view's outputs."""
    from nvidia.dali.pipeline import Pipeline

    from dali_bridge.backends.dali.feed import Feeder, build_pipeline
    from dali_bridge.data.sources.listing import Listing

    spec = spec_from_dict(SPEC)
    plan = build_plan(spec)
    listing = Listing(("/nonexistent/a.jpg",), np.zeros(1, dtype=np.int64), ("a",), "/nonexistent")
    feeder = Feeder(spec, listing, plan, gpu=gpu)
    with monkeypatch.context() as patch:
        patch.setattr(Pipeline, "build", lambda self: self._build_graph())
        pipe = build_pipeline(spec, plan, feeder, gpu=gpu, device_id=0 if gpu else None, threads=1)
    ops = []
    for instance in pipe._ops:
        text = str(instance.spec)
        name = re.match(r"OpSpec for (\S+):", text).group(1)
        sections = re.split(r"\n\s*(Inputs|Outputs|Arguments):\n", text)
        found = dict(zip(sections[1::2], sections[2::2]))
        ops.append((name, found.get("Inputs", "").split(), found.get("Outputs", "").split()))
    return ops, list(feeder.views.arity)


@pytest.mark.parametrize("gpu", [False, True], ids=["dali-cpu", "dali"])
def test_one_decoder_output_feeds_a_branch_per_view(monkeypatch, gpu):
    ops, arity = graph(monkeypatch, gpu=gpu)
    decoders = [op for op in ops if op[0].startswith("decoders__")]
    assert [op[0] for op in decoders] == ["decoders__Image"]   # the whole image, once: no window alone
    decoded = decoders[0][2][0]
    slices = [op for op in ops if op[0] == "Slice"]
    assert len(slices) == 5 and all(decoded in op[1] for op in slices)   # each view cuts its window from it
    assert sum(op[0] == "CropMirrorNormalize" for op in ops) >= 5
    assert len(arity) == 5 and all(count >= 1 for count in arity)


def test_each_views_columns_are_its_own_under_its_number():
    from dali_bridge.backends.dali.feed import Feeder
    from dali_bridge.data.sources.listing import Listing

    spec = spec_from_dict(SPEC)
    plan = build_plan(spec)
    listing = Listing(("/nonexistent/a.jpg",), np.zeros(1, dtype=np.int64), ("a",), "/nonexistent")
    names = Feeder(spec, listing, plan, gpu=False).views.names
    assert names[0] == "encoded" and names.count("encoded") == 1
    assert {name.split("/")[0] for name in names[1:]} == {"0", "1", "2", "3", "4"}
    assert "0/0.crop.anchor" in names and "4/0.crop.anchor" in names
