"""rand_augment with variant timm: timm's RandAugment (``rand-m9-mstd0.5-inc1``) — its level arguments,
its PIL operations and its draws against timm's own code where timm is installed, and the backends'
pixels everywhere."""
from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.helpers.backends import needs_cpu_backends, plan_of
from tests.helpers.color_images import write_mixed_images

from dali_bridge.ops.timm_rand_augment import OPERATIONS, TimmDraw, TimmOperation, apply_timm, level_argument
from dali_bridge.spec.problems import SpecError
from dali_bridge.pipeline.sampling import draw_count

DRAWS = 10_000
TIMM_M9_MSTD05_INC1 = {"variant": "timm", "magnitude": 9, "magnitude_std": 0.5, "increasing": True}
NAMES = sorted(set(OPERATIONS[False]) | set(OPERATIONS[True]))



def timm_augment():
    return pytest.importorskip("timm.data.auto_augment", reason="timm is not installed: its own code is the reference")


def test_timm_options_need_the_timm_variant():
    with pytest.raises(SpecError) as error:
        plan_of([{"center_crop": 8}, {"rand_augment": {"magnitude_std": 0.5}}])
    assert "rand_augment.magnitude_std" in str(error.value) and "variant: timm" in str(error.value)
    step = plan_of([{"center_crop": 8}, {"rand_augment": dict(TIMM_M9_MSTD05_INC1, num_ops=3)}]).steps[1]
    assert draw_count(step) == 15


@pytest.mark.slow
def test_level_arguments_equal_timm_level_to_arg(monkeypatch):
    augment = timm_augment()
    for name in NAMES:
        for magnitude in (0.0, 0.7, 4.5, 9.0, 10.0):
            for u_sign in (0.2, 0.8):
                monkeypatch.setattr(augment.random, "random", lambda: u_sign)
                level = augment.LEVEL_TO_ARG[name]
                want = level(magnitude, dict(augment._HPARAMS_DEFAULT))[0] if level else None
                assert level_argument(name, magnitude, u_sign) == want, (name, magnitude, u_sign)


def _images() -> list[torch.Tensor]:
    rng = np.random.default_rng(6)
    colour = torch.from_numpy(rng.integers(0, 256, (3, 29, 43), dtype=np.uint8))
    grey = torch.from_numpy(rng.integers(10, 240, (1, 40, 21), dtype=np.uint8)).expand(3, -1, -1).contiguous()
    return [colour, grey]


