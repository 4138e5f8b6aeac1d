"""gaussian_blur: torchvision's GaussianBlur — DALI's fn.gaussian_blur within one level of
F.gaussian_blur given the same sigma, the same pixels on every backend, and the sampler's sigma
distributed as torchvision's make_params draws it."""
from __future__ import annotations


import numpy as np
import pytest
import torch
from tests.helpers.backends import MEAN, STD, gpu_graph_ops, needs_cpu_backends

from dali_bridge.errors import ImageError
from dali_bridge.loader.placement import placement
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.spec.pipeline import spec_from_dict
from dali_bridge.spec.problems import SpecError

DRAWS = 10_000


def spec_data(ops: list) -> dict:
    return {"version": 1, "source": {"type": "folder", "root": "/nonexistent"}, "batch_size": 2, "ops": ops}


def plan_of(ops: list):
    return build_plan(spec_from_dict(spec_data(ops)))


def test_gaussian_blur_shorthand_sets_a_square_kernel_with_torchvisions_default_sigma_and_keeps_the_size():
    plan = plan_of([{"center_crop": 8}, {"gaussian_blur": 5}])
    step = plan.steps[1]
    assert step.name == "gaussian_blur" and step.random
    assert step.params == {"kernel_size": [5, 5], "sigma": [0.1, 2.0], "probability": 1.0}
    assert plan.output_size == (8, 8)
    assert [s.stage for s in placement(plan, "torchvision")][3] == "gaussian_blur"
    assert ("gaussian_blur", "gpu") in [(s.stage, s.device) for s in placement(plan, "dali")]


def test_gaussian_blur_takes_width_and_height_kernels_and_a_fixed_sigma():
    step = plan_of([{"center_crop": 8}, {"gaussian_blur": {"kernel_size": [3, 7], "sigma": 1.5}}]).steps[1]
    assert step.params == {"kernel_size": [3, 7], "sigma": [1.5, 1.5], "probability": 1.0}
    (transform,) = step.op.torchvision_transforms(step.params)
    assert list(transform.kernel_size) == [3, 7] and list(transform.sigma) == [1.5, 1.5]


@pytest.mark.parametrize("params, expected", [
    ({"kernel_size": 4}, "odd positive kernel sizes"),
    ({"kernel_size": [3, 0]}, "odd positive kernel sizes"),
    ({"kernel_size": "5"}, "an odd kernel size in pixels"),
    ({"kernel_size": 5, "sigma": 0}, "both ends in (0.0, inf)"),
    ({"kernel_size": 5, "sigma": [2.0, 1.0]}, "low <= high"),
    ({"sigma": [0.1, 2.0]}, "kernel_size"),
])
def test_gaussian_blur_refuses_bad_parameters_naming_the_key(params, expected):
    with pytest.raises(SpecError) as caught:
        spec_from_dict(spec_data([{"center_crop": 8}, {"gaussian_blur": params}]))
    assert "ops[1]" in str(caught.value) and expected in str(caught.value)


def test_images_too_small_for_the_reflect_padding_are_a_sample_error_naming_the_sizes():
    step = plan_of([{"center_crop": 8}, {"gaussian_blur": [9, 5]}]).steps[1]
    assert step.op.sample(step.params, np.array([0.5]), 3, 5)  # pads 4 across a width of 5, 2 down a height of 3
    for height, width in [(2, 40), (40, 4)]:
        with pytest.raises(ImageError, match=rf"too small to blur.*{height}x{width}"):
            step.op.sample(step.params, np.array([0.5]), height, width)


def test_sigma_is_drawn_uniformly_in_float32_as_torchvision_does():
    step = plan_of([{"center_crop": 8}, {"gaussian_blur": {"kernel_size": 3, "sigma": [0.5, 4.0]}}]).steps[1]
    sigmas = [step.op.sample(step.params, np.array([u]), 8, 8)[0].sigma for u in (0.0, 0.5, 0.999999)]
    assert sigmas[0] == 0.5 and sigmas[1] == 2.25 and sigmas[2] == float(np.float32(0.5 + 3.5 * 0.999999))


def test_sigma_distribution_matches_torchvision_make_params_by_kolmogorov_smirnov():
    from scipy.stats import ks_2samp, kstest
    from torchvision.transforms import v2

    from dali_bridge.pipeline.sampling import draws, sample_steps

    low, high = 0.1, 2.0
    plan = plan_of([{"center_crop": 8}, {"gaussian_blur": 3}])
    sample_draws = draws(plan, seed=0, epoch=0, indices=np.arange(DRAWS))
    ours = np.array([sample_steps(plan, 10, 10, {1: sample_draws[1][i]})[1][0][0].sigma for i in range(DRAWS)])
    torch.manual_seed(0)
    blur = v2.GaussianBlur(3)
    theirs = np.array([blur.make_params([])["sigma"][0] for _ in range(DRAWS)])
    assert ours.min() >= low and ours.max() <= high
    assert ks_2samp(ours, theirs).pvalue > 0.001
    assert kstest(ours, "uniform", args=(low, high - low)).pvalue > 0.001


