"""color_jitter: torchvision's ColorJitter — its factors, order and kernels on every backend (in torch
after the DALI graph on DALI backends), and the sampler's distribution against torchvision's own."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.helpers.backends import MEAN, STD, needs_cpu_backends, plan_of

from dali_bridge.backends.dali.plan import dali_plan
from dali_bridge.loader.placement import placement
from dali_bridge.spec.problems import SpecError
from tests.helpers.color_images import JITTER, write_mixed_images

DRAWS = 10_000


@pytest.fixture(scope="module")
def mixed_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mixed_images(tmp_path_factory.mktemp("jitter"))


# ---------------------------------------------------------------------------------------------
# Parameters: torchvision's ColorJitter._check_input

def test_single_values_become_torchvision_ranges_and_identity_ranges_are_skipped():
    params = plan_of([{"center_crop": 8}, {"color_jitter": {"brightness": 0.4, "contrast": 1.5, "saturation": [1, 1],
                                                           "hue": 0.1}}]).steps[1].params
    assert params == {"brightness": [0.6, 1.4], "contrast": [0.0, 2.5], "saturation": None, "hue": [-0.1, 0.1],
                      "probability": 1.0}
    assert plan_of([{"center_crop": 8}, {"color_jitter": 0.3}]).steps[1].params["brightness"] == [0.7, 1.3]


@pytest.mark.parametrize("field, value, expected", [
    ("hue", 0.6, "within [-0.5, 0.5]"), ("brightness", -0.1, "non-negative"), ("contrast", [1.5, 0.5], "low <= high"),
    ("saturation", "lots", "a number or [low, high]")])
def test_bad_jitter_ranges_name_the_field_and_what_is_expected(field, value, expected):
    with pytest.raises(SpecError) as error:
        plan_of([{"center_crop": 8}, {"color_jitter": {field: value}}])
    assert f"color_jitter.{field}" in str(error.value) and expected in str(error.value)


def test_under_exact_parity_the_torch_tail_starts_at_the_resize_before_it():
    plan = plan_of([{"center_crop": 300}, {"random_resized_crop": 224}, {"horizontal_flip": 0.5},
                    {"color_jitter": JITTER}, {"normalize": {"mean": MEAN, "std": STD}}])
    assert [s.name for s in dali_plan(plan).steps] == ["center_crop"]
    assert [s.name for s in dali_plan(plan).torch_tail] == ["random_resized_crop", "horizontal_flip", "color_jitter"]
    no_resize = plan_of([{"center_crop": 224}, {"color_jitter": JITTER}, {"normalize": {}}])
    assert [s.name for s in dali_plan(no_resize).steps] == ["center_crop"]


def test_color_jitter_runs_in_torch_after_the_dali_graph_which_ends_with_a_uint8_finish():
    plan = plan_of([{"random_resized_crop": 224}, {"horizontal_flip": 0.5}, {"color_jitter": JITTER},
                    {"normalize": {"mean": MEAN, "std": STD}}], parity="fast")
    assert [s.name for s in dali_plan(plan).steps] == ["random_resized_crop", "horizontal_flip"]
    assert [s.name for s in dali_plan(plan).torch_tail] == ["color_jitter"]
    for backend, device in (("dali", "cuda"), ("dali-cpu", "cpu")):
        stages = placement(plan, backend)
        names = [s.stage for s in stages]
        assert names.index("finish") < names.index("color_jitter")
        tail = stages[names.index("color_jitter"):]
        assert [(s.stage, s.device) for s in tail] == [("color_jitter", device), ("finish", device)]
        assert all(s.implementation.startswith("torch after DALI") for s in tail)
        assert stages[names.index("finish")].implementation == "fn.crop_mirror_normalize (uint8, HWC)"
        assert any(s.implementation == "fused into fn.crop_mirror_normalize" for s in stages)


# ---------------------------------------------------------------------------------------------
# The kernel: torchvision's own ColorJitter given the same drawn parameters

@pytest.mark.slow
def test_kernel_equals_torchvision_color_jitter_transform_given_the_same_parameters():
    from torchvision.transforms import v2

    plan = plan_of([{"center_crop": 8}, {"color_jitter": JITTER}])
    step = plan.steps[1]
    transform = step.op.torchvision_transforms(step.params)[0]
    assert isinstance(transform, v2.ColorJitter)
    image = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (3, 37, 29), dtype=np.uint8))
    rng = np.random.default_rng(1)
    for u in rng.random((64, step.op.draws)):
        (jitter,) = step.op.sample(step.params, u, 37, 29)
        params = dict(fn_idx=torch.tensor(jitter.order), brightness_factor=jitter.brightness,
                      contrast_factor=jitter.contrast, saturation_factor=jitter.saturation, hue_factor=jitter.hue)
        ours = step.op.torchvision_kernel(image, (jitter,), step.params)
        assert torch.equal(ours, transform.transform(image, params))


# ---------------------------------------------------------------------------------------------
# Distribution: 10,000 draws against torchvision's own make_params with its own RNG

def _ours(params: dict) -> list:
    from dali_bridge.pipeline.sampling import draws

    plan = plan_of([{"center_crop": 8}, {"color_jitter": params}])
    step, rows = plan.steps[1], draws(plan, seed=0, epoch=0, indices=np.arange(DRAWS))[1]
    return [step.op.sample(step.params, row, 8, 8)[0] for row in rows]


def _theirs(params: dict) -> list[dict]:
    from torchvision.transforms import v2

    torch.manual_seed(0)
    transform = v2.ColorJitter(**params)
    return [transform.make_params([]) for _ in range(DRAWS)]


@pytest.mark.slow
def test_jitter_factors_follow_torchvision_distribution_kolmogorov_smirnov():
    from scipy.stats import ks_2samp

    params = {"brightness": 0.4, "contrast": [0.2, 1.8], "saturation": 0.9, "hue": 0.3}
    ours, theirs = _ours(params), _theirs(params)
    for name in ("brightness", "contrast", "saturation", "hue"):
        mine = np.array([getattr(j, name) for j in ours])
        their = np.array([p[f"{name}_factor"] for p in theirs])
        assert ks_2samp(mine, their).pvalue > 0.001, name
        if isinstance(params[name], list):
            assert params[name][0] <= mine.min() and mine.max() <= params[name][1]
    hue = np.array([j.hue for j in ours])
    assert -0.3 <= hue.min() < -0.29 and 0.29 < hue.max() <= 0.3


@pytest.mark.slow
def test_adjustment_order_follows_torchvision_randperm_chi_square():
    from itertools import permutations

    from scipy.stats import chi2_contingency, chisquare

    ours, theirs = _ours(JITTER), _theirs(JITTER)
    orders = {order: n for n, order in enumerate(permutations(range(4)))}
    mine = np.bincount([orders[j.order] for j in ours], minlength=24)
    their = np.bincount([orders[tuple(p["fn_idx"].tolist())] for p in theirs], minlength=24)
    assert chisquare(mine).pvalue > 0.001  # uniform over the 24 orders
    assert chi2_contingency(np.stack([mine, their])).pvalue > 0.001  # and as torchvision's


# ---------------------------------------------------------------------------------------------
# probability: torchvision's RandomApply([ColorJitter(...)], p)

def test_without_a_probability_below_one_the_op_draws_its_eight_uniforms_as_before():
    from dali_bridge.pipeline.sampling import draw_count, draws, uniforms

    indices = np.arange(50)
    for params in (JITTER, {**JITTER, "probability": 1.0}):
        plan = plan_of([{"center_crop": 8}, {"color_jitter": params}])
        assert draw_count(plan.steps[1]) == 8
        got = draws(plan, seed=7, epoch=2, indices=indices)[1]
        np.testing.assert_array_equal(got, uniforms(7, 2, indices, 2, 8))  # stream: position + 1
        assert all(plan.steps[1].op.sample(plan.steps[1].params, row, 8, 8)[0].applied for row in got)


def test_a_probability_adds_a_ninth_uniform_and_keeps_the_order_and_factors_of_the_first_eight():
    from dali_bridge.pipeline.sampling import draw_count, draws

    always = plan_of([{"center_crop": 8}, {"color_jitter": JITTER}])
    sometimes = plan_of([{"center_crop": 8}, {"color_jitter": {**JITTER, "probability": 0.8}}])
    assert draw_count(sometimes.steps[1]) == 9
    indices = np.arange(200)
    rows, gated = (draws(plan, seed=0, epoch=0, indices=indices)[1] for plan in (always, sometimes))
    for row, gate in zip(rows, gated):
        (jitter,), (maybe,) = (plan.steps[1].op.sample(plan.steps[1].params, u, 8, 8)
                               for plan, u in ((always, row), (sometimes, gate)))
        assert maybe.order == jitter.order and maybe.brightness == jitter.brightness and maybe.hue == jitter.hue
        assert maybe.applied == bool(gate[8] < 0.8)


def test_an_image_not_chosen_keeps_its_pixels_in_the_kernel_and_the_batched_kernel():
    step = plan_of([{"center_crop": 8}, {"color_jitter": {**JITTER, "probability": 0.5}}]).steps[1]
    batch = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (6, 3, 9, 7), dtype=np.uint8))
    rng = np.random.default_rng(3)
    concrete = []
    for gate in (0.1, 0.9, 0.2, 0.7, 0.4, 0.6):  # chosen below 0.5
        concrete.append(step.op.sample(step.params, np.concatenate([rng.random(8), [gate]]), 9, 7))
    batched = step.op.batch_kernel(batch, concrete, step.params)
    for image, chosen, got in zip(batch, concrete, batched):
        ours = step.op.torchvision_kernel(image, chosen, step.params)
        assert torch.equal(got, ours)
        assert torch.equal(ours, image) != chosen[0].applied


@pytest.mark.parametrize("probability", [0.3, 0.8])
def test_jitter_rate_matches_torchvision_random_apply_within_three_sigma(probability):
    from torchvision.transforms import v2

    ours = float(np.mean([j.applied for j in _ours({**JITTER, "probability": probability})]))
    torch.manual_seed(0)
    jitter = v2.RandomApply([v2.ColorJitter(brightness=[2.0, 2.0])], p=probability)
    probe = torch.full((3, 1, 1), 100, dtype=torch.uint8)
    theirs = float(np.mean([int(jitter(probe)[0, 0, 0]) == 200 for _ in range(DRAWS)]))
    sigma = math.sqrt(probability * (1 - probability) / DRAWS)
    assert abs(ours - probability) <= 3 * sigma
    assert abs(ours - theirs) <= 3 * math.sqrt(2) * sigma  # two independent estimates


def test_the_counterpart_of_a_probability_is_random_apply_of_color_jitter():
    from torchvision.transforms import v2

    step = plan_of([{"center_crop": 8}, {"color_jitter": {**JITTER, "probability": 0.8}}]).steps[1]
    (transform,) = step.op.torchvision_transforms(step.params)
    assert type(transform) is v2.RandomApply and transform.p == 0.8
    (inner,) = transform.transforms
    assert type(inner) is v2.ColorJitter and list(inner.hue) == [-0.1, 0.1]
    always = plan_of([{"center_crop": 8}, {"color_jitter": JITTER}]).steps[1]
    assert type(always.op.torchvision_transforms(always.params)[0]) is v2.ColorJitter
    assert "with probability 0.8" in step.op.torchvision_stage(step.params)


def test_a_probability_outside_zero_and_one_names_the_field():
    with pytest.raises(SpecError) as error:
        plan_of([{"center_crop": 8}, {"color_jitter": {**JITTER, "probability": 1.2}}])
    assert "color_jitter.probability" in str(error.value) and "probability in [0, 1]" in str(error.value)


# ---------------------------------------------------------------------------------------------
# On the backends

@needs_cpu_backends
@pytest.mark.parametrize("ops", [
    [{"center_crop": 64}, {"horizontal_flip": 0.5}, {"color_jitter": JITTER},
     {"normalize": {"mean": MEAN, "std": STD}}],
    [{"color_jitter": {"brightness": [0.0, 2.0], "contrast": [0.0, 2.0], "saturation": [0.0, 3.0], "hue": 0.5}},
     {"center_crop": 64}, {"normalize": {"dtype": "uint8"}}],
    [{"center_crop": 64}, {"color_jitter": {**JITTER, "probability": 0.5}}, {"normalize": {"dtype": "uint8"}}],
], ids=["after-crop-and-flip", "first-extreme-factors", "with-a-probability"])
@pytest.mark.slow
def test_color_jitter_equals_torchvision_exactly_on_dali_cpu(mixed_root, ops):
    """Smaller and larger images than the output, grey-origin ones among them: the DALI graph's crop
    and flip are exact, so the torch tail's output equals torchvision's to the level."""
    from tests.helpers.equivalence import pipeline, run_compare

    result = run_compare(pipeline(mixed_root, ops, batch_size=3))
    image = result.output("image")
    assert result.samples == 8 and result.passed, result.format()
    assert image.max_abs == 0.0, result.format()


@needs_cpu_backends
@pytest.mark.slow
def test_color_jitter_after_a_random_resized_crop_equals_torchvision_under_exact_parity(sample_root):
    """Under ``parity: exact`` (the default) the resize before the jitter runs in the torch tail as
    torchvision's kernel, so the jitter sees torchvision's pixels and gives them back to the level."""
    from tests.helpers.equivalence import pipeline, run_compare

    ops = [{"random_resized_crop": [96, 80]}, {"horizontal_flip": 0.5}, {"color_jitter": JITTER},
           {"normalize": {"mean": MEAN, "std": STD}}]
    result = run_compare(pipeline(sample_root, ops))
    assert result.passed and result.output("image").max_abs == 0.0, result.format()


@needs_cpu_backends
@pytest.mark.slow
def test_color_jitter_after_a_dali_resize_amplifies_its_rounding_within_the_pinned_bound(sample_root):
    """Under ``parity: fast`` the resize stays in DALI, up to 1 level off torchvision's in rounding; jitter's
    factors (up to 1.4 here) and the hue round trip through HSV (a 1-level change of a nearly grey pixel
    moves its hue) amplify that in a few pixels. Measured on the 37 test images: max 10 levels, mean 0.15."""
    from tests.helpers.equivalence import pipeline, run_compare

    ops = [{"random_resized_crop": [96, 80]}, {"horizontal_flip": 0.5}, {"color_jitter": JITTER},
           {"normalize": {"mean": MEAN, "std": STD}}]
    result = run_compare({**pipeline(sample_root, ops), "parity": "fast"})
    image = result.output("image")
    assert result.output("index").mismatches == 0 and result.output("label").mismatches == 0
    assert 1.0 < image.max_abs <= 12.0 and image.mean_abs <= 0.25, result.format()


@needs_cpu_backends
def test_skipped_samples_leave_the_torch_tail_parameters_with_their_own_images(mixed_root, tmp_path):
    """A file that cannot be decoded is skipped: the feeder's tail parameters stay aligned with the kept
    images, so dali-cpu still equals torchvision sample for sample."""
    import shutil

    from dali_bridge.loader.loader import build_loader

    root = tmp_path / "with_a_broken_file"
    shutil.copytree(mixed_root, root)
    (root / "class_0" / "img_00_broken.jpg").write_bytes(b"not a jpeg")
    data = {"version": 1, "source": {"type": "folder", "root": str(root)}, "batch_size": 4, "seed": 11,
            "outputs": ["image", "label", "index"], "loader": {"workers": 1, "on_error": "skip"},
            "ops": [{"center_crop": 64}, {"color_jitter": JITTER}, "trivial_augment_wide"]}
    found = {}
    for backend in ("dali-cpu", "torchvision"):
        with build_loader(data, backend) as loader:
            batches = list(loader)
            assert len(loader.skipped) == 1
        found[backend] = (torch.cat([b[0] for b in batches]), torch.cat([b[2] for b in batches]))
    assert found["dali-cpu"][1].tolist() == found["torchvision"][1].tolist() and len(found["dali-cpu"][1]) == 8
    assert torch.equal(found["dali-cpu"][0], found["torchvision"][0])


def test_plain_dali_baseline_jitters_only_the_images_its_coin_flip_chooses():
    from nvidia.dali import fn, pipeline_def

    from dali_bridge.backends.dali.plan import graph_context

    plan = plan_of([{"center_crop": 8}, {"color_jitter": {"brightness": [1.5, 2.0], "probability": 0.5}}])
    step, ctx = plan.steps[1], graph_context(plan, "cpu")
    image = np.random.default_rng(0).integers(0, 120, (20, 30, 3), dtype=np.uint8)

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
    assert all(o.astype(int).mean() > 1.4 * image.mean() for o, k in zip(outputs, kept) if not k)  # brighter
