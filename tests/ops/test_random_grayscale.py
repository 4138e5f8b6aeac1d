"""random_grayscale: torchvision's RandomGrayscale — torchvision's grey levels (not DALI's colour
conversion) on every backend, and the sampler's rate is torchvision's."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tests.helpers.backends import MEAN, STD, needs_cpu_backends, plan_of, torch_vector_kernels

from dali_bridge.loader.placement import placement
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.spec.pipeline import spec_from_dict

DRAWS = 10_000



def test_random_grayscale_defaults_to_probability_one_tenth_and_keeps_the_size():
    plan = plan_of([{"center_crop": 8}, "random_grayscale"])
    step = plan.steps[1]
    assert step.name == "random_grayscale" and step.params == {"probability": 0.1} and step.random
    assert plan.output_size == (8, 8) and plan.output_shape(2) == (2, 3, 8, 8)
    assert [s.stage for s in placement(plan, "torchvision")][3] == "random_grayscale"


def _colours_where_rounding_matters() -> np.ndarray:
    """[K, 3] uint8 colours whose torchvision grey level depends on how float32 rounds: every colour
    where one rounding per multiply-add (PyTorch's fused multiply-add) and one per operation give
    different levels (21 of the 16.7 M), plus 50,000 random colours and the extremes."""
    v = np.arange(256, dtype=np.float32)
    r, g, b = (a.reshape(-1) for a in np.meshgrid(v, v, v, indexing="ij"))
    w = [np.float32(x) for x in (0.2989, 0.587, 0.114)]
    separate = np.trunc((r * w[0] + g * w[1]) + b * w[2])
    fused = (r * w[0]).astype(np.float64) + g.astype(np.float64) * np.float64(w[1])
    fused = np.trunc((fused.astype(np.float32).astype(np.float64) + b.astype(np.float64) * np.float64(w[2]))
                     .astype(np.float32))
    sensitive = np.nonzero(separate != fused)[0]
    assert len(sensitive) > 0
    chosen = np.concatenate([sensitive, np.random.default_rng(0).integers(0, 256 ** 3, 50_000), [0, 256 ** 3 - 1]])
    return np.stack([r[chosen], g[chosen], b[chosen]], axis=1).astype(np.uint8)


@pytest.mark.slow
def test_dali_grey_levels_equal_torchvision_rgb_to_grayscale_exactly():
    from nvidia.dali import fn, pipeline_def
    from torchvision.transforms.v2 import functional as F

    from dali_bridge.ops.random_grayscale import Grayscale
    from dali_bridge.backends.dali.plan import graph_context

    colours = _colours_where_rounding_matters()
    images = [colours[: len(colours) // 2 * 2].reshape(2, -1, 3), colours[:7].reshape(7, 1, 3)]  # HWC uint8
    plan = plan_of([{"center_crop": 8}, {"random_grayscale": 0.5}])
    step = plan.steps[1]
    ctx = graph_context(plan, "cpu")
    ctx.position = 1
    applied = [(Grayscale(True),), (Grayscale(False),)]
    arguments = step.op.dali_arguments(step, applied, [image.shape[:2] for image in images], ctx)
    names = [column.name for column in step.op.dali_columns(step, ctx)]

    @pipeline_def(batch_size=len(images), num_threads=1, device_id=None)
    def graph():
        image = fn.external_source(source=[images], batch=True, cycle=True, layout="HWC")
        columns = {name: fn.external_source(source=[arguments[name]], batch=True, cycle=True) for name in names}
        return step.op.dali_graph(step, image, columns, ctx)

    pipe = graph()
    pipe.build()
    (out,) = pipe.run()
    grey = torch.from_numpy(np.array(out[0])).permute(2, 0, 1)
    want = F.rgb_to_grayscale(torch.from_numpy(images[0]).permute(2, 0, 1), num_output_channels=3)
    assert grey.dtype == torch.uint8
    if torch_vector_kernels():
        assert torch.equal(grey, want)
    else:  # torch's default kernels round a few of these colours one level apart
        assert (grey.int() - want.int()).abs().max() <= 1
    assert np.array_equal(np.array(out[1]), images[1])  # not chosen: untouched


@pytest.mark.parametrize("probability", [0.1, 0.5])
def test_grayscale_rate_matches_torchvision_random_grayscale_within_three_sigma(probability):
    from torchvision.transforms import v2

    from dali_bridge.pipeline.sampling import draws, sample_steps

    plan = plan_of([{"center_crop": 8}, {"random_grayscale": probability}])
    sample_draws = draws(plan, seed=0, epoch=0, indices=np.arange(DRAWS))
    ours = float(np.mean([sample_steps(plan, 10, 10, {1: sample_draws[1][i]})[1][0][0].apply for i in range(DRAWS)]))
    torch.manual_seed(0)
    grey, probe = v2.RandomGrayscale(probability), torch.tensor([[[255]], [[0]], [[0]]], dtype=torch.uint8)
    theirs = float(np.mean([int(grey(probe)[1, 0, 0]) != 0 for _ in range(DRAWS)]))
    sigma = math.sqrt(probability * (1 - probability) / DRAWS)
    assert abs(ours - probability) <= 3 * sigma
    assert abs(ours - theirs) <= 3 * math.sqrt(2) * sigma  # two independent estimates


@needs_cpu_backends
@pytest.mark.parametrize("ops", [
    [{"random_resized_crop": [96, 80]}, {"random_grayscale": 0.5}, {"horizontal_flip": 0.5},
     {"normalize": {"mean": MEAN, "std": STD}}],
    [{"resize": 128}, {"center_crop": [112, 100]}, {"random_grayscale": 0.5}, {"normalize": {"dtype": "uint8"}}],
], ids=["between-a-random-resized-crop-and-a-flip", "last-uint8"])
def test_random_grayscale_matches_torchvision_on_dali_cpu(sample_root, ops):
    from tests.helpers.equivalence import assert_within_bounds, pipeline, run_compare

    from dali_bridge.pipeline.sampling import draws

    data = pipeline(sample_root, ops)
    plan = build_plan(spec_from_dict(data))
    result = run_compare(data)
    assert_within_bounds(result, samples=37)
    position = [s.name for s in plan.steps].index("random_grayscale")
    chosen = draws(plan, seed=data["seed"], epoch=0, indices=np.arange(37))[position][:, 0] < 0.5
    assert 0 < chosen.sum() < 37  # both grey and colour images were compared


@needs_cpu_backends
def test_grey_images_have_three_equal_channels_on_dali_cpu(sample_root):
    from dali_bridge.loader.loader import build_loader

    data = {"version": 1, "source": {"type": "folder", "root": str(sample_root)}, "batch_size": 8,
            "loader": {"workers": 1}, "ops": [{"center_crop": 64}, {"random_grayscale": 1.0}]}
    with build_loader(data, "dali-cpu") as loader:
        image, _ = next(iter(loader))
    assert image.dtype == torch.uint8 and image.shape == (8, 3, 64, 64)
    assert torch.equal(image[:, 0], image[:, 1]) and torch.equal(image[:, 1], image[:, 2])
    assert image.float().std() > 10  # real pictures, not a blank