def _blur_on_dali_cpu(step, images: list[np.ndarray], sigmas: list[float],
                      applied: list[bool] | None = None) -> list[np.ndarray]:
    """The op's own DALI fragment on dali-cpu, given each HWC uint8 image's sigma (and whether it is blurred)."""
    from nvidia.dali import fn, pipeline_def

    from dali_bridge.ops.gaussian_blur import Blur
    from dali_bridge.backends.dali.plan import graph_context

    kernel_x, kernel_y = step.params["kernel_size"]
    plan = plan_of([{"center_crop": 8}, {"gaussian_blur": step.params}])
    ctx = graph_context(plan, "cpu")
    ctx.position = 1
    applied = applied or [True] * len(sigmas)
    concrete = [(Blur(sigma, kernel_x, kernel_y, chosen),) for sigma, chosen in zip(sigmas, applied)]
    arguments = step.op.dali_arguments(step, concrete, [image.shape[:2] for image in images], ctx)

    @pipeline_def(batch_size=len(images), num_threads=1, device_id=None)
    def graph():
        image = fn.external_source(source=[images], batch=True, cycle=True, layout="HWC")
        columns = {c.name: fn.external_source(source=[arguments[c.name]], batch=True, cycle=True)
                   for c in step.op.dali_columns(step, ctx)}
        return step.op.dali_graph(step, image, columns, ctx)

    pipe = graph()
    pipe.build()
    (out,) = pipe.run()
    return [np.array(out[i]) for i in range(len(images))]


def _test_images() -> list[np.ndarray]:
    """HWC uint8: noise (every level next to every other), a photo-like scene, a grey one, flat and edges."""
    from dali_bridge.data.sources.synthetic_images import sample_image

    rng = np.random.default_rng(0)
    scene = np.asarray(sample_image(3, 0, size=(61, 83)))
    grey = np.repeat(scene.mean(axis=2, keepdims=True).astype(np.uint8), 3, axis=2)
    edges = np.zeros((40, 33, 3), dtype=np.uint8)
    edges[:, ::2] = 255
    return [rng.integers(0, 256, (37, 52, 3), dtype=np.uint8), scene, grey, edges,
            np.full((16, 16, 3), 77, dtype=np.uint8)]


@pytest.mark.parametrize("kernel_size", [[1, 1], [3, 3], [5, 9], [9, 1], [31, 31]])
def test_dali_blur_is_within_one_level_of_torchvision_at_extreme_sigmas(kernel_size):
    from torchvision.transforms.v2 import functional as F

    step = plan_of([{"center_crop": 8}, {"gaussian_blur": {"kernel_size": kernel_size}}]).steps[1]
    images = [image for image in _test_images() for _ in range(3)]
    sigmas = [sigma for _ in _test_images() for sigma in (0.1, 1.3, 8.0)]
    got = _blur_on_dali_cpu(step, images, sigmas)
    differences = []
    for image, sigma, ours in zip(images, sigmas, got):
        want = F.gaussian_blur(torch.from_numpy(image).permute(2, 0, 1), kernel_size, [sigma, sigma])
        assert ours.shape == image.shape and ours.dtype == np.uint8
        differences.append(np.abs(ours.astype(int) - want.permute(1, 2, 0).numpy().astype(int)).ravel())
    difference = np.concatenate(differences)
    assert difference.max() <= 1 and difference.mean() <= 0.01
    if kernel_size == [1, 1]:
        assert difference.max() == 0  # a 1x1 Gaussian is the identity on both
    else:
        assert any(np.abs(image.astype(int) - ours).max() > 10 for image, ours in zip(images, got))  # it blurred




# ---------------------------------------------------------------------------------------------
# probability: torchvision's RandomApply([GaussianBlur(...)], p)

def test_without_a_probability_below_one_the_op_draws_its_one_uniform_as_before():
    from dali_bridge.pipeline.sampling import draw_count, draws, uniforms

    indices = np.arange(50)
    for params in ({"kernel_size": 5}, {"kernel_size": 5, "probability": 1.0}):
        plan = plan_of([{"center_crop": 8}, {"gaussian_blur": params}])
        assert draw_count(plan.steps[1]) == 1
        np.testing.assert_array_equal(draws(plan, seed=7, epoch=2, indices=indices)[1],
                                      uniforms(7, 2, indices, 2, 1))  # stream: position + 1
        assert [c.name for c in plan.steps[1].op.dali_columns(plan.steps[1], None)] == ["sigma"]


