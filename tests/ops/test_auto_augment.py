"""trivial_augment_wide, rand_augment, auto_augment: torchvision's policies — their magnitude tables,
every operation at its extreme magnitudes against torchvision's own dispatch, the draws' distribution
against torchvision's own transforms, and the backends' pixels."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.helpers.backends import MEAN, STD, needs_cpu_backends, plan_of
from tests.helpers.color_images import write_mixed_images

from dali_bridge.backends.dali.plan import dali_plan
from dali_bridge.ops.policy_kernels import apply_operation
from dali_bridge.ops.policy_tables import SPACES, PolicyOperation, magnitudes
from dali_bridge.loader.placement import placement
from dali_bridge.spec.problems import SpecError

DRAWS = 10_000



def torchvision_policy(space: str):
    from torchvision.transforms import v2

    return {"original": v2.RandAugment, "wide": v2.TrivialAugmentWide, "auto": v2.AutoAugment}[space]


@pytest.fixture(scope="module")
def mixed_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mixed_images(tmp_path_factory.mktemp("policies"))


# ---------------------------------------------------------------------------------------------
# Parameters and tables

def test_policies_default_to_torchvision_parameters_and_run_in_torch_after_dali():
    plan = plan_of([{"random_resized_crop": 64}, "trivial_augment_wide", "rand_augment", "auto_augment",
                    {"normalize": {}}])
    assert [s.params for s in plan.steps[1:]] == [
        {"num_magnitude_bins": 31, "interpolation": "nearest", "fill": None},
        {"num_ops": 2, "magnitude": 9, "num_magnitude_bins": 31, "interpolation": "nearest", "fill": None,
         "variant": "torchvision", "magnitude_std": 0.0, "increasing": False},
        {"policy": "imagenet", "interpolation": "nearest", "fill": None}]
    # parity: exact (the default): the resize before the tail runs in the tail too, as torchvision's kernel
    assert [s.name for s in dali_plan(plan).torch_tail] == ["random_resized_crop", "trivial_augment_wide",
                                                            "rand_augment", "auto_augment"]
    stages = placement(plan, "dali-cpu")
    assert [s.stage for s in stages[-4:]] == ["trivial_augment_wide", "rand_augment", "auto_augment", "finish"]
    assert all(s.implementation.startswith("torch after DALI") and s.device == "cpu" for s in stages[-4:])


def test_rand_augment_draws_two_uniforms_per_operation_and_checks_its_bin():
    from dali_bridge.pipeline.sampling import draws

    plan = plan_of([{"center_crop": 8}, {"rand_augment": {"num_ops": 3}}])
    assert draws(plan, seed=0, epoch=0, indices=np.arange(4))[1].shape == (4, 6)
    with pytest.raises(SpecError) as error:
        plan_of([{"center_crop": 8}, {"rand_augment": {"magnitude": 31}}])
    assert "rand_augment.magnitude" in str(error.value) and "below num_magnitude_bins (31)" in str(error.value)


@pytest.mark.parametrize("space", ["original", "wide", "auto"])
def test_magnitude_tables_equal_torchvision_augmentation_space(space):
    theirs = torchvision_policy(space)._AUGMENTATION_SPACE
    assert [n for n in SPACES[space] if n in theirs] == list(theirs)
    for name, (table, signed) in theirs.items():
        for bins, height, width in ((31, 224, 224), (10, 37, 301), (2, 5, 8), (17, 480, 33)):
            want = table(bins, height, width)
            got = magnitudes(space, name, bins, height, width)
            assert (got is None) == (want is None), name
            if want is not None:
                assert got == tuple(float(v) for v in want), (name, bins)


# ---------------------------------------------------------------------------------------------
# Every operation at its extreme magnitudes against torchvision's own dispatch

def _images() -> list[torch.Tensor]:
    rng = np.random.default_rng(3)
    colour = torch.from_numpy(rng.integers(0, 256, (3, 23, 41), dtype=np.uint8))
    grey = torch.from_numpy(rng.integers(20, 200, (1, 50, 17), dtype=np.uint8)).expand(3, -1, -1).contiguous()
    return [colour, grey]


@pytest.mark.parametrize("space", ["original", "wide", "auto"])
@pytest.mark.parametrize("interpolation, fill", [("nearest", None), ("bilinear", [10.0, 128.0, 250.0]),
                                                 ("nearest", 77)])
def test_each_operation_at_extreme_magnitudes_equals_torchvision(space, interpolation, fill):
    from torchvision.transforms.v2._utils import _setup_fill_arg

    transform = torchvision_policy(space)()
    for image in _images():
        height, width = image.shape[-2:]
        for name in SPACES[space]:
            if name not in transform._AUGMENTATION_SPACE and name != "Identity":
                continue
            table = magnitudes(space, name, 31 if space != "auto" else 10, height, width)
            signed = table is not None and transform._AUGMENTATION_SPACE.get(name, (None, False))[1]
            for value in ([0.0] if table is None else [table[0], table[-1]] + ([-table[-1]] if signed else [])):
                ours = apply_operation(image, PolicyOperation(name, value), interpolation, fill)
                theirs = transform._apply_image_or_video_transform(image, name, value, interpolation=interpolation,
                                                                   fill=_setup_fill_arg(fill))
                assert torch.equal(ours, theirs), (name, value)


# ---------------------------------------------------------------------------------------------
# Distribution: 10,000 draws against torchvision's own transforms with their own RNG

def _ours(op: dict, height: int = 32, width: int = 48) -> list[tuple[PolicyOperation, ...]]:
    from dali_bridge.pipeline.sampling import draws

    plan = plan_of([{"center_crop": [height, width]}, op])
    step, rows = plan.steps[1], draws(plan, seed=0, epoch=0, indices=np.arange(DRAWS))[1]
    return [step.op.sample(step.params, row, height, width)[0].operations for row in rows]


def _theirs(transform, height: int = 32, width: int = 48) -> list[tuple[PolicyOperation, ...]]:
    """The operations torchvision's own forward applies, recorded instead of applied."""
    applied: list[PolicyOperation] = []

    def record(image, name, magnitude, interpolation, fill):
        applied.append(PolicyOperation(name, magnitude))
        return image

    transform._apply_image_or_video_transform = record
    torch.manual_seed(0)
    image, found = torch.zeros((3, height, width), dtype=torch.uint8), []
    for _ in range(DRAWS):
        applied.clear()
        transform(image)
        found.append(tuple(applied))
    return found


