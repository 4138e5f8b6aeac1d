"""from_torchvision / to_torchvision: a transforms.v2 Compose becomes a pipeline and comes back equal.

Tested on torchvision's reference recipe presets: ``preset_train`` and ``preset_eval`` build the
Compose that ``ClassificationPresetTrain`` / ``ClassificationPresetEval`` build in torchvision's
``references/classification/presets.py`` (pytorch/vision; not in the installed package), for
each of their ``backend`` ("tensor", "pil") and ``use_v2`` forms.
"""
from __future__ import annotations

import enum
import math
import warnings

import numpy as np
import pytest
import torch
import torchvision.transforms as T
from torchvision.transforms import InterpolationMode, v2

from tests.helpers.paths import PIPELINES
from dali_bridge import from_torchvision
from dali_bridge.cli import main as cli
from dali_bridge.spec.pipeline import load_spec
from dali_bridge.ops.registry import OPS
from dali_bridge.recipes.to_torchvision import batch_transform
from dali_bridge.errors import RecipeError
from dali_bridge.recipes.to_torchvision import to_torchvision
from dali_bridge.recipes.from_torchvision import RecipeWarning
from dali_bridge.ops.facets import SpecRules, facet
from dali_bridge.pipeline.sampling import draw_count

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def preset_train(*, crop_size, interpolation=InterpolationMode.BILINEAR, hflip_prob=0.5, auto_augment_policy=None,
                 ra_magnitude=9, augmix_severity=3, random_erase_prob=0.0, backend="tensor", use_v2=True):
    """The Compose of torchvision's ClassificationPresetTrain (references/classification/presets.py)."""
    M = v2 if use_v2 else T
    transforms = [M.PILToTensor()] if backend == "tensor" else []
    transforms.append(M.RandomResizedCrop(crop_size, interpolation=interpolation, antialias=True))
    if hflip_prob > 0:
        transforms.append(M.RandomHorizontalFlip(hflip_prob))
    if auto_augment_policy == "ra":
        transforms.append(M.RandAugment(interpolation=interpolation, magnitude=ra_magnitude))
    elif auto_augment_policy == "ta_wide":
        transforms.append(M.TrivialAugmentWide(interpolation=interpolation))
    elif auto_augment_policy == "augmix":
        transforms.append(M.AugMix(interpolation=interpolation, severity=augmix_severity))
    elif auto_augment_policy is not None:
        transforms.append(M.AutoAugment(policy=M.AutoAugmentPolicy(auto_augment_policy), interpolation=interpolation))
    if backend == "pil":
        transforms.append(M.PILToTensor())
    transforms += [M.ToDtype(torch.float, scale=True) if use_v2 else M.ConvertImageDtype(torch.float),
                   M.Normalize(mean=MEAN, std=STD)]
    if random_erase_prob > 0:
        transforms.append(M.RandomErasing(p=random_erase_prob))
    if use_v2:
        transforms.append(M.ToPureTensor())
    return M.Compose(transforms)


def preset_eval(*, crop_size, resize_size=256, interpolation=InterpolationMode.BILINEAR, backend="tensor",
                use_v2=True):
    """The Compose of torchvision's ClassificationPresetEval (references/classification/presets.py)."""
    M = v2 if use_v2 else T
    transforms = [M.PILToTensor()] if backend == "tensor" else []
    transforms += [M.Resize(resize_size, interpolation=interpolation, antialias=True), M.CenterCrop(crop_size)]
    if backend == "pil":
        transforms.append(M.PILToTensor())
    transforms += [M.ToDtype(torch.float, scale=True) if use_v2 else M.ConvertImageDtype(torch.float),
                   M.Normalize(mean=MEAN, std=STD)]
    if use_v2:
        transforms.append(M.ToPureTensor())
    return M.Compose(transforms)


def state(transform) -> tuple:
    """A transform as comparable data: its class name and public attributes (enums by value, tuples as lists)."""
    def plain(value):
        if isinstance(value, enum.Enum):
            return value.value
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        return value
    return type(transform).__name__, {k: plain(v) for k, v in vars(transform).items()
                                      if not k.startswith("_") and k not in ("training", "inplace", "policies")}