def test_a_probability_adds_a_second_uniform_and_keeps_the_sigma_of_the_first():
    from dali_bridge.pipeline.sampling import draw_count, draws

    always = plan_of([{"center_crop": 8}, {"gaussian_blur": 23}])
    sometimes = plan_of([{"center_crop": 8}, {"gaussian_blur": {"kernel_size": 23, "probability": 0.1}}])
    assert draw_count(sometimes.steps[1]) == 2
    indices = np.arange(200)
    rows, gated = (draws(plan, seed=0, epoch=0, indices=indices)[1] for plan in (always, sometimes))
    for row, gate in zip(rows, gated):
        (blur,) = always.steps[1].op.sample(always.steps[1].params, row, 30, 30)
        (maybe,) = sometimes.steps[1].op.sample(sometimes.steps[1].params, gate, 30, 30)
        assert maybe.sigma == blur.sigma and maybe.applied == bool(gate[1] < 0.1) and blur.applied


def test_an_image_left_sharp_is_never_padded_so_a_small_one_is_no_error():
    step = plan_of([{"center_crop": 8}, {"gaussian_blur": {"kernel_size": 23, "probability": 0.5}}]).steps[1]
    assert not step.op.sample(step.params, np.array([0.5, 0.7]), 4, 4)[0].applied
    with pytest.raises(ImageError, match="too small to blur"):
        step.op.sample(step.params, np.array([0.5, 0.2]), 4, 4)


def test_an_image_left_sharp_keeps_its_pixels_in_the_kernel_and_the_batched_kernel():
    from dali_bridge.ops.gaussian_blur import Blur

    step = plan_of([{"center_crop": 8}, {"gaussian_blur": {"kernel_size": 5, "probability": 0.5}}]).steps[1]
    batch = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (4, 3, 9, 7), dtype=np.uint8))
    concrete = [(Blur(sigma, 5, 5, applied),) for sigma, applied in ((1.0, True), (1.0, False), (2.0, False),
                                                                     (2.0, True))]
    batched = step.op.batch_kernel(batch, concrete, step.params)
    for image, chosen, got in zip(batch, concrete, batched):
        ours = step.op.torchvision_kernel(image, chosen, step.params)
        assert torch.equal(got, ours) and torch.equal(ours, image) != chosen[0].applied


@pytest.mark.parametrize("probability", [0.1, 0.5])
def test_blur_rate_matches_torchvision_random_apply_within_three_sigma(probability):
    import math

    from torchvision.transforms import v2

    from dali_bridge.pipeline.sampling import draws, sample_steps

    plan = plan_of([{"center_crop": 8}, {"gaussian_blur": {"kernel_size": 3, "probability": probability}}])
    sample_draws = draws(plan, seed=0, epoch=0, indices=np.arange(DRAWS))
    ours = float(np.mean([sample_steps(plan, 10, 10, {1: sample_draws[1][i]})[1][0][0].applied
                          for i in range(DRAWS)]))
    torch.manual_seed(0)
    blur = v2.RandomApply([v2.GaussianBlur(3, sigma=2.0)], p=probability)
    probe = torch.zeros((3, 3, 3), dtype=torch.uint8)
    probe[:, 1, 1] = 255
    theirs = float(np.mean([int(blur(probe)[0, 1, 1]) != 255 for _ in range(DRAWS)]))
    sigma = math.sqrt(probability * (1 - probability) / DRAWS)
    assert abs(ours - probability) <= 3 * sigma
    assert abs(ours - theirs) <= 3 * math.sqrt(2) * sigma  # two independent estimates


def test_the_counterpart_of_a_probability_is_random_apply_of_gaussian_blur():
    from torchvision.transforms import v2

    step = plan_of([{"center_crop": 8}, {"gaussian_blur": {"kernel_size": 23, "probability": 0.5}}]).steps[1]
    (transform,) = step.op.torchvision_transforms(step.params)
    assert type(transform) is v2.RandomApply and transform.p == 0.5
    (inner,) = transform.transforms
    assert type(inner) is v2.GaussianBlur and list(inner.kernel_size) == [23, 23]


