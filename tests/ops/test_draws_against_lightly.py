"""The bridge's draws against lightly's own SimCLRTransform, BYOLTransform and DINOTransform, view by
view: each transform is sampled with its random calls recorded (tests/helpers/lightly_recording.py),
beside a views pipeline configured alike, and the distributions must agree — the crop's scale and
aspect ratio, the blur's sigma and the jitter's factors by Kolmogorov-Smirnov, the rate of every flip, jitter, grey,
blur and solarisation by a two-proportion bound. A pipeline with one setting wrong fails.

lightly blurs with PIL's filter (no kernel size) where the bridge blurs with torchvision's kernel
(SimCLR's 23 pixels, a tenth of 224); only the draws are compared here, not pixels.
"""
from __future__ import annotations

import copy
import math

import numpy as np
import pytest

from tests.helpers.lightly_recording import ViewDraws, sample_lightly

pytest.importorskip("lightly", reason="the draw tests against lightly need lightly (the test extra)")

SIZE = (120, 160)         # (height, width) of the image both sides crop from
LIGHTLY_IMAGES = 400      # lightly's transforms do their draws in Python per view: a few ms each
BRIDGE_IMAGES = 2000      # the bridge's draws are vectorised: more of them narrow the bounds
RATES = ("horizontal_flip", "vertical_flip", "color_jitter", "random_grayscale", "solarize")
SIGMAS = 4.0              # a rate's bound, in standard deviations of the difference of two estimates
KS_PVALUE = 1e-3
MEAN_STD = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


def _view_ops(*, size: int, scale: list[float], jitter: list[float], blur: float, solarize: float = 0.0,
              interpolation: str = "bilinear") -> list:
    """One view's chain as lightly's view transforms build it (crop, flip, jitter, grey, blur, solarise)."""
    brightness, contrast, saturation, hue = jitter
    return [{"random_resized_crop": {"size": size, "scale": scale, "interpolation": interpolation}},
            {"horizontal_flip": {"probability": 0.5}},
            {"color_jitter": {"brightness": brightness, "contrast": contrast, "saturation": saturation, "hue": hue,
                              "probability": 0.8}},
            {"random_grayscale": {"probability": 0.2}},
            {"gaussian_blur": {"kernel_size": 23, "sigma": [0.1, 2.0], "probability": blur}},
            {"solarize": {"threshold": 128, "probability": solarize}},
            {"normalize": MEAN_STD}]


# lightly 1.6's defaults, as its transforms' signatures give them.
SIMCLR = {"simclr": {"count": 2, "ops": _view_ops(size=224, scale=[0.08, 1.0], jitter=[0.8, 0.8, 0.8, 0.2],
                                                  blur=0.5)}}
BYOL = {"byol": {"count": 2, "ops": _view_ops(size=224, scale=[0.08, 1.0], jitter=[0.4, 0.4, 0.2, 0.1], blur=1.0),
                 "per_view": [{}, {"gaussian_blur": {"probability": 0.1}, "solarize": {"probability": 0.2}}]}}
DINO = {"global": {"count": 2, "ops": _view_ops(size=224, scale=[0.4, 1.0], jitter=[0.4, 0.4, 0.2, 0.1], blur=1.0,
                                                interpolation="bicubic"),
                   "per_view": [{}, {"gaussian_blur": {"probability": 0.1}, "solarize": {"probability": 0.2}}]},
        "local": {"count": 8, "ops": _view_ops(size=96, scale=[0.05, 0.4], jitter=[0.4, 0.4, 0.2, 0.1], blur=0.5,
                                               interpolation="bicubic")}}


def _lightly(name: str):
    from lightly.transforms import BYOLTransform, DINOTransform, SimCLRTransform

    return {"simclr": SimCLRTransform, "byol": BYOLTransform,
            "dino": lambda: DINOTransform(n_local_views=8)}[name]()


def bridge_draws(views: dict, *, images: int = BRIDGE_IMAGES, seed: int = 0,
                 shared: list | None = None) -> list[list[ViewDraws]]:
    """``[view][image]``: what each view of a pipeline with ``views`` (after the ``shared`` ops) draws for
    images of ``SIZE``."""
    from dali_bridge.pipeline.plan import build_plan
    from dali_bridge.pipeline.sampling import draws, sample_steps
    from dali_bridge.spec.pipeline import spec_from_dict

    plan = build_plan(spec_from_dict({"version": 1, "source": {"type": "folder", "root": "/nonexistent"},
                                      "batch_size": 2, "seed": seed, "views": views, "ops": shared or [],
                                      "outputs": ["views", "label"]}))
    found = []
    for view in plan.view_plans:
        drawn = draws(view, seed, 0, np.arange(images))
        found.append([_view_draws(view, sample_steps(view, *SIZE, {pos: u[n] for pos, u in drawn.items()}))
                      for n in range(images)])
    return found