def ops_of(spec) -> list:
    return [(op.name, dict(op.params)) for op in spec.ops]


def mapped(compose) -> list:
    """The transforms of a Compose that are ops (the finish's conversions and containers left out)."""
    skip = {"PILToTensor", "ToPureTensor", "ToImage", "ToDtype", "ConvertImageDtype", "Normalize"}
    return [t for t in compose.transforms if type(t).__name__ not in skip]


POLICY_OPS = {
    None: [],
    "ta_wide": [("trivial_augment_wide", {"num_magnitude_bins": 31, "interpolation": "bilinear", "fill": None})],
    "ra": [("rand_augment", {"num_ops": 2, "magnitude": 5, "num_magnitude_bins": 31, "interpolation": "bilinear",
                             "fill": None, "variant": "torchvision", "magnitude_std": 0.0, "increasing": False})],
    "augmix": [("augmix", {"severity": 6, "mixture_width": 3, "chain_depth": -1, "alpha": 1.0, "all_ops": True,
                           "interpolation": "bilinear", "fill": None})],
    "imagenet": [("auto_augment", {"policy": "imagenet", "interpolation": "bilinear", "fill": None})],
}
FINISH = ("normalize", {"mean": list(MEAN), "std": list(STD), "dtype": "float32", "layout": "CHW"})


@pytest.mark.parametrize("use_v2", [True, False], ids=["v2", "v1"])
@pytest.mark.parametrize("policy", list(POLICY_OPS))
def test_each_reference_train_preset_maps_to_its_ops(policy, use_v2, tmp_path):
    compose = preset_train(crop_size=176, auto_augment_policy=policy, ra_magnitude=5, augmix_severity=6,
                           random_erase_prob=0.1, hflip_prob=0.3, use_v2=use_v2)
    spec = from_torchvision(compose, source=tmp_path)
    rrc = {"size": 176, "scale": [0.08, 1.0], "ratio": [0.75, 4 / 3], "interpolation": "bilinear", "antialias": True}
    erasing = {"probability": 0.1, "scale": [0.02, 0.33], "ratio": [0.3, 3.3], "value": 0.0}
    assert ops_of(spec) == [("random_resized_crop", rrc), ("horizontal_flip", {"probability": 0.3}),
                            *POLICY_OPS[policy], FINISH, ("random_erasing", erasing)]
    assert spec.outputs == ("image", "label")


def test_a_preset_without_flip_or_erasing_has_neither(tmp_path):
    spec = from_torchvision(preset_train(crop_size=160, hflip_prob=0.0, interpolation=InterpolationMode.BICUBIC),
                            source=tmp_path)
    assert [name for name, _ in ops_of(spec)] == ["random_resized_crop", "normalize"]
    assert ops_of(spec)[0][1]["interpolation"] == "bicubic"


def test_a_bicubic_preset_with_a_policy_is_refused_as_torchvisions_tensor_kernels_refuse_it(tmp_path):
    with pytest.raises(RecipeError, match=r"transform 3 \(TrivialAugmentWide\): interpolation: expected one of "
                                          r"nearest, bilinear, found 'bicubic'"):
        from_torchvision(preset_train(crop_size=160, auto_augment_policy="ta_wide",
                                      interpolation=InterpolationMode.BICUBIC), source=tmp_path)


@pytest.mark.parametrize("policy", list(POLICY_OPS))
def test_a_train_preset_comes_back_from_to_torchvision_equal(policy, tmp_path):
    compose = preset_train(crop_size=224, auto_augment_policy=policy, random_erase_prob=0.25,
                           interpolation=InterpolationMode.NEAREST if policy else InterpolationMode.BILINEAR)
    back = to_torchvision(from_torchvision(compose, source=tmp_path))
    assert [state(t) for t in mapped(back)] == [state(t) for t in mapped(compose)]
    finish = [state(t) for t in back.transforms if type(t).__name__ in ("ToDtype", "Normalize")]
    assert finish == [state(v2.ToDtype(torch.float32, scale=True)), state(v2.Normalize(MEAN, STD))]


