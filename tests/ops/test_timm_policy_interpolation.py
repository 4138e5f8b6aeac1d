"""timm's policies take ``interpolation`` as timm does: ``random`` (its default) draws bilinear or bicubic
per shear, translate and rotate; a fixed filter (timm's ``--train-interpolation bicubic``, passed to its
policies as the hparam ``interpolation``) is used as given, with every other draw unchanged. Checked on
rand_augment's timm variant, timm_auto_augment and timm_augmix, against timm's own code where installed."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dali_bridge.ops.timm_rand_augment import TimmOperation, pil_operation, to_picture
from dali_bridge.pipeline.sampling import draws
from dali_bridge.spec.problems import SpecError
from tests.helpers.backends import needs_cpu_backends, plan_of

RESAMPLED = ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel")
FILL = (124, 116, 104)
POLICIES = {
    "rand_augment": ({"variant": "timm", "magnitude": 7, "magnitude_std": 0.5, "increasing": True},
                     lambda augment, hparams: augment.rand_augment_transform("rand-m7-mstd0.5-inc1", hparams)),
    "timm_auto_augment": ({"policy": "original"},
                          lambda augment, hparams: augment.auto_augment_transform("original", hparams)),
    "timm_augmix": ({"magnitude": 5}, lambda augment, hparams: augment.augment_and_mix_transform(
        "augmix-m5", dict(hparams, translate_pct=0.3))),
}


def timm_augment():
    return pytest.importorskip("timm.data.auto_augment", reason="timm is not installed: its own code is the reference")


def _operations(op: str, params: dict, count: int = 3000) -> list[TimmOperation]:
    plan = plan_of([{"center_crop": 8}, {op: params}])
    step, rows = plan.steps[1], draws(plan, seed=1, epoch=0, indices=np.arange(count))[1]
    found = []
    for row in rows:
        draw = step.op.sample(step.params, row, 8, 8)[0]
        chains = draw.chains if hasattr(draw, "chains") else (draw.operations,)
        found += [operation for chain in chains for operation in chain]
    return found


def _timm_filters(augment, monkeypatch, op: str, interpolation: str | None) -> set[str]:
    """The filters timm's own policy resamples with, its operations recorded instead of applied."""
    names = {augment.Image.NEAREST: "nearest", augment.Image.BILINEAR: "bilinear", augment.Image.BICUBIC: "bicubic"}
    hparams = dict(augment._HPARAMS_DEFAULT, img_mean=FILL)
    if interpolation is not None:  # timm's create_transform: aa_params['interpolation'] unless 'random'
        hparams["interpolation"] = {v: k for k, v in names.items()}[interpolation]
    transform = POLICIES[op][1](augment, hparams)
    seen: set[str] = set()

    def record(name):
        def apply(img, *args, **kwargs):
            if name in RESAMPLED:
                kwargs = dict(kwargs)
                augment._check_args_tf(kwargs)  # timm's own choice (or not) of the filter
                seen.add(names[kwargs["resample"]])
            return img
        return apply

    ops = transform.ops if hasattr(transform, "ops") else [op for sub in transform.policy for op in sub]
    for augment_op in ops:
        monkeypatch.setattr(augment_op, "aug_fn", record(augment_op.name))
    picture = to_picture(torch.zeros(3, 4, 4, dtype=torch.uint8))
    for _ in range(400):
        transform(picture)
    return seen


@pytest.mark.parametrize("op", list(POLICIES))
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear", "bicubic", "random"])
def test_a_fixed_filter_is_used_as_given_and_random_draws_both_as_timms_own_policy(monkeypatch, op, interpolation):
    ours = {o.resample for o in _operations(op, dict(POLICIES[op][0], interpolation=interpolation))
            if o.name in RESAMPLED}
    assert ours == ({"bilinear", "bicubic"} if interpolation == "random" else {interpolation})
    augment = timm_augment()
    assert _timm_filters(augment, monkeypatch, op, None if interpolation == "random" else interpolation) == ours


@pytest.mark.parametrize("op", list(POLICIES))
def test_a_fixed_filter_changes_no_other_draw(op):
    drawn = {mode: _operations(op, dict(POLICIES[op][0], interpolation=mode), 500) for mode in ("random", "bicubic")}
    assert [(o.name, o.argument) for o in drawn["random"]] == [(o.name, o.argument) for o in drawn["bicubic"]]


def test_rand_augment_without_interpolation_keeps_each_variant_s_default():
    timm = plan_of([{"center_crop": 8}, {"rand_augment": POLICIES["rand_augment"][0]}]).steps[1]
    torchvision = plan_of([{"center_crop": 8}, {"rand_augment": {"num_ops": 2}}]).steps[1]
    assert (timm.params["interpolation"], torchvision.params["interpolation"]) == ("random", "nearest")


@pytest.mark.parametrize("interpolation", ["bicubic", "random"])
def test_torchvision_s_rand_augment_refuses_timm_s_filters_saying_which_variant_has_them(interpolation):
    with pytest.raises(SpecError, match=rf"rand_augment.interpolation: expected one of nearest, bilinear, found "
                                        rf"'{interpolation}' \(torchvision's RandAugment; bicubic and random are "
                                        rf"timm's: add 'variant: timm'\)"):
        plan_of([{"center_crop": 8}, {"rand_augment": {"interpolation": interpolation}}])


def test_nearest_moves_give_timms_pixels(monkeypatch):
    augment = timm_augment()
    image = torch.from_numpy(np.random.default_rng(3).integers(0, 256, (3, 23, 31), dtype=np.uint8))
    picture = to_picture(image)
    for name, argument in (("Rotate", 17.0), ("ShearX", -0.2), ("ShearY", 0.25), ("TranslateXRel", 0.3),
                           ("TranslateYRel", -0.45)):
        ours = np.array(pil_operation(picture, TimmOperation(name, argument, "nearest"), FILL))
        theirs = np.array(augment.NAME_TO_OP[name](picture, argument, fillcolor=FILL, resample=augment.Image.NEAREST))
        np.testing.assert_array_equal(ours, theirs, err_msg=name)


@pytest.fixture(scope="module")
def mixed_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.helpers.color_images import write_mixed_images

    return write_mixed_images(tmp_path_factory.mktemp("timm_interpolation"))


@needs_cpu_backends
@pytest.mark.parametrize("op", ["rand_augment", "timm_augmix"])
def test_a_fixed_bicubic_policy_equals_the_torchvision_backend_exactly_on_dali_cpu(mixed_root, op):
    from tests.helpers.equivalence import pipeline, run_compare

    params = dict(POLICIES[op][0], interpolation="bicubic", fill=list(FILL))
    ops = [{"center_crop": 64}, {"horizontal_flip": 0.5}, {op: params}, {"normalize": {}}]
    result = run_compare(pipeline(mixed_root, ops, batch_size=3))
    assert result.samples == 8 and result.passed and result.output("image").max_abs == 0.0, result.format()