def _view_draws(view, steps: list) -> ViewDraws:
    found = ViewDraws()
    for step, (concrete, size) in zip(view.steps, steps):
        item = concrete[0] if concrete else None
        if step.name == "random_resized_crop":
            found.crop, found.image = (item.height, item.width), size
        elif step.name in ("horizontal_flip", "vertical_flip", "random_grayscale", "solarize"):
            setattr(found, step.name, item.apply)
        elif step.name == "color_jitter":
            found.color_jitter = item.applied
            found.jitter_factors = (item.brightness, item.contrast, item.saturation, item.hue) if item.applied else ()
        elif step.name == "gaussian_blur":
            found.gaussian_blur = item.sigma if item.applied else None
    return found


def _rate_problem(name: str, ours: list[bool], theirs: list[bool]) -> str | None:
    """Two rates out of ``len(ours)`` and ``len(theirs)`` trials: equal within ``SIGMAS`` standard
    deviations of their difference (exactly, where one of them never or always happens)."""
    p, q = float(np.mean(ours)), float(np.mean(theirs))
    pooled = (sum(ours) + sum(theirs)) / (len(ours) + len(theirs))
    bound = SIGMAS * math.sqrt(pooled * (1 - pooled) * (1 / len(ours) + 1 / len(theirs)))
    return None if abs(p - q) <= bound else f"{name} rate {p:.3f}, lightly's {q:.3f} (bound ±{bound:.3f})"


def _ks_problem(name: str, ours: list[float], theirs: list[float]) -> str | None:
    from scipy.stats import ks_2samp

    ours, theirs = [v for v in ours if v is not None], [v for v in theirs if v is not None]  # an unset factor
    if not ours or not theirs:
        return None if not ours and not theirs else f"{name}: drawn {len(ours)} times, lightly's {len(theirs)}"
    pvalue = ks_2samp(ours, theirs).pvalue
    return None if pvalue > KS_PVALUE else (f"{name}: Kolmogorov-Smirnov p = {pvalue:.2g} (medians "
                                            f"{np.median(ours):.3f}, lightly's {np.median(theirs):.3f})")


def distribution_problems(ours: list[list[ViewDraws]], theirs: list[list[ViewDraws]]) -> list[str]:
    """Where the bridge's views draw otherwise than lightly's, view by view (empty when they agree)."""
    if len(ours) != len(theirs):
        return [f"{len(ours)} views, lightly's transform makes {len(theirs)}"]
    problems = []
    for number, (mine, their) in enumerate(zip(ours, theirs)):
        found = [_rate_problem(name, [getattr(d, name) for d in mine], [getattr(d, name) for d in their])
                 for name in RATES]
        found.append(_rate_problem("gaussian_blur", [d.gaussian_blur is not None for d in mine],
                                   [d.gaussian_blur is not None for d in their]))
        found += [_ks_problem(what, [getattr(d, what) for d in mine], [getattr(d, what) for d in their])
                  for what in ("scale", "ratio")]
        found.append(_ks_problem("blur sigma", [d.gaussian_blur for d in mine if d.gaussian_blur is not None],
                                 [d.gaussian_blur for d in their if d.gaussian_blur is not None]))
        for n, factor in enumerate(("brightness", "contrast", "saturation", "hue")):
            found.append(_ks_problem(f"jitter {factor}", [d.jitter_factors[n] for d in mine if d.jitter_factors],
                                     [d.jitter_factors[n] for d in their if d.jitter_factors]))
        problems += [f"view {number}: {problem}" for problem in found if problem]
    return problems


@pytest.fixture(scope="module")
def lightly_draws():
    """Each transform's recorded draws, sampled once for the module."""
    cache: dict[str, list[list[ViewDraws]]] = {}

    def sampled(name: str) -> list[list[ViewDraws]]:
        if name not in cache:
            with pytest.MonkeyPatch.context() as patch:
                cache[name] = sample_lightly(_lightly(name), patch, images=LIGHTLY_IMAGES, size=SIZE)
        return cache[name]
    return sampled


@pytest.mark.slow
@pytest.mark.parametrize("name, views", [("simclr", SIMCLR), ("byol", BYOL), ("dino", DINO)],
                         ids=["simclr", "byol", "dino"])
