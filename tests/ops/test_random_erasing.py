"""random_erasing: torchvision's RandomErasing after normalize — its box and fill exactly (F.erase),
its draws distributed as torchvision's own, the same erased pixels on every backend."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tests.helpers.backends import MEAN, STD, needs_cpu_backends

from dali_bridge.ops.registry import OPS
from dali_bridge.ops.erasing import Erase
from dali_bridge.loader.placement import placement
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.loader.post_finish import PostFinish
from dali_bridge.pipeline.sampling import uniforms
from dali_bridge.spec.pipeline import spec_from_dict
from dali_bridge.spec.problems import SpecError

DRAWS = 10_000
ERASING = OPS["random_erasing"]


def spec_of(ops: list, **keys):
    return spec_from_dict({"version": 1, "source": {"type": "folder", "root": "/nonexistent"}, "batch_size": 4,
                           "ops": ops, **keys})


def params(**given) -> dict:
    return spec_of([{"center_crop": 8}, "normalize", {"random_erasing": given}]).ops[2].params


def test_random_erasing_runs_after_the_finish_on_the_loaders_device_for_every_backend():
    plan = build_plan(spec_of([{"center_crop": 8}, "normalize", {"random_erasing": 0.25}]))
    assert [step.name for step in plan.steps] == ["center_crop"]  # executors stop at the finish
    assert [(n, step.name) for n, step in plan.post_finish] == [(2, "random_erasing")]
    assert plan.post_finish[0][1].params == {"probability": 0.25, "scale": [0.02, 0.33], "ratio": [0.3, 3.3],
                                             "value": 0.0}
    for backend, device in (("dali", "cuda"), ("dali-cpu", "cpu"), ("torchvision", "cpu")):
        last = placement(plan, backend)[-1]
        assert (last.stage, last.device) == ("random_erasing", device) and last.implementation.startswith("torch:")
    assert placement(plan, "torchvision", cuda=True)[-1].device == "cuda"


@pytest.mark.parametrize("ops, path, snippet", [
    ([{"center_crop": 8}, "random_erasing", "normalize"], "ops[1]", "put a normalize"),
    ([{"center_crop": 8}, "random_erasing"], "ops[1]", "put a normalize"),
    ([{"center_crop": 8}, {"normalize": {"dtype": "uint8"}}, "random_erasing"], "ops[2]", "dtype float32 or float16"),
    ([{"center_crop": 8}, "normalize", "mixup", "random_erasing"], "ops[3]", "batch-level ops come last"),
    ([{"center_crop": 8}, "normalize", "random_erasing", "horizontal_flip"], "ops[1]",
     "ops[3] 'horizontal_flip' follows it"),
    ([{"center_crop": 8}, "normalize", {"random_erasing": {"value": "noise"}}], "ops[2].random_erasing.value",
     "or 'random'"),
    ([{"center_crop": 8}, "normalize", {"random_erasing": {"scale": [0.5, 1.5]}}], "ops[2].random_erasing.scale",
     "(0.0, 1.0]"),
])
def test_misplaced_or_malformed_random_erasing_is_refused_with_the_key_path(ops, path, snippet):
    with pytest.raises(SpecError) as caught:
        spec_of(ops, outputs=["image", "target"])
    messages = [p.message for p in caught.value.problems if p.path == path]
    assert any(snippet in m for m in messages), caught.value.problems


def test_value_accepts_a_number_three_channels_or_random():
    assert params(value=1)["value"] == 1.0
    assert params(value=[0.1, 0.2, 0.3])["value"] == [0.1, 0.2, 0.3]
    assert params(value="random")["value"] == "random"


@pytest.mark.parametrize("value", [0.0, [1.5, -0.5, 0.25], "random"])
def test_erased_image_equals_torchvision_erase_given_the_same_box(value):
    from torchvision.transforms.v2 import functional as F

    p = params(probability=1.0, value=value)
    images = torch.randn(6, 3, 20, 24)
    u = uniforms(seed=3, epoch=1, indices=np.arange(6), stream=9, count=ERASING.draws)
    expected, erased = [], 0
    for n in range(6):
        erase = ERASING.sample(p, u[n], 20, 24)[0]
        assert erase.apply
        erased += erase.height * erase.width > 0
        fill = ERASING.value(p, erase, 3)
        if value == "random":  # torchvision's draw: a [C, h, w] float32 normal tensor
            assert fill.shape == (3, erase.height, erase.width)
        expected.append(F.erase(images[n], erase.top, erase.left, erase.height, erase.width, fill))
        ERASING.apply(p, images[n], (erase,))
    assert erased == 6
    assert torch.equal(images, torch.stack(expected))


def test_noise_is_a_pure_function_of_the_draw():
    p = params(probability=1.0, value="random")
    erase = Erase(True, 1, 2, 5, 4, noise_seed=12345)
    assert torch.equal(ERASING.value(p, erase, 3), ERASING.value(p, erase, 3))
    assert not torch.equal(ERASING.value(p, erase, 3), ERASING.value(p, Erase(True, 1, 2, 5, 4, noise_seed=1), 3))


def _torchvision_boxes(p: dict, height: int, width: int) -> list[tuple[int, int, int, int] | None]:
    """torchvision's RandomErasing with its own RNG: the box of each call, None where nothing is erased."""
    from torchvision.transforms import v2

    transform = v2.RandomErasing(p=p["probability"], scale=p["scale"], ratio=p["ratio"], value=0)
    torch.manual_seed(0)
    image = torch.zeros(3, height, width)
    boxes = []
    for _ in range(DRAWS):
        if torch.rand(1) >= transform.p:  # _RandomApplyTransform.forward's early return
            boxes.append(None)
            continue
        made = transform.make_params([image])
        boxes.append(None if made["v"] is None else (made["i"], made["j"], made["h"], made["w"]))
    return boxes


