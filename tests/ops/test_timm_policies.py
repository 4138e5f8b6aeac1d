"""timm_auto_augment and timm_augmix: timm's AutoAugment policies (``original``, ``originalr``, ``v0``,
``v0r``, ``3a``) and its AugMix — their tables, level arguments, PIL operations, mixes and draws against
timm's own code where timm is installed, the spelling checks and the backends' pixels everywhere."""
from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.helpers.timm_recording import record_augmix_weights
from tests.helpers.backends import needs_cpu_backends, plan_of
from tests.helpers.color_images import write_mixed_images

from dali_bridge.ops.timm_augmix import OPERATIONS as AUGMIX_OPERATIONS
from dali_bridge.ops.timm_augmix import TimmMixDraw, mix
from dali_bridge.ops.timm_auto_augment import POLICIES
from dali_bridge.ops.timm_rand_augment import TimmOperation, level_argument, pil_operation, timm_operation, to_picture
from dali_bridge.spec.problems import SpecError
from dali_bridge.pipeline.sampling import draw_count

DRAWS = 10_000
FILL = (124, 116, 104)
POLICY_NAMES = sorted({name for policy in POLICIES.values() for sub in policy for name, _, _ in sub})
NAMES = sorted(set(POLICY_NAMES) | set(AUGMIX_OPERATIONS))
RESAMPLED = ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")


def timm_augment():
    return pytest.importorskip("timm.data.auto_augment", reason="timm is not installed: its own code is the reference")


def _hparams(augment, translate_pct: float = 0.45) -> dict:
    return dict(augment._HPARAMS_DEFAULT, img_mean=FILL, translate_pct=translate_pct)


def test_policy_tables_and_the_augmix_operations_are_timms():
    augment = timm_augment()
    for name, policy in POLICIES.items():
        theirs = augment.auto_augment_policy(name, _hparams(augment))
        assert tuple(tuple((op.name, op.prob, op.magnitude) for op in sub) for sub in theirs) == policy, name
    assert AUGMIX_OPERATIONS == tuple(augment._AUGMIX_TRANSFORMS)


def test_level_arguments_of_every_operation_and_magnitude_bin_equal_timms(monkeypatch):
    augment = timm_augment()
    for name in NAMES:
        for magnitude in range(11):
            for u_sign in (0.2, 0.8):
                for pct in (0.45, 0.3):
                    monkeypatch.setattr(augment.random, "random", lambda: u_sign)
                    level = augment.LEVEL_TO_ARG[name]
                    want = level(float(magnitude), _hparams(augment, pct))[0] if level else None
                    assert level_argument(name, float(magnitude), u_sign, pct) == want, (name, magnitude, u_sign)


def _images() -> list[torch.Tensor]:
    rng = np.random.default_rng(7)
    colour = torch.from_numpy(rng.integers(0, 256, (3, 31, 31), dtype=np.uint8))
    wide = torch.from_numpy(rng.integers(0, 256, (3, 19, 37), dtype=np.uint8))
    grey = torch.from_numpy(rng.integers(10, 240, (1, 40, 21), dtype=np.uint8)).expand(3, -1, -1).contiguous()
    return [colour, wide, grey]


def _timm_pixels(augment, monkeypatch, picture, operation: TimmOperation, magnitude: float, u: tuple) -> np.ndarray:
    """timm's NAME_TO_OP at ``magnitude`` with its random calls answered by the uniforms ``u``."""
    monkeypatch.setattr(augment.random, "random", lambda: u[1])
    monkeypatch.setattr(augment.random, "uniform", lambda a, b: a + (b - a) * u[3])
    level = augment.LEVEL_TO_ARG[operation.name]
    args = level(magnitude, _hparams(augment)) if level else ()
    filters = {"bilinear": augment.Image.BILINEAR, "bicubic": augment.Image.BICUBIC, None: augment.Image.BICUBIC}
    return np.array(augment.NAME_TO_OP[operation.name](picture, *args, fillcolor=FILL,
                                                        resample=filters[operation.resample]))


