"""from_torchvision of the self-supervised recipes' transforms: RandomSolarize, RandomApply of one
ColorJitter or GaussianBlur, and a list of transforms (one per view, or named groups of them) as a
pipeline with views — and to_torchvision back to the same transforms."""
from __future__ import annotations

import enum

import numpy as np
import pytest
import torch
from torchvision.transforms import InterpolationMode, v2

from dali_bridge import from_torchvision
from dali_bridge.errors import RecipeError
from dali_bridge.recipes.to_torchvision import to_torchvision
from dali_bridge.spec.pipeline import load_spec

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
FINISH = [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]


def state(transform) -> tuple:
    """A transform as comparable data: its class and public attributes, a RandomApply's transforms inside."""
    def plain(value):
        if isinstance(value, enum.Enum):
            return value.value
        if hasattr(value, "tolist"):
            return value.tolist()
        if isinstance(value, (tuple, list)):
            return [plain(v) for v in value]
        if isinstance(value, torch.nn.Module):
            return state(value)
        return value
    inner = [state(t) for t in transform.transforms] if hasattr(transform, "transforms") else []
    return (type(transform).__name__, inner, {k: plain(v) for k, v in sorted(vars(transform).items())
                                              if not k.startswith("_") and k not in ("training", "transforms")})


def view(size: int, scale: tuple, *, blur: float, solarize: float) -> v2.Compose:
    """One view as DINO's and BYOL's code writes it (torchvision's classes)."""
    blurring = v2.GaussianBlur(23, sigma=(0.1, 2.0))
    return v2.Compose([
        v2.RandomResizedCrop(size, scale=scale, interpolation=InterpolationMode.BICUBIC),
        v2.RandomHorizontalFlip(p=0.5),
        v2.RandomApply([v2.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)], p=0.8),
        v2.RandomGrayscale(p=0.2),
        blurring if blur == 1.0 else v2.RandomApply([blurring], p=blur),
        v2.RandomSolarize(128, p=solarize),
        *FINISH])


DINO = [view(224, (0.4, 1.0), blur=1.0, solarize=0.0), view(224, (0.4, 1.0), blur=0.1, solarize=0.2)] + \
    [view(96, (0.05, 0.4), blur=0.5, solarize=0.0)] * 8


# ---- one Compose: the new transforms

def test_random_solarize_maps_to_solarize_and_comes_back_equal(tmp_path):
    compose = v2.Compose([v2.CenterCrop(32), v2.RandomSolarize(100.5, p=0.3), *FINISH])
    spec = from_torchvision(compose, source=tmp_path)
    assert spec.ops[1].name == "solarize" and spec.ops[1].params == {"threshold": 100.5, "probability": 0.3}
    assert [state(t) for t in to_torchvision(spec).transforms] == [state(t) for t in compose.transforms]


@pytest.mark.parametrize("inner, op, params", [
    (v2.ColorJitter(0.4, 0.4, 0.2, 0.1), "color_jitter", {"brightness": [0.6, 1.4], "hue": [-0.1, 0.1]}),
    (v2.GaussianBlur(23, sigma=(0.1, 2.0)), "gaussian_blur", {"kernel_size": [23, 23], "sigma": [0.1, 2.0]}),
], ids=["color-jitter", "gaussian-blur"])
def test_random_apply_of_one_transform_is_its_op_with_that_probability(inner, op, params, tmp_path):
    compose = v2.Compose([v2.CenterCrop(32), v2.RandomApply([inner], p=0.8), *FINISH])
    spec = from_torchvision(compose, source=tmp_path)
    step = spec.ops[1]
    assert step.name == op and step.params["probability"] == 0.8
    assert {key: step.params[key] for key in params} == params
    assert [state(t) for t in to_torchvision(spec).transforms] == [state(t) for t in compose.transforms]
    always = from_torchvision(v2.Compose([v2.CenterCrop(32), v2.RandomApply([inner], p=1.0), *FINISH]),
                              source=tmp_path)
    assert always.ops[1].params["probability"] == 1.0  # the op with no chance drawn: inner alone comes back
    assert state(to_torchvision(always).transforms[1]) == state(inner)