def test_every_views_draws_are_distributed_as_lightlys_transform_configured_alike(lightly_draws, name, views):
    ours, theirs = bridge_draws(views), lightly_draws(name)
    assert distribution_problems(ours, theirs) == []
    # what the two sides recorded is what the settings say (the recorder saw every draw it compares)
    assert {d.image for view in theirs for d in view} == {SIZE}
    assert all(len(view) == LIGHTLY_IMAGES for view in theirs)


@pytest.mark.slow
def test_dinos_views_differ_where_lightlys_do_blur_always_then_rarely_and_solarise_the_second():
    ours = bridge_draws(DINO)
    rate = {name: [float(np.mean([getattr(d, name) for d in view])) for view in ours] for name in ("solarize",)}
    blur = [float(np.mean([d.gaussian_blur is not None for d in view])) for view in ours]
    assert blur[0] == 1.0 and abs(blur[1] - 0.1) < 0.03 and all(abs(b - 0.5) < 0.05 for b in blur[2:])
    assert rate["solarize"][0] == 0.0 and abs(rate["solarize"][1] - 0.2) < 0.03 and not any(rate["solarize"][2:])
    scales = [float(np.median([d.scale for d in view])) for view in ours]
    assert all(s > 0.5 for s in scales[:2]) and all(s < 0.4 for s in scales[2:])


def _broken(views: dict, group: str, op: str, params: dict, view: int | None = None) -> dict:
    """``views`` with one op's parameters changed: in the group's chain, or in one view's changes."""
    changed = copy.deepcopy(views)
    if view is None:
        entry = next(entry for entry in changed[group]["ops"] if op in entry)
        entry[op].update(params)
    else:
        changed[group]["per_view"][view].setdefault(op, {}).update(params)
    return changed


@pytest.mark.slow
@pytest.mark.parametrize("group, op, params, view, expected", [
    ("global", "solarize", {"probability": 0.1}, 1, "view 1: solarize rate"),
    ("global", "gaussian_blur", {"probability": 0.2}, 1, "view 1: gaussian_blur rate"),
    ("global", "color_jitter", {"probability": 0.7}, None, "view 0: color_jitter rate"),
    ("local", "random_grayscale", {"probability": 0.1}, None, "view 2: random_grayscale rate"),
    ("local", "horizontal_flip", {"probability": 0.4}, None, "view 2: horizontal_flip rate"),
    ("local", "random_resized_crop", {"scale": [0.05, 0.5]}, None, "view 2: scale"),
    ("local", "random_resized_crop", {"ratio": [0.5, 2.0]}, None, "view 2: ratio"),
    ("global", "gaussian_blur", {"sigma": [0.1, 3.0]}, None, "view 0: blur sigma"),
    ("local", "color_jitter", {"saturation": 0.4}, None, "view 2: jitter saturation"),
], ids=["solarize", "blur", "jitter", "grey", "flip", "crop-scale", "crop-ratio", "blur-sigma", "jitter-saturation"])
def test_one_setting_unlike_lightlys_is_reported_by_the_view_and_draw_it_moves(lightly_draws, group, op, params,
                                                                               view, expected):
    problems = distribution_problems(bridge_draws(_broken(DINO, group, op, params, view)), lightly_draws("dino"))
    assert any(problem.startswith(expected) for problem in problems), problems


def test_the_bridges_draws_of_one_chain_follow_its_settings():
    """The op-level check the per-view tests rest on, without lightly: the rates of one view are its
    settings', within four standard deviations."""
    (view,) = bridge_draws({"one": {"count": 1, "ops": _view_ops(size=64, scale=[0.2, 1.0],
                                                                  jitter=[0.4, 0.4, 0.2, 0.1], blur=0.5,
                                                                  solarize=0.2)}}, images=4000)
    for name, probability in (("horizontal_flip", 0.5), ("color_jitter", 0.8), ("random_grayscale", 0.2),
                              ("solarize", 0.2)):
        rate = float(np.mean([getattr(d, name) for d in view]))
        assert abs(rate - probability) <= 4 * math.sqrt(probability * (1 - probability) / 4000), name
    blurred = [d.gaussian_blur for d in view if d.gaussian_blur is not None]
    assert abs(len(blurred) / 4000 - 0.5) <= 4 * math.sqrt(0.25 / 4000) and 0.1 <= min(blurred) < max(blurred) <= 2.0
    assert all(0.2 * 0.9 <= d.scale <= 1.0 for d in view)  # the box rounds to whole pixels


# ---- the shipped recipes, against lightly's transform given the recipe's settings