def test_pil_operations_equal_timm_at_extreme_magnitudes(monkeypatch):
    from PIL import Image

    augment = timm_augment()
    filters = {"bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC}
    for image in _images():
        picture = Image.fromarray(np.ascontiguousarray(image.permute(1, 2, 0).numpy()))
        for name in NAMES:
            for magnitude, u_sign in ((0.0, 0.2), (10.0, 0.2), (10.0, 0.8)):
                argument = level_argument(name, magnitude, u_sign)
                if name.startswith("Posterize") and argument == 0:
                    continue  # timm raises with this Pillow: test_posterize_keeping_no_bit_is_black
                for resample in ("bilinear", "bicubic"):
                    ours = apply_timm(image, TimmDraw((TimmOperation(name, argument, resample),), (124, 116, 104)))
                    args = () if argument is None else (argument,)
                    theirs = augment.NAME_TO_OP[name](picture, *args, fillcolor=(124, 116, 104),
                                                      resample=filters[resample])
                    assert torch.equal(ours, torch.from_numpy(np.array(theirs)).permute(2, 0, 1)), (name, magnitude)


def test_posterize_keeping_no_bit_is_black_where_timm_with_this_pillow_raises():
    from PIL import Image

    image = _images()[0]
    black = apply_timm(image, TimmDraw((TimmOperation("PosterizeIncreasing", 0, None),), (128, 128, 128)))
    assert black.shape == image.shape and not black.any()
    augment = timm_augment()
    with pytest.raises(ValueError):
        augment.NAME_TO_OP["Posterize"](Image.fromarray(np.ascontiguousarray(image.permute(1, 2, 0).numpy())), 0)


def _timm_draws(monkeypatch) -> list[tuple]:
    """The operations timm's own rand-m9-mstd0.5-inc1 applies, with its RNGs, recorded instead of applied."""
    augment = timm_augment()
    transform = augment.rand_augment_transform("rand-m9-mstd0.5-inc1", {})
    applied: list = []

    def recorder(name):
        def record(img, *args, **kwargs):
            kwargs = dict(kwargs)
            if name in ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"):
                augment._check_args_tf(kwargs)  # timm's own choice of filter
                resample = {augment.Image.BILINEAR: "bilinear", augment.Image.BICUBIC: "bicubic"}[kwargs["resample"]]
            else:
                resample = None
            applied.append(TimmOperation(name, args[0] if args else None, resample))
            return img
        return record

    for op in transform.ops:
        monkeypatch.setattr(op, "aug_fn", recorder(op.name))
    random.seed(0)
    np.random.seed(0)
    found = []
    for _ in range(DRAWS):
        applied.clear()
        transform(None)
        found.append(tuple(applied))
    return found


def test_timm_variant_draws_follow_timm_rand_augment_chi_square_and_kolmogorov_smirnov(monkeypatch):
    from scipy.stats import chi2_contingency, ks_2samp

    from dali_bridge.pipeline.sampling import draws

    theirs = _timm_draws(monkeypatch)
    plan = plan_of([{"center_crop": 8}, {"rand_augment": TIMM_M9_MSTD05_INC1}])
    step, rows = plan.steps[1], draws(plan, seed=0, epoch=0, indices=np.arange(DRAWS))[1]
    ours = [step.op.sample(step.params, row, 8, 8)[0].operations for row in rows]

    def same(a: list, b: list) -> float:
        a, b = Counter(a), Counter(b)
        keys = sorted(set(a) | set(b), key=repr)
        return chi2_contingency(np.array([[a[k] for k in keys], [b[k] for k in keys]])).pvalue

    assert same([len(ops) for ops in ours], [len(ops) for ops in theirs]) > 0.001  # each layer applied with 0.5
    flat_ours, flat_theirs = [op for ops in ours for op in ops], [op for ops in theirs for op in ops]
    assert same([op.name for op in flat_ours], [op.name for op in flat_theirs]) > 0.001
    assert same([op.resample for op in flat_ours], [op.resample for op in flat_theirs]) > 0.001
    for name in ("Rotate", "BrightnessIncreasing", "ShearX"):  # magnitude noise, clipping and sign
        assert ks_2samp([op.argument for op in flat_ours if op.name == name],
                        [op.argument for op in flat_theirs if op.name == name]).pvalue > 0.001, name
    for name in ("PosterizeIncreasing", "SolarizeIncreasing", "SolarizeAdd"):  # integer levels
        assert same([op.argument for op in flat_ours if op.name == name],
                    [op.argument for op in flat_theirs if op.name == name]) > 0.001, name


@pytest.fixture(scope="module")
def mixed_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mixed_images(tmp_path_factory.mktemp("timm"))


@needs_cpu_backends
def test_timm_variant_equals_torchvision_backend_exactly_on_dali_cpu(mixed_root):
    from tests.helpers.equivalence import pipeline, run_compare

    ops = [{"center_crop": 64}, {"horizontal_flip": 0.5},
           {"rand_augment": dict(TIMM_M9_MSTD05_INC1, num_ops=3, fill=[124, 116, 104])}, {"normalize": {}}]
    result = run_compare(pipeline(mixed_root, ops, batch_size=3))
    assert result.samples == 8 and result.passed and result.output("image").max_abs == 0.0, result.format()


@needs_cpu_backends
@pytest.mark.slow
def test_timm_variant_after_a_random_resized_crop_amplifies_its_rounding_within_the_pinned_bound(sample_root):
    """As for torchvision's policies (tests/ops/test_auto_augment.py): DALI's resize rounds up to 1 level
    differently, and solarize thresholds, posterize bits, equalize and autocontrast mappings turn some of those
    into large steps. Measured on the 37 test images: max 206 levels, mean 0.152."""
    from tests.helpers.equivalence import pipeline, run_compare

    ops = [{"random_resized_crop": [96, 80]}, {"horizontal_flip": 0.5}, {"rand_augment": TIMM_M9_MSTD05_INC1},
           {"normalize": {}}]
    result = run_compare(pipeline(sample_root, ops))
    image = result.output("image")
    assert result.output("index").mismatches == 0 and result.output("label").mismatches == 0
    assert image.max_abs <= 206 + 1e-3 and image.mean_abs <= 0.16, result.format()