@pytest.mark.parametrize("use_v2", [True, False], ids=["v2", "v1"])
def test_the_eval_preset_maps_to_resize_center_crop_normalize(use_v2, tmp_path):
    compose = preset_eval(crop_size=224, resize_size=232, interpolation=InterpolationMode.BICUBIC, use_v2=use_v2)
    spec = from_torchvision(compose, source=tmp_path, overrides={"loader.shuffle": False})
    resize = {"size": 232, "max_size": None, "interpolation": "bicubic", "antialias": True}
    assert ops_of(spec) == [("resize", resize), ("center_crop", {"size": 224}), FINISH]
    assert not spec.loader.shuffle
    assert [state(t) for t in mapped(to_torchvision(spec))] == [state(t) for t in mapped(preset_eval(
        crop_size=224, resize_size=232, interpolation=InterpolationMode.BICUBIC))]


def test_the_eval_preset_gives_the_users_pixels_on_the_torchvision_backend(sample_root):
    from torchvision.io import ImageReadMode, decode_image

    from dali_bridge import build_loader

    compose = preset_eval(crop_size=48, resize_size=56)
    spec = from_torchvision(compose, source=sample_root, batch_size=5,
                            overrides={"loader.workers": 0, "loader.shuffle": False, "outputs": ["image", "index"]})
    loader = build_loader(spec, "torchvision")
    images, indices = next(iter(loader))
    for image, index in zip(images, indices.tolist()):
        theirs = compose(decode_image(loader.listing.paths[index], mode=ImageReadMode.RGB))
        torch.testing.assert_close(image, theirs, atol=1e-6, rtol=0)


def test_the_train_preset_is_the_users_compose_at_the_bridges_draws_on_the_torchvision_backend(sample_root):
    """Every sample of a batch equals the user's own transforms, step by step, given the bridge's draws."""
    from torchvision.io import ImageReadMode, decode_image

    from dali_bridge import build_loader
    from dali_bridge.pipeline.plan import build_plan
    from dali_bridge.pipeline.sampling import draws, sample_steps

    compose = preset_train(crop_size=40, auto_augment_policy="ta_wide", random_erase_prob=0.5)
    spec = from_torchvision(compose, source=sample_root, batch_size=6,
                            overrides={"loader.workers": 0, "outputs": ["image", "index"]})
    loader = build_loader(spec, "torchvision")
    images, indices = next(iter(loader))
    plan = build_plan(spec)
    crop, flip, policy, to_float, normalize, erasing = (compose.transforms[n] for n in range(1, 7))
    erase_position, erase_step = plan.post_finish[0]
    assert erase_step.name == "random_erasing"
    rows = draws(plan, spec.seed, 0, indices.numpy())
    for n, (image, index) in enumerate(zip(images, indices.tolist())):
        theirs = decode_image(loader.listing.paths[index], mode=ImageReadMode.RGB)
        steps = sample_steps(plan, *theirs.shape[-2:], {pos: row[n] for pos, row in rows.items()})
        (window, _), (flipped,), (drawn,) = (concrete for concrete, _ in steps)
        theirs = crop.transform(theirs, dict(top=window.top, left=window.left, height=window.height,
                                             width=window.width))
        theirs = flip.transform(theirs, {}) if flipped.apply else theirs
        for operation in drawn.operations:
            theirs = policy._apply_image_or_video_transform(theirs, operation.name, operation.magnitude,
                                                            interpolation=policy.interpolation, fill=policy._fill)
        theirs = normalize(to_float(theirs))
        (box,) = erase_step.op.sample(erase_step.params, rows[erase_position][n], 40, 40)
        if box.apply:
            theirs = erasing.transform(theirs, dict(i=box.top, j=box.left, h=box.height, w=box.width,
                                                    v=torch.zeros(1, 1, 1)))
        torch.testing.assert_close(image, theirs, atol=1e-6, rtol=0)


def test_the_pil_preset_maps_alike_and_says_its_kernels_were_pils(tmp_path):
    with pytest.warns(RecipeWarning, match="first 3 op.s. run on PIL images"):
        spec = from_torchvision(preset_train(crop_size=176, auto_augment_policy="ta_wide", backend="pil"),
                                source=tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RecipeWarning)  # the tensor form has nothing to say
        assert ops_of(from_torchvision(preset_train(crop_size=176, auto_augment_policy="ta_wide"),
                                       source=tmp_path)) == ops_of(spec)