def _settings(view) -> dict:
    """One view plan's settings as lightly's view transforms take them."""
    params = {step.name: step.params for step in view.steps}
    crop, jitter = params["random_resized_crop"], params.get("color_jitter")
    blur, half = params.get("gaussian_blur"), (lambda r: 0.0 if r is None else (r[1] - r[0]) / 2)
    return {"size": crop["size"][0], "scale": tuple(crop["scale"]),
            "hf_prob": params.get("horizontal_flip", {}).get("probability", 0.0),
            "cj_prob": jitter["probability"] if jitter else 0.0,
            "cj": [half(jitter[name]) if jitter else 0.0 for name in ("brightness", "contrast", "saturation", "hue")],
            "random_gray_scale": params.get("random_grayscale", {}).get("probability", 0.0),
            "gaussian_blur": blur["probability"] if blur else 0.0,
            "sigmas": tuple(blur["sigma"]) if blur else (0.1, 2.0),
            "solarization_prob": params.get("solarize", {}).get("probability", 0.0)}


def _view_arguments(s: dict) -> dict:
    bright, contrast, sat, hue = s["cj"]
    return {"input_size": s["size"], "cj_prob": s["cj_prob"], "cj_strength": 1.0, "cj_bright": bright,
            "cj_contrast": contrast, "cj_sat": sat, "cj_hue": hue, "min_scale": s["scale"][0],
            "random_gray_scale": s["random_gray_scale"], "gaussian_blur": s["gaussian_blur"], "sigmas": s["sigmas"],
            "hf_prob": s["hf_prob"]}


def lightly_alike(name: str, views: list) -> object:
    """lightly's SimCLRTransform, BYOLTransform or DINOTransform with a recipe's settings (its views' plans)."""
    from lightly.transforms import (BYOLTransform, BYOLView1Transform, BYOLView2Transform, DINOTransform,
                                    SimCLRTransform)

    settings = [_settings(view) for view in views]
    if name == "simclr":
        return SimCLRTransform(**_view_arguments(settings[0]))
    if name == "byol":
        return BYOLTransform(*(cls(**_view_arguments(s), solarization_prob=s["solarization_prob"])
                               for cls, s in zip((BYOLView1Transform, BYOLView2Transform), settings)))
    first, second, local = settings[0], settings[1], settings[2]
    bright, contrast, sat, hue = (2 * v for v in first["cj"])  # DINO's views scale the jitter by cj_strength 0.5
    return DINOTransform(global_crop_size=first["size"], global_crop_scale=first["scale"],
                         local_crop_size=local["size"], local_crop_scale=local["scale"],
                         n_local_views=len(settings) - 2, hf_prob=first["hf_prob"],
                         cj_prob=first["cj_prob"], cj_strength=0.5, cj_bright=bright, cj_contrast=contrast,
                         cj_sat=sat, cj_hue=hue, random_gray_scale=first["random_gray_scale"],
                         gaussian_blur=(first["gaussian_blur"], second["gaussian_blur"], local["gaussian_blur"]),
                         sigmas=first["sigmas"], solarization_prob=second["solarization_prob"])


def _recipe(recipe: str | dict) -> dict:
    """A shipped recipe's pipeline data (skipped where it is not shipped), or the views given."""
    import yaml

    from tests.helpers.paths import PIPELINES

    if isinstance(recipe, dict):
        return {"version": 1, "batch_size": 2, "views": recipe, "outputs": ["views", "label"]}
    path = PIPELINES / f"{recipe}.yaml"
    if not path.exists():
        pytest.skip(f"pipelines/{recipe}.yaml is not shipped")
    return yaml.safe_load(path.read_text())


RECIPES = [("simclr_train", "simclr"), ("byol_train", "byol"), ("dino_train", "dino"),
           (SIMCLR, "simclr"), (BYOL, "byol"), (DINO, "dino")]


@pytest.mark.slow
@pytest.mark.parametrize("recipe, name", RECIPES, ids=[r if isinstance(r, str) else f"{n}-as-configured-here"
                                                      for r, n in RECIPES])
def test_every_view_of_a_recipe_draws_as_lightlys_transform_given_its_settings(recipe, name, monkeypatch):
    from dali_bridge.pipeline.plan import build_plan
    from dali_bridge.spec.pipeline import spec_from_dict

    data = _recipe(recipe)
    views = build_plan(spec_from_dict({**data, "source": {"type": "folder", "root": "/nonexistent"}})).view_plans
    ours = bridge_draws(data["views"], shared=data.get("ops"))
    theirs = sample_lightly(lightly_alike(name, list(views)), monkeypatch, images=LIGHTLY_IMAGES, size=SIZE)
    assert distribution_problems(ours, theirs) == []