def _same_distribution(ours: list, theirs: list) -> float:
    """p-value of a chi-square test that two samples of categories come from one distribution."""
    from scipy.stats import chi2_contingency

    a, b = Counter(ours), Counter(theirs)
    categories = sorted(set(a) | set(b), key=repr)
    return chi2_contingency(np.array([[a[c] for c in categories], [b[c] for c in categories]])).pvalue


def test_trivial_augment_wide_operation_bin_and_sign_follow_torchvision_chi_square():
    from torchvision.transforms import v2

    ours, theirs = _ours({"trivial_augment_wide": {}}), _theirs(v2.TrivialAugmentWide())
    assert all(len(ops) == 1 for ops in ours)
    ours, theirs = [ops[0] for ops in ours], [ops[0] for ops in theirs]
    assert len({op.name for op in ours}) == 14
    assert _same_distribution([op.name for op in ours], [op.name for op in theirs]) > 0.001
    for name in ("Rotate", "Posterize", "Solarize"):  # the bins of a signed, an integer and a falling table
        assert _same_distribution([abs(op.magnitude) for op in ours if op.name == name],
                                  [abs(op.magnitude) for op in theirs if op.name == name]) > 0.001, name
    signed = {name for name, (_, is_signed) in v2.TrivialAugmentWide._AUGMENTATION_SPACE.items() if is_signed}
    assert _same_distribution([op.magnitude < 0 for op in ours if op.name in signed and op.magnitude != 0],
                              [op.magnitude < 0 for op in theirs if op.name in signed and op.magnitude != 0]) > 0.001


def test_rand_augment_operations_and_signs_follow_torchvision_chi_square():
    from torchvision.transforms import v2

    ours = _ours({"rand_augment": {"num_ops": 2, "magnitude": 14}})
    theirs = _theirs(v2.RandAugment(num_ops=2, magnitude=14))
    for n in range(2):
        assert _same_distribution([ops[n].name for ops in ours], [ops[n].name for ops in theirs]) > 0.001
        assert _same_distribution([ops[n].magnitude for ops in ours], [ops[n].magnitude for ops in theirs]) > 0.001


@pytest.mark.slow
def test_auto_augment_sub_policies_and_their_operations_follow_torchvision_chi_square():
    from torchvision.transforms import v2

    ours, theirs = _ours({"auto_augment": "imagenet"}), _theirs(v2.AutoAugment())
    assert _same_distribution([tuple(op.name for op in ops) for ops in ours],
                              [tuple(op.name for op in ops) for ops in theirs]) > 0.001
    assert _same_distribution([len(ops) for ops in ours], [len(ops) for ops in theirs]) > 0.001
    assert _same_distribution([op.magnitude for ops in ours for op in ops],
                              [op.magnitude for ops in theirs for op in ops]) > 0.001