def test_every_operation_at_every_magnitude_bin_gives_timms_pixels(monkeypatch):
    augment = timm_augment()
    for image in _images():
        picture = to_picture(image)
        for name in NAMES:
            for magnitude in range(11):
                for u in ((0.5, 0.2, 0.3, 0.1), (0.5, 0.8, 0.7, 0.9)):  # noise unused (std 0), sign, filter, radius
                    operation = timm_operation(name, float(magnitude), 0.0, u)
                    if name.startswith("Posterize") and operation.argument == 0:
                        continue  # timm raises with this Pillow (tests/test_timm_rand_augment.py)
                    ours = np.array(pil_operation(picture, operation, FILL))
                    theirs = _timm_pixels(augment, monkeypatch, picture, operation, float(magnitude), u)
                    np.testing.assert_array_equal(ours, theirs, err_msg=f"{name} at {magnitude}")


def _recorder(augment, applied: list, name: str):
    def record(img, *args, **kwargs):
        kwargs = dict(kwargs)
        resample = None
        if name in RESAMPLED:
            augment._check_args_tf(kwargs)  # timm's own choice of filter
            resample = {augment.Image.BILINEAR: "bilinear", augment.Image.BICUBIC: "bicubic"}[kwargs["resample"]]
        argument = args[0] if args else None
        if name == "GaussianBlurRand":
            argument = random.uniform(0.1, 2.0 * argument)  # as timm's gaussian_blur_rand draws it
        applied.append(TimmOperation(name, argument, resample))
        return img
    return record


def _same(a: list, b: list) -> float:
    from scipy.stats import chi2_contingency

    a, b = Counter(a), Counter(b)
    keys = sorted(set(a) | set(b), key=repr)
    return chi2_contingency(np.array([[a[k] for k in keys], [b[k] for k in keys]])).pvalue


def _compare(ours: list[tuple], theirs: list[tuple], continuous: tuple[str, ...], discrete: tuple[str, ...]):
    from scipy.stats import ks_2samp

    assert _same([len(ops) for ops in ours], [len(ops) for ops in theirs]) > 0.001
    flat_ours, flat_theirs = [op for ops in ours for op in ops], [op for ops in theirs for op in ops]
    assert _same([op.name for op in flat_ours], [op.name for op in flat_theirs]) > 0.001
    assert _same([op.resample for op in flat_ours], [op.resample for op in flat_theirs]) > 0.001
    for name in continuous:
        assert ks_2samp([op.argument for op in flat_ours if op.name == name],
                        [op.argument for op in flat_theirs if op.name == name]).pvalue > 0.001, name
    for name in discrete:
        assert _same([op.argument for op in flat_ours if op.name == name],
                     [op.argument for op in flat_theirs if op.name == name]) > 0.001, name


def _our_rows(op: dict) -> tuple:
    from dali_bridge.pipeline.sampling import draws

    plan = plan_of([{"center_crop": 8}, op])
    step = plan.steps[1]
    return step, draws(plan, seed=0, epoch=0, indices=np.arange(DRAWS))[1]


@pytest.mark.parametrize("config, continuous, discrete", [
    ("original-mstd0.5", ("Rotate", "Color", "ShearX"), ("PosterizeOriginal", "Solarize")),
    ("v0r", ("Rotate", "ShearY", "TranslateYRel"), ("PosterizeIncreasing", "SolarizeAdd", "Solarize")),
    ("3a-mstd1", ("Desaturate", "GaussianBlurRand"), ("Solarize",)),
])
@pytest.mark.slow
def test_auto_augment_draws_follow_timms_chi_square_and_kolmogorov_smirnov(monkeypatch, config, continuous, discrete):
    augment = timm_augment()
    transform = augment.auto_augment_transform(config, _hparams(augment))
    applied: list = []
    for sub in transform.policy:
        for op in sub:
            monkeypatch.setattr(op, "aug_fn", _recorder(augment, applied, op.name))
    random.seed(0)
    theirs = []
    for _ in range(DRAWS):
        applied.clear()
        transform(None)
        theirs.append(tuple(applied))
    policy, _, std = config.partition("-mstd")
    step, rows = _our_rows({"timm_auto_augment": {"policy": policy, "magnitude_std": float(std or 0)}})
    assert draw_count(step) == 11
    ours = [step.op.sample(step.params, row, 8, 8)[0].operations for row in rows]
    _compare(ours, theirs, continuous, discrete)