def _bridge_boxes(p: dict, height: int, width: int) -> list[tuple[int, int, int, int] | None]:
    u = uniforms(seed=11, epoch=0, indices=np.arange(DRAWS), stream=4, count=ERASING.draws)
    found = []
    for row in u:
        erase = ERASING.sample(p, row, height, width)[0]
        found.append((erase.top, erase.left, erase.height, erase.width) if erase.apply else None)
    return found


@pytest.mark.parametrize("size, given", [
    ((224, 224), {"probability": 0.25}),
    ((32, 48), {"probability": 0.5, "scale": [0.1, 0.6], "ratio": [0.5, 2.0]}),
    ((6, 6), {"probability": 1.0, "scale": [0.3, 0.9]}),  # many attempts fail: the "no erase" outcome
])
def test_boxes_follow_torchvision_random_erasing_over_ten_thousand_draws(size, given):
    from scipy.stats import ks_2samp

    p = params(**given)
    ours, theirs = _bridge_boxes(p, *size), _torchvision_boxes(p, *size)
    rate_ours, rate_theirs = (sum(b is not None for b in boxes) / DRAWS for boxes in (ours, theirs))
    pooled = (rate_ours + rate_theirs) / 2
    sigma = math.sqrt(max(pooled * (1 - pooled), 1e-12) * 2 / DRAWS)
    assert abs(rate_ours - rate_theirs) <= 3 * sigma + 1e-12, (rate_ours, rate_theirs)
    ours, theirs = [b for b in ours if b], [b for b in theirs if b]
    for name, measure in (("area", lambda b: b[2] * b[3]), ("ratio", lambda b: b[2] / max(b[3], 1)),
                          ("top", lambda b: b[0] / max(size[0] - b[2], 1)),
                          ("left", lambda b: b[1] / max(size[1] - b[3], 1))):
        statistic = ks_2samp([measure(b) for b in ours], [measure(b) for b in theirs])
        assert statistic.pvalue > 1e-3, (name, statistic)


def test_hwc_output_is_erased_like_chw():
    chw_plan = build_plan(spec_of([{"center_crop": 8}, "normalize", {"random_erasing": 1.0}]))
    hwc_plan = build_plan(spec_of([{"center_crop": 8}, {"normalize": {"layout": "HWC"}}, {"random_erasing": 1.0}]))
    images = torch.randn(4, 3, 8, 8)
    labels, indices = torch.zeros(4, dtype=torch.int64), np.arange(4)
    chw, _ = PostFinish(chw_plan, 0, 0, num_classes=1).apply(images.clone(), labels, indices, epoch=0, number=0)
    hwc, _ = PostFinish(hwc_plan, 0, 0, num_classes=1).apply(images.permute(0, 2, 3, 1).contiguous(), labels,
                                                             indices, epoch=0, number=0)
    assert not torch.equal(chw, images)
    assert hwc.is_contiguous() and torch.equal(hwc, chw.permute(0, 2, 3, 1))


@needs_cpu_backends
def test_dali_cpu_and_torchvision_erase_the_same_boxes_with_the_same_noise(sample_root):
    from dali_bridge.tools.compare import compare

    pipeline = {"version": 1, "source": {"type": "folder", "root": str(sample_root)}, "batch_size": 8, "seed": 2,
                "ops": [{"random_resized_crop": 48}, {"normalize": {"mean": MEAN, "std": STD}},
                        {"random_erasing": {"probability": 0.6, "value": "random"}}],
                "loader": {"workers": 1}}
    result = compare(pipeline, ("dali-cpu", "torchvision"), batches=None)
    assert result.passed, result.problems
    assert result.output("image").max_abs <= 1.0 + 1e-3
    plan = build_plan(spec_from_dict(pipeline))
    u = uniforms(seed=2, epoch=0, indices=np.arange(37), stream=plan.post_finish[0][0] + 1, count=ERASING.draws)
    erased = [ERASING.sample(plan.post_finish[0][1].params, row, 48, 48)[0].apply for row in u]
    assert 0 < sum(erased) < 37  # both outcomes occurred in the compared epoch