# ---------------------------------------------------------------------------------------------
# On the backends

POLICY_OPS = {
    "trivial_augment_wide": {"trivial_augment_wide": {"fill": [0, 128, 255]}},
    "rand_augment": {"rand_augment": {"num_ops": 3, "magnitude": 30, "interpolation": "bilinear"}},
    "auto_augment": {"auto_augment": {"policy": "imagenet"}},
    "augmix": {"augmix": {"severity": 10, "fill": 128}},
}


@needs_cpu_backends
@pytest.mark.parametrize("name", list(POLICY_OPS))
def test_policy_equals_torchvision_exactly_on_dali_cpu(mixed_root, name):
    """Smaller and larger images than the output, grey-origin ones among them, after an exact crop and flip."""
    from tests.helpers.equivalence import pipeline, run_compare

    ops = [{"center_crop": 64}, {"horizontal_flip": 0.5}, POLICY_OPS[name], {"normalize": {"mean": MEAN, "std": STD}}]
    result = run_compare(pipeline(mixed_root, ops, batch_size=3))
    image = result.output("image")
    assert result.samples == 8 and result.passed, result.format()
    assert image.max_abs == 0.0, result.format()


@needs_cpu_backends
@pytest.mark.parametrize("name", list(POLICY_OPS))
@pytest.mark.slow
def test_policy_after_a_random_resized_crop_equals_torchvision_under_exact_parity(sample_root, name):
    """Under ``parity: exact`` (the default) the resize before a policy runs as torchvision's kernel in the
    torch tail, so the policy sees torchvision's pixels and gives them back to the level."""
    from tests.helpers.equivalence import pipeline, run_compare

    ops = [{"random_resized_crop": [96, 80]}, {"horizontal_flip": 0.5}, name, {"normalize": {"mean": MEAN, "std": STD}}]
    result = run_compare(pipeline(sample_root, ops))
    assert result.passed and result.output("image").max_abs == 0.0, result.format()


@needs_cpu_backends
@pytest.mark.parametrize("name, max_levels, mean_levels", [
    ("trivial_augment_wide", 68, 0.19), ("rand_augment", 103, 0.27), ("auto_augment", 146, 0.42),
    ("augmix", 73, 0.22)])
@pytest.mark.slow
def test_policy_after_a_dali_resize_amplifies_its_rounding_within_the_pinned_bound(sample_root, name,
                                                                                  max_levels, mean_levels):
    """Under ``parity: fast`` the resize stays in DALI, up to 1 level off torchvision's in rounding (more at
    the borders), and the policies' operations are not continuous in their input: a 1-level change crosses a
    posterize bit or a solarize threshold (up to 255 levels), moves an equalize or autocontrast mapping, or
    shifts a nearest-neighbour sample. The order, the labels and every drawn operation stay the same; the
    measured figures on the 37 test images are pinned."""
    from tests.helpers.equivalence import pipeline, run_compare

    ops = [{"random_resized_crop": [96, 80]}, {"horizontal_flip": 0.5}, name, {"normalize": {"mean": MEAN, "std": STD}}]
    result = run_compare({**pipeline(sample_root, ops), "parity": "fast"})
    image = result.output("image")
    assert result.output("index").mismatches == 0 and result.output("label").mismatches == 0
    assert 1.0 < image.max_abs <= max_levels + 1e-3 and image.mean_abs <= mean_levels, result.format()


# ---------------------------------------------------------------------------------------------
# AugMix

def _torchvision_augmix_draws(transform, image: torch.Tensor, count: int, apply_operations: bool = True) -> list:
    """Run torchvision's own AugMix ``count`` times with its RNG, recording what it drew: the Beta and
    Dirichlet samples, and each chain's operations (a chain starts from the original batch; without
    ``apply_operations`` each is recorded only). Returns [(output, m, dirichlet, chains)]."""
    sample_dirichlet, apply = transform._sample_dirichlet, transform._apply_image_or_video_transform
    found = []
    for _ in range(count):
        samples, chains, original = [], [], []

        def record_dirichlet(params):
            samples.append(sample_dirichlet(params))
            return samples[-1]

        def record(batch, name, magnitude, interpolation, fill):
            if not original:
                original.append(batch)
            if batch is original[0]:
                chains.append([])
            chains[-1].append(PolicyOperation(name, magnitude))
            if not apply_operations:
                return batch.clone()  # a new tensor: the chain's next operation does not start a chain
            return apply(batch, name, magnitude, interpolation=interpolation, fill=fill)

        transform._sample_dirichlet, transform._apply_image_or_video_transform = record_dirichlet, record
        output = transform(image)
        found.append((output, samples[0][0], samples[1][0], tuple(tuple(chain) for chain in chains)))
    return found