# ---- the user's kernel given the bridge's drawn parameters

def _image(seed: int = 0, height: int = 40, width: int = 52):
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (3, height, width), dtype=np.uint8))


def _concrete(op_name: str, transform, height: int = 40, width: int = 52, seed: int = 0):
    before = [v2.CenterCrop(8)] + ([v2.ToDtype(torch.float32, scale=True)] if op_name == "random_erasing" else [])
    spec = from_torchvision(v2.Compose(before + [transform]), source=".")
    step = facet(OPS[op_name], SpecRules).lower(dict(next(op for op in spec.ops if op.name == op_name).params), 0)[0]
    u = np.random.default_rng(seed).random(draw_count(step))
    return step, step.op.sample(step.params, u, height, width)


@pytest.mark.parametrize("seed", range(3))
def test_random_resized_crop_is_the_users_transform_at_the_bridges_window(seed):
    transform = v2.RandomResizedCrop([30, 24], scale=(0.2, 0.9), interpolation=InterpolationMode.BICUBIC)
    step, (crop, _) = _concrete("random_resized_crop", transform, seed=seed)
    image = _image(seed)
    theirs = transform.transform(image, dict(top=crop.top, left=crop.left, height=crop.height, width=crop.width))
    assert torch.equal(step.op.torchvision_kernel(image, (crop, _), step.params), theirs)


@pytest.mark.parametrize("seed", range(3))
def test_color_jitter_is_the_users_transform_at_the_bridges_factors(seed):
    transform = v2.ColorJitter(brightness=0.4, contrast=(0.5, 1.2), saturation=0.3, hue=0.1)
    step, (jitter,) = _concrete("color_jitter", transform, seed=seed)
    image = _image(seed)
    theirs = transform.transform(image, dict(fn_idx=list(jitter.order), brightness_factor=jitter.brightness,
                                             contrast_factor=jitter.contrast, saturation_factor=jitter.saturation,
                                             hue_factor=jitter.hue))
    assert torch.equal(step.op.torchvision_kernel(image, (jitter,), step.params), theirs)


def test_random_erasing_is_the_users_transform_at_the_bridges_box():
    transform = v2.RandomErasing(p=1.0, scale=(0.1, 0.3), value=0.5)
    step, (erase,) = _concrete("random_erasing", transform)
    assert erase.apply
    image = torch.rand(3, 40, 52)
    ours = image.clone()
    step.op.apply(step.params, ours, (erase,))
    theirs = transform.transform(image, dict(i=erase.top, j=erase.left, h=erase.height, w=erase.width,
                                             v=torch.tensor([0.5])[:, None, None]))
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("transform", [
    v2.TrivialAugmentWide(interpolation=InterpolationMode.BILINEAR, fill=[10, 20, 30]),
    v2.RandAugment(num_ops=3, magnitude=7, interpolation=InterpolationMode.NEAREST, fill=5),
    v2.AutoAugment(interpolation=InterpolationMode.BILINEAR),
], ids=lambda t: type(t).__name__)
def test_a_policy_is_the_users_transform_at_the_bridges_operations(transform):
    op_name = {"TrivialAugmentWide": "trivial_augment_wide", "RandAugment": "rand_augment",
               "AutoAugment": "auto_augment"}[type(transform).__name__]
    moved = 0
    for seed in range(12):
        step, (draw,) = _concrete(op_name, transform, seed=seed)
        image = _image(seed)
        theirs = image
        for operation in draw.operations:  # the user's own transform applies each drawn operation
            theirs = transform._apply_image_or_video_transform(theirs, operation.name, operation.magnitude,
                                                               interpolation=transform.interpolation,
                                                               fill=transform._fill)
            moved += operation.name in ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY")
        assert torch.equal(step.op.torchvision_kernel(image, (draw,), step.params), theirs)
    assert moved  # the interpolation and fill were exercised


# ---- batch mixing, label smoothing, the other direction