@pytest.mark.parametrize("transform, message", [
    (v2.RandomApply([v2.ColorJitter(0.4), v2.GaussianBlur(3)], p=0.5), "RandomApply of 2 transforms has no op"),
    (v2.RandomApply([v2.RandomGrayscale(p=0.5)], p=0.5), "RandomApply of RandomGrayscale, which draws its own chance "
                                                         "p=0.5: give RandomGrayscale the chance of both"),
    (v2.RandomApply([v2.RandomRotation(10)], p=0.5), "RandomApply of RandomRotation has no op: RandomApply maps to "
                                                     "the probability of the op of one of ColorJitter, GaussianBlur"),
    (v2.RandomChoice([v2.ColorJitter(0.4), v2.GaussianBlur(3)]), "RandomChoice has no op"),
], ids=["two-transforms", "own-chance", "no-op", "random-choice"])
def test_what_random_apply_cannot_be_is_refused_naming_the_transform(transform, message, tmp_path):
    with pytest.raises(RecipeError) as error:
        from_torchvision(v2.Compose([v2.CenterCrop(32), transform, *FINISH]), source=tmp_path)
    assert any(problem.startswith("transform 1 (") and message in problem for problem in error.value.problems), \
        error.value.problems


def test_random_apply_of_a_class_that_is_not_torchvisions_names_it(tmp_path):
    class Jitter(v2.ColorJitter):
        pass

    with pytest.raises(RecipeError, match=r"transform 1 \(RandomApply\): RandomApply of .*Jitter is a subclass of "
                                          r"torchvision.transforms.v2.ColorJitter"):
        from_torchvision(v2.Compose([v2.CenterCrop(32), v2.RandomApply([Jitter(0.4)], p=0.5), *FINISH]),
                         source=tmp_path)


# ---- views: a list of transforms, one per view

def test_dinos_ten_views_become_a_group_of_two_global_views_and_one_of_eight_local_views(tmp_path):
    spec = from_torchvision(DINO, source=tmp_path)
    assert [(g.name, g.count) for g in spec.views] == [("views_1", 2), ("views_2", 8)]
    first, local = spec.views
    assert [op.name for op in first.ops] == ["random_resized_crop", "horizontal_flip", "color_jitter",
                                             "random_grayscale", "gaussian_blur", "solarize", "normalize"]
    assert first.per_view == ({}, {"gaussian_blur": {"probability": 0.1}, "solarize": {"probability": 0.2}})
    assert local.per_view == () and local.ops[0].params["scale"] == [0.05, 0.4]
    assert list(spec.outputs) == ["views", "label"]
    written = tmp_path / "dino.yaml"
    written.write_text(spec.to_yaml())
    assert load_spec(written).views == spec.views


def test_the_views_come_back_from_to_torchvision_as_the_users_transforms(tmp_path):
    back = to_torchvision(from_torchvision(DINO, source=tmp_path))
    assert isinstance(back, list) and len(back) == 10
    assert [[state(t) for t in compose.transforms] for compose in back] == \
        [[state(t) for t in compose.transforms] for compose in DINO]


def test_simclrs_two_alike_views_are_one_group():
    simclr = view(224, (0.08, 1.0), blur=0.5, solarize=0.0)
    spec = from_torchvision([simclr, simclr], source="data")
    assert [(g.name, g.count, g.per_view) for g in spec.views] == [("views", 2, ())]


def test_named_groups_keep_their_names_and_a_view_unlike_its_group_is_refused_by_name(tmp_path):
    spec = from_torchvision({"global": DINO[:2], "local": DINO[2:]}, source=tmp_path)
    assert [(g.name, g.count) for g in spec.views] == [("global", 2), ("local", 8)]
    with pytest.raises(RecipeError, match=r"views group 'global', view 1: its random_resized_crop size 96 is not the "
                                          r"group's 224"):
        from_torchvision({"global": [DINO[0], DINO[2]]}, source=tmp_path)