@pytest.mark.parametrize("params", [{}, {"mixture_width": 2, "chain_depth": 2, "alpha": 0.5, "all_ops": False,
                                         "interpolation": "nearest", "fill": [255, 0, 9]}])
@pytest.mark.slow
def test_augmix_kernel_equals_torchvision_augmix_given_the_same_draws(params):
    from dali_bridge.ops.auto_augment import AugMixDraw

    step = plan_of([{"center_crop": 8}, {"augmix": params}]).steps[1]
    transform = step.op.torchvision_transforms(step.params)[0]
    torch.manual_seed(4)
    for image in _images():
        for output, m, dirichlet, chains in _torchvision_augmix_draws(transform, image, 20):
            weights = (dirichlet.numpy().astype(np.float32) * np.float32(m[1].item())).tolist()
            fill = tuple(step.params["fill"]) if step.params["fill"] is not None else None
            draw = AugMixDraw(float(m[0]), tuple(weights), chains, step.params["interpolation"], fill)
            assert torch.equal(step.op.torchvision_kernel(image, (draw,), step.params), output)


@pytest.mark.slow
def test_augmix_draws_follow_torchvision_kolmogorov_smirnov_and_chi_square():
    from scipy.stats import ks_2samp
    from torchvision.transforms import v2

    # alpha 1: the Gamma variates are the exponential's; gamma_quantiles for other alphas is pinned apart
    plan = plan_of([{"center_crop": [16, 16]}, {"augmix": {"mixture_width": 4}}])
    from dali_bridge.pipeline.sampling import draws

    step, rows = plan.steps[1], draws(plan, seed=0, epoch=0, indices=np.arange(DRAWS))[1]
    ours = [step.op.sample(step.params, row, 16, 16)[0] for row in rows]
    torch.manual_seed(0)
    theirs = _torchvision_augmix_draws(v2.AugMix(mixture_width=4), torch.zeros((3, 16, 16), dtype=torch.uint8), DRAWS,
                                       apply_operations=False)
    assert ks_2samp([d.original_weight for d in ours], [float(m[0]) for _, m, _, _ in theirs]).pvalue > 0.001
    assert ks_2samp([d.chain_weights[0] for d in ours],
                    [float(w[0] * m[1]) for _, m, w, _ in theirs]).pvalue > 0.001
    assert _same_distribution([tuple(len(c) for c in d.chains) for d in ours],
                              [tuple(len(c) for c in chains) for *_, chains in theirs]) > 0.001
    assert _same_distribution([op for d in ours for c in d.chains for op in c],
                              [op for *_, chains in theirs for c in chains for op in c]) > 0.001


@pytest.mark.parametrize("alpha", [0.05, 0.7, 1.0, 5.0])
def test_augmix_gamma_variates_are_the_gamma_inverse_cdf_of_their_uniform(alpha):
    from scipy.stats import gamma

    from dali_bridge.ops.auto_augment import gamma_quantiles

    u = np.random.default_rng(2).random(500)
    want = gamma.ppf(u, alpha)
    assert np.max(np.abs(gamma_quantiles(alpha, u) - want) / want) < 1e-12


@pytest.mark.slow
def test_augmix_weights_at_alpha_1_are_the_same_whatever_simd_kernels_the_cpu_picks(tmp_path):
    """The Dirichlet weights of AugMix's default alpha come from -log(1 - u): with numpy's or torch's
    exp/log they moved in the last bit with the CPU's vector features (another draw on another machine)."""
    import os
    import platform
    import subprocess
    import sys

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the optional CPU features named here are x86-64's")
    script = ("import hashlib, numpy as np\nfrom dali_bridge.ops.auto_augment import gamma_quantiles\n"
              "u = np.random.default_rng(3).integers(0, 2**53, 4000) * 2.0**-53\n"
              "print(hashlib.sha256(gamma_quantiles(1.0, u).tobytes()).hexdigest())\n")

    def run(**env: str) -> str:
        done = subprocess.run([sys.executable, "-c", script], env={**os.environ, **env}, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    assert run() == run(ATEN_CPU_CAPABILITY="default", NPY_DISABLE_CPU_FEATURES="X86_V4 X86_V3")