def test_the_reference_mixup_cutmix_choice_becomes_batch_mix_with_soft_targets(tmp_path):
    mix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=10), v2.CutMix(alpha=1.0, num_classes=10)])
    spec = from_torchvision(preset_train(crop_size=176), source=tmp_path, batch_transform=mix, label_smoothing=0.1)
    assert ops_of(spec)[-1] == ("batch_mix", {"mixup_alpha": 0.2, "cutmix_alpha": 1.0, "cutmix_probability": 0.5,
                                              "probability": 1.0})
    assert spec.outputs == ("image", "target") and spec.label_smoothing == 0.1
    back = batch_transform(spec, num_classes=10)  # RandomApply([RandomChoice([MixUp, CutMix])], p=1)
    assert [state(t) for t in back.transforms[0].transforms] == [state(t) for t in mix.transforms]
    with pytest.raises(RecipeError, match="'batch_mix' runs on whole batches"):
        to_torchvision(spec)
    assert [type(t).__name__ for t in to_torchvision(spec, skip_batch_ops=True).transforms][-1] == "Normalize"


@pytest.mark.parametrize("mix, expected", [
    (v2.MixUp(alpha=0.4, num_classes=3), ("mixup", {"alpha": 0.4})),
    (v2.RandomChoice([v2.CutMix(alpha=1.0, num_classes=3)]), ("cutmix", {"alpha": 1.0})),
    (v2.RandomApply([v2.MixUp(alpha=0.2, num_classes=3)], p=0.5),
     ("batch_mix", {"mixup_alpha": 0.2, "cutmix_alpha": 1.0, "cutmix_probability": 0.0, "probability": 0.5})),
])
def test_each_batch_transform_form_maps_to_its_mixing_op(mix, expected, tmp_path):
    assert ops_of(from_torchvision(preset_eval(crop_size=32), source=tmp_path, batch_transform=mix))[-1] == expected


@pytest.mark.parametrize("name", ["imagenet_train.yaml", "imagenet_val.yaml", "torchvision_recipe_train.yaml",
                                  "torchvision_recipe_val.yaml"])
def test_a_shipped_pipeline_goes_to_torchvision_and_back_unchanged(name):
    spec = load_spec(PIPELINES / name)
    compose = to_torchvision(spec, skip_batch_ops=True)
    back = from_torchvision(compose, source=spec.source.root, batch_size=spec.batch_size)
    assert ops_of(back) == [(op.name, dict(op.params)) for op in spec.ops if OPS[op.name].category != "batch"]


def test_timms_rand_augment_variant_has_no_transforms_v2_counterpart():
    with pytest.raises(RecipeError, match="'rand_augment' has no transforms.v2 counterpart.*timm's transform"):
        to_torchvision(load_spec(PIPELINES / "timm_train.yaml"))


def test_to_torchvision_with_pil_puts_pil_to_tensor_before_the_finish():
    names = [type(t).__name__ for t in to_torchvision(load_spec(PIPELINES / "imagenet_val.yaml"), pil=True).transforms]
    assert names == ["Resize", "CenterCrop", "PILToTensor", "ToDtype", "Normalize"]


# ---- refusals: every problem at once, each naming its transform

def test_unmappable_transforms_are_refused_naming_each_and_the_closest_op(tmp_path):
    compose = v2.Compose([v2.RandomCrop(32), v2.RandomRotation(10), v2.Lambda(lambda x: x),
                          v2.RandomHorizontalFlip(), v2.MixUp(alpha=1.0, num_classes=3)])
    with pytest.raises(RecipeError) as error:
        from_torchvision(compose, source=tmp_path)
    assert error.value.problems == [
        "transform 0 (RandomCrop): RandomCrop has no op in dali-bridge; the closest op is 'random_resized_crop' "
        "(torchvision's RandomResizedCrop)",
        "transform 1 (RandomRotation): RandomRotation has no op in dali-bridge; the closest op is "
        "'trivial_augment_wide' (torchvision's TrivialAugmentWide)",
        error.value.problems[2],
        "transform 4 (MixUp): MixUp mixes whole batches, not one image: pass it as "
        "from_torchvision(..., batch_transform=...) (the 'mixup' op)"]
    assert error.value.problems[2].startswith("transform 2 (Lambda): Lambda has no op in dali-bridge; the transforms "
                                              "with an op are: AugMix, AutoAugment, CenterCrop")