@pytest.mark.parametrize("config, params", [
    ("augmix-m5-w4-d2", {"magnitude": 5, "mixture_width": 4, "chain_depth": 2}),
    ("augmix-m3-mstd0.5-a0.5", {"magnitude": 3, "magnitude_std": 0.5, "alpha": 0.5}),
])
@pytest.mark.slow
def test_augmix_draws_follow_timms_chi_square_and_kolmogorov_smirnov(monkeypatch, config, params):
    from scipy.stats import ks_2samp

    augment = timm_augment()
    transform = augment.augment_and_mix_transform(config, _hparams(augment, 0.3))
    applied: list = []
    for op in transform.ops:
        monkeypatch.setattr(op, "aug_fn", _recorder(augment, applied, op.name))
    weights = record_augmix_weights(transform, monkeypatch)
    np.random.seed(0)
    random.seed(0)
    picture, theirs, chains = to_picture(torch.zeros(3, 4, 4, dtype=torch.uint8)), [], []
    for _ in range(DRAWS // 4):
        applied.clear()
        transform(picture)
        theirs.append(tuple(applied))
    step, rows = _our_rows({"timm_augmix": params})
    assert draw_count(step) == step.params["mixture_width"] * (2 + 4 * 3 if params.get(
        "chain_depth", -1) < 0 else 2 + 4 * params["chain_depth"]) + 2
    drawn = [step.op.sample(step.params, row, 8, 8)[0] for row in rows[:DRAWS // 4]]
    ours = [tuple(op for chain in draw.chains for op in chain) for draw in drawn]
    chains = [len(chain) for draw in drawn for chain in draw.chains]
    assert set(chains) == ({params["chain_depth"]} if "chain_depth" in params else {1, 2, 3})
    _compare(ours, theirs, ("Rotate", "ColorIncreasing", "TranslateXRel"), ("PosterizeIncreasing",))
    for n, name in enumerate(("first chain's weight", "blend")):
        assert ks_2samp([(draw.chain_weights[0], draw.blend)[n] for draw in drawn],
                        [w[n] for w in weights]).pvalue > 0.001, name


def _timm_mix(augment, monkeypatch, image: torch.Tensor, draw: TimmMixDraw):
    """timm's AugMixAugment mixing ``draw``'s chains at its weights: its depth and choice of operations
    answered by the draw, each operation timm's NAME_TO_OP at the drawn argument."""
    def op_of(operation):
        filters = {"bilinear": augment.Image.BILINEAR, "bicubic": augment.Image.BICUBIC, None: None}
        args = () if operation.argument is None else (operation.argument,)
        return lambda img: augment.NAME_TO_OP[operation.name](img, *args, fillcolor=draw.fill,
                                                              resample=filters[operation.resample])

    chains = iter(draw.chains)
    pending: list = []
    def depth(low, high):
        pending.append(next(chains))
        return len(pending[-1])

    monkeypatch.setattr(augment.np.random, "randint", depth)
    monkeypatch.setattr(augment.np.random, "choice", lambda ops, depth, replace: [op_of(o) for o in pending[-1]])
    transform = augment.AugMixAugment([], width=len(draw.chains), depth=-1, blended=draw.blended)
    weights, blend = np.array(draw.chain_weights, dtype=np.float32), np.float32(draw.blend)
    run = transform._apply_blended if draw.blended else transform._apply_basic
    return torch.from_numpy(np.array(run(to_picture(image), weights, blend))).permute(2, 0, 1)


@pytest.mark.parametrize("blended", [False, True])
def test_augmix_mixes_give_timms_pixels(monkeypatch, blended):
    augment = timm_augment()
    step, rows = _our_rows({"timm_augmix": {"magnitude": 9, "mixture_width": 4, "blended": blended,
                                            "fill": list(FILL)}})
    for image in _images():
        for row in rows[:12]:
            draw = step.op.sample(step.params, row, *image.shape[1:])[0]
            assert torch.equal(mix(image, draw), _timm_mix(augment, monkeypatch, image, draw))


def test_auto_augment_names_timms_policies_as_timm_auto_augment_holds_them():
    from dali_bridge.ops.auto_augment import TIMM_POLICY_NAMES
    from dali_bridge.recipes.from_timm import TIMM_POLICIES

    assert tuple(POLICIES) == TIMM_POLICY_NAMES == TIMM_POLICIES
    with pytest.raises(SpecError, match=r"auto_augment.policy: expected one of imagenet, found 'v0' \('v0' is a timm "
                                        r"policy: write it as timm_auto_augment: \{policy: v0\}\)"):
        plan_of([{"center_crop": 8}, {"auto_augment": {"policy": "v0"}}])


@pytest.mark.parametrize("op, message", [
    ({"timm_auto_augment": {"policy": "imagenet"}}, "timm_auto_augment.policy: expected one of original, originalr, "
                                                    "v0, v0r, 3a, found 'imagenet'"),
    ({"timm_auto_augment": {"magnitude_std": -1}}, "timm_auto_augment.magnitude_std: expected a number >= 0"),
    ({"timm_auto_augment": {"magnitude_std": float("inf")}}, "timm_auto_augment.magnitude_std: expected a finite"),
    ({"timm_augmix": {"magnitude": 11}}, "timm_augmix.magnitude: expected a magnitude .an integer >= 0, at most 10"),
    ({"timm_augmix": {"blended": 1}}, "timm_augmix.blended: expected true or false"),
    ({"timm_augmix": {"severity": 3}}, "timm_augmix.severity: unknown key 'severity' in op 'timm_augmix' .expected "
                                       "one of: magnitude, mixture_width"),
])
def test_spelling_mistakes_are_refused_naming_the_field(op, message):
    with pytest.raises(SpecError, match=message):
        plan_of([{"center_crop": 8}, op])


def test_shear_translate_and_rotate_use_the_fill_and_the_others_ignore_it():
    image = _images()[0]
    moved = TimmOperation("TranslateXRel", 0.45, "bilinear")
    out = np.array(pil_operation(to_picture(image), moved, FILL))
    assert (out[:, -5:] == FILL).all()  # the columns moved in
    assert timm_operation("Equalize", 9.0, 0.0, (0.5, 0.5, 0.5)).resample is None


@pytest.fixture(scope="module")
def mixed_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mixed_images(tmp_path_factory.mktemp("timm_policies"))


@needs_cpu_backends
@pytest.mark.parametrize("op", [{"timm_auto_augment": {"policy": "original", "magnitude_std": 0.5, "fill": list(FILL)}},
                                {"timm_augmix": {"magnitude": 5, "mixture_width": 4, "chain_depth": 2}}])
def test_timm_policies_equal_torchvision_backend_exactly_on_dali_cpu(mixed_root, op):
    from tests.helpers.equivalence import pipeline, run_compare

    ops = [{"center_crop": 64}, {"horizontal_flip": 0.5}, op, {"normalize": {}}]
    result = run_compare(pipeline(mixed_root, ops, batch_size=3))
    assert result.samples == 8 and result.passed and result.output("image").max_abs == 0.0, result.format()