def test_dali_leaves_an_image_not_chosen_exactly_as_it_was_and_blurs_the_others_as_torchvision():
    from torchvision.transforms.v2 import functional as F

    step = plan_of([{"center_crop": 8}, {"gaussian_blur": {"kernel_size": [9, 5], "probability": 0.5}}]).steps[1]
    assert [c.name for c in step.op.dali_columns(step, None)] == ["sigma", "window"]
    images = _test_images()[:4]
    applied = [False, True, False, True]
    got = _blur_on_dali_cpu(step, images, [1.3] * 4, applied)
    for image, ours, chosen in zip(images, got, applied):
        if not chosen:
            assert np.array_equal(ours, image)
            continue
        want = F.gaussian_blur(torch.from_numpy(image).permute(2, 0, 1), [9, 5], [1.3, 1.3]).permute(1, 2, 0).numpy()
        assert np.abs(ours.astype(int) - want.astype(int)).max() <= 1 and np.abs(ours.astype(int) - image).max() > 10


@needs_cpu_backends
@pytest.mark.parametrize("ops", [
    [{"center_crop": 160}, {"gaussian_blur": {"kernel_size": 9, "sigma": [0.1, 5.0]}},
     {"normalize": {"dtype": "uint8"}}],
    [{"random_resized_crop": [96, 120]}, {"gaussian_blur": {"kernel_size": [23, 5], "sigma": [0.1, 8.0]}},
     {"horizontal_flip": 0.5}, {"normalize": {"mean": MEAN, "std": STD}}],
    [{"center_crop": 96}, {"gaussian_blur": {"kernel_size": 23, "sigma": [0.1, 2.0], "probability": 0.5}},
     {"normalize": {"dtype": "uint8"}}],
], ids=["center-crop-pads-small-images-uint8", "after-a-random-resized-crop-normalized", "with-a-probability"])
@pytest.mark.slow
def test_gaussian_blur_matches_torchvision_on_dali_cpu_over_unusual_images(corpus_root, ops):
    from tests.helpers.corpus import KINDS
    from tests.helpers.equivalence import assert_within_bounds, pipeline, run_compare

    result = run_compare(pipeline(corpus_root, ops))
    assert_within_bounds(result, samples=len(KINDS) + 10)


@pytest.mark.parametrize("sigma", [[0.5, 2.0], 1.5], ids=["range", "fixed"])
def test_plain_dali_baseline_blurs_with_a_range_or_a_fixed_sigma(sigma):
    from nvidia.dali import fn, pipeline_def

    from dali_bridge.backends.dali.plan import graph_context

    plan = plan_of([{"center_crop": 8}, {"gaussian_blur": {"kernel_size": [5, 3], "sigma": sigma}}])
    step, ctx = plan.steps[1], graph_context(plan, "cpu")
    images = [np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)] * 4

    @pipeline_def(batch_size=len(images), num_threads=1, device_id=None)
    def graph():
        image = fn.external_source(source=[images], batch=True, cycle=True, layout="HWC")
        return step.op.dali_baseline(step, image, ctx)

    pipe = graph()
    pipe.build()
    (out,) = pipe.run()
    for n in range(len(images)):
        blurred = np.array(out[n]).astype(int)
        assert blurred.shape == images[n].shape and np.abs(blurred - images[n]).mean() > 10  # sigma >= 0.5 blurs noise


def test_plain_dali_baseline_blurs_only_the_images_its_coin_flip_chooses():
    from nvidia.dali import fn, pipeline_def

    from dali_bridge.backends.dali.plan import graph_context

    plan = plan_of([{"center_crop": 8}, {"gaussian_blur": {"kernel_size": 5, "sigma": 1.5, "probability": 0.5}}])
    step, ctx = plan.steps[1], graph_context(plan, "cpu")
    image = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)

    @pipeline_def(batch_size=32, num_threads=1, device_id=None, seed=1)
    def graph():
        return step.op.dali_baseline(step, fn.external_source(source=[[image] * 32], batch=True, cycle=True,
                                                              layout="HWC"), ctx)

    pipe = graph()
    pipe.build()
    (out,) = pipe.run()
    outputs = [np.array(out[n]) for n in range(32)]
    kept = [np.array_equal(o, image) for o in outputs]
    assert all(o.dtype == np.uint8 for o in outputs) and 0 < sum(kept) < 32
    assert all(np.abs(o.astype(int) - image).mean() > 10 for o, k in zip(outputs, kept) if not k)


def test_the_gaussian_blur_with_a_probability_fragment_and_baseline_define_a_gpu_graph():
    """The GPU device's graph defines (not run: no CUDA needed here), its arithmetic reading GPU data."""
    defined = gpu_graph_ops([{"center_crop": 8}, {"gaussian_blur": {"kernel_size": 5, "probability": 0.5}}])
    assert defined.count("OpSpec for GaussianBlur:") == 2