def test_parameters_the_op_lacks_are_refused_with_the_reader_problems(tmp_path):
    compose = v2.Compose([v2.RandomResizedCrop(32, interpolation=InterpolationMode.LANCZOS),
                          v2.TrivialAugmentWide(interpolation=InterpolationMode.BICUBIC), v2.RandomRotation(3),
                          v2.AutoAugment(v2.AutoAugmentPolicy.CIFAR10)])
    with pytest.raises(RecipeError) as error:
        from_torchvision(compose, source=tmp_path)
    text = str(error.value)
    assert "transform 0 (RandomResizedCrop): interpolation: expected one of nearest, bilinear, bicubic, random, " \
           "found 'lanczos'" in text
    assert "transform 1 (TrivialAugmentWide): interpolation: expected one of nearest, bilinear, found 'bicubic'" in text
    assert "transform 3 (AutoAugment): policy: expected one of imagenet, found 'cifar10'" in text
    assert "transform 2 (RandomRotation)" in text


def test_a_bicubic_rand_augment_is_refused_as_torchvision_s_saying_bicubic_is_timm_s(tmp_path):
    compose = v2.Compose([v2.RandomResizedCrop(32), v2.RandAugment(interpolation=InterpolationMode.BICUBIC)])
    with pytest.raises(RecipeError, match=r"transform 1 \(RandAugment\): interpolation: expected one of nearest, "
                                          r"bilinear, found 'bicubic' \(torchvision's RandAugment; bicubic and random "
                                          r"are timm's"):
        from_torchvision(compose, source=tmp_path)