def test_every_views_problems_are_reported_at_once_with_the_view(tmp_path):
    views = [DINO[0], v2.Compose([v2.RandomCrop(32), *FINISH]), v2.Compose([v2.RandomResizedCrop(32),
                                                                             v2.RandomApply([v2.RandomRotation(3)]),
                                                                             *FINISH])]
    with pytest.raises(RecipeError) as error:
        from_torchvision(views, source=tmp_path)
    problems = error.value.problems
    assert any(p.startswith("view 1: transform 0 (RandomCrop): RandomCrop has no op") for p in problems), problems
    assert any(p.startswith("view 2: transform 1 (RandomApply): RandomApply of RandomRotation") for p in problems)


def test_views_take_no_soft_targets(tmp_path):
    with pytest.raises(RecipeError, match="a pipeline with views gives labels, not soft targets"):
        from_torchvision(DINO, source=tmp_path, label_smoothing=0.1)


def test_each_converted_view_is_the_users_compose_on_the_torchvision_backend(sample_root):
    """Views whose transforms draw nothing (every chance 0 or 1): each view of a batch is the user's
    Compose applied to the decoded image."""
    from torchvision.io import ImageReadMode, decode_image

    from dali_bridge import build_loader

    views = [v2.Compose([v2.CenterCrop(48), v2.RandomSolarize(128, p=1.0), *FINISH]),
             v2.Compose([v2.CenterCrop(24), v2.RandomGrayscale(p=1.0),
                         v2.RandomApply([v2.GaussianBlur(5, sigma=1.5)], p=1.0), *FINISH])]
    spec = from_torchvision(views, source=sample_root, batch_size=4,
                            overrides={"loader.shuffle": False, "loader.workers": 0})
    with build_loader(spec, "torchvision") as loader:
        (first, second), labels = next(iter(loader))[:2]
    files = sorted(p for p in sample_root.rglob("*.jpg"))[:4]
    for n, path in enumerate(files):
        image = decode_image(str(path), mode=ImageReadMode.RGB)
        for got, compose in ((first, views[0]), (second, views[1])):
            assert torch.allclose(got[n], compose(image), atol=1e-6)
    assert first.shape == (4, 3, 48, 48) and second.shape == (4, 3, 24, 24) and len(labels) == 4
    assert np.isfinite(first.numpy()).all()


def test_the_cli_writes_a_views_pipeline_of_a_list_of_transforms(tmp_path, monkeypatch, capsys):
    from dali_bridge.cli import main as cli

    (tmp_path / "my_views.py").write_text(
        "import torch\nfrom torchvision.transforms import v2\n"
        "def view(size, blur):\n"
        "    return v2.Compose([v2.RandomResizedCrop(size), v2.RandomApply([v2.GaussianBlur(23)], p=blur),\n"
        "                       v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.25] * 3)])\n"
        "views = [view(64, 1.0), view(64, 0.1)] + [view(32, 0.5)] * 3\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["from-torchvision", "my_views:views", "--source", "images"]) == 0
    (tmp_path / "views.yaml").write_text(capsys.readouterr().out)
    spec = load_spec(tmp_path / "views.yaml")
    assert [(g.name, g.count, g.per_view) for g in spec.views] == [
        ("views_1", 2, ({}, {"gaussian_blur": {"probability": 0.1}})), ("views_2", 3, ())]


@pytest.mark.parametrize("recipe", ["simclr_train", "byol_train", "dino_train"])
def test_a_shipped_self_supervised_recipe_goes_to_torchvision_and_back_unchanged(recipe, tmp_path):
    spec = load_spec(recipe)
    composes = iter(to_torchvision(spec))
    named = {group.name: [next(composes) for _ in range(group.count)] for group in spec.views}
    assert from_torchvision(named, source=tmp_path).views == spec.views