@pytest.mark.parametrize("compose, message", [
    (v2.Compose([v2.RandomErasing(), v2.ToDtype(torch.float32, scale=True)]),
     "transform 0 (RandomErasing): the bridge erases the normalised float image"),
    (v2.Compose([v2.CenterCrop(8), v2.ToDtype(torch.float32, scale=True), v2.RandomHorizontalFlip()]),
     "transform 2 (RandomHorizontalFlip): comes after the conversion to float"),
    (v2.Compose([v2.CenterCrop(8), v2.ToDtype(torch.float32)]), "transform 1 (ToDtype): scale=False keeps values"),
    (v2.Compose([v2.CenterCrop(8), v2.Normalize(MEAN, STD)]), "transform 1 (Normalize): Normalize before a "
                                                               "conversion to float"),
    (v2.Compose([v2.CenterCrop(8), v2.ToDtype(torch.float64, scale=True)]), "dtype torch.float64 has no finish"),
])
def test_an_order_or_conversion_the_finish_cannot_take_is_refused(compose, message, tmp_path):
    with pytest.raises(RecipeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        from_torchvision(compose, source=tmp_path)


def test_an_attribute_the_op_would_not_give_back_is_refused_not_dropped(tmp_path):
    flip = v2.RandomHorizontalFlip(0.5)
    flip.only_on_mondays = True  # what a subclass or a later torchvision could add
    with pytest.raises(RecipeError, match=r"transform 1 \(RandomHorizontalFlip\): its only_on_mondays=True has no "
                                          r"parameter in 'horizontal_flip'"):
        from_torchvision(v2.Compose([v2.CenterCrop(8), flip]), source=tmp_path)


# ---- the command line

def test_the_cli_writes_the_pipeline_file_of_a_compose_or_a_function_returning_one(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_transforms.py").write_text(
        "import torch\nfrom torchvision.transforms import v2\n"
        "train = v2.Compose([v2.RandomResizedCrop(64), v2.RandomHorizontalFlip(), v2.ToDtype(torch.float32, "
        "scale=True), v2.Normalize([0.5] * 3, [0.25] * 3)])\n"
        "def make_train():\n    return train\n"
        "def needs(size):\n    return train\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for reference in ("my_transforms:train", "my_transforms:make_train"):
        assert cli.main(["from-torchvision", reference, "--source", "images", "--batch-size", "16"]) == 0
        (tmp_path / "pipeline.yaml").write_text(capsys.readouterr().out)
        spec = load_spec(tmp_path / "pipeline.yaml")
        assert [op.name for op in spec.ops] == ["random_resized_crop", "horizontal_flip", "normalize"]
        assert spec.batch_size == 16 and spec.source.root == str(tmp_path / "images")
    (tmp_path / "pil_transforms.py").write_text(
        "import torchvision.transforms as T\n"
        "train = T.Compose([T.RandomResizedCrop(64), T.ToTensor(), T.Normalize([0.5] * 3, [0.25] * 3)])\n")
    assert cli.main(["from-torchvision", "pil_transforms:train", "--source", "images"]) == 0
    printed = capsys.readouterr()
    assert printed.out.startswith("# dali-bridge from-torchvision pil_transforms:train\nversion: 1\n")
    assert printed.err.startswith("note: the first 1 op(s) run on PIL images in this Compose")
    assert cli.main(["from-torchvision", "my_transforms:needs", "--source", "images"]) == 2
    assert "'needs' takes arguments (size)" in capsys.readouterr().err
    assert cli.main(["from-torchvision", "my_transforms:nothing", "--source", "images"]) == 2
    assert "has no attribute 'nothing' (it has: make_train, needs, torch, train, v2)" in capsys.readouterr().err


def test_a_converted_presets_draws_happen_at_the_users_rates(tmp_path):
    from dali_bridge.pipeline.plan import build_plan
    from dali_bridge.pipeline.sampling import draws, sample_steps

    compose = preset_train(crop_size=32, hflip_prob=0.3, auto_augment_policy="ta_wide", random_erase_prob=0.1)
    plan = build_plan(from_torchvision(compose, source=tmp_path))
    count = 4000
    sample_draws = draws(plan, seed=0, epoch=0, indices=np.arange(count))
    flips = [sample_steps(plan, 40, 52, {pos: row[n] for pos, row in sample_draws.items()})[1][0][0].apply
             for n in range(count)]
    erase_position = next(pos for pos, step in plan.post_finish)
    erases = [plan.ops[erase_position].op.sample(plan.ops[erase_position].params, sample_draws[erase_position][n],
                                                 32, 32)[0].apply for n in range(count)]
    torch.manual_seed(0)
    image = torch.zeros(1, 1, 2, dtype=torch.uint8)
    image[..., 1] = 1
    theirs = np.mean([bool(compose.transforms[2](image)[..., 0].item()) for _ in range(count)])
    for rate, p in ((np.mean(flips), 0.3), (theirs, 0.3), (np.mean(erases), 0.1)):
        assert abs(rate - p) < 3 * math.sqrt(p * (1 - p) / count)


def test_the_from_your_code_examples_run_as_printed(tmp_path, monkeypatch, capsys):
    import re
    import shlex

    from tests.helpers.paths import REPO

    page = (REPO / "docs" / "from-your-code.md").read_text()
    blocks = re.findall(r"^```(\w*)\n(.*?)^```", page, re.S | re.M)
    python = [body for lang, body in blocks if lang == "python" and ("from_torchvision" in body or "from_timm" in body)]
    commands = [line for lang, body in blocks if lang == "bash" for line in body.splitlines()
                if line.startswith(("dali-bridge from-torchvision", "dali-bridge from-timm"))]
    assert len(python) == 2 and len(commands) == 3
    monkeypatch.chdir(tmp_path)
    scopes = []
    for body in python:
        scopes.append({"__name__": "docs"})
        exec(compile(body, "from-your-code.md", "exec"), scopes[-1])
        (tmp_path / "printed.yaml").write_text(capsys.readouterr().out)
        assert load_spec(tmp_path / "printed.yaml").ops == scopes[-1]["spec"].ops
    assert [type(t).__name__ for t in scopes[0]["compose"].transforms] == [
        "RandomResizedCrop", "RandomHorizontalFlip", "TrivialAugmentWide", "ToDtype", "Normalize", "RandomErasing"]
    from dali_bridge.cli.recipes import timm_arguments_apart

    parsed = [cli.build_parser().parse_args(timm_arguments_apart(shlex.split(command.split(" > ")[0])[1:]))
              for command in commands]
    assert parsed[1] == parsed[2]   # timm's arguments after -- or without it
