"""from_timm against timm's own code: for real command lines, the pipeline draws what timm's
``create_transform`` (and train.py's ``Mixup``) draws — the same ops in the same order, the same
parameter ranges and probabilities — checked by sampling both; the lines from_timm refuses say why.

timm's side is built as its train.py builds it (``create_transform`` with ``is_training=True`` and no
prefetcher, so normalisation and erasing are in the transform; ``Mixup`` from the mixing arguments),
and each transform is sampled by calling it, its work recorded instead of done where that is where
the draw is made (the crop's ``F.resized_crop``, the policies' operations). The bridge's side is
each step's ``sample`` on the bridge's own uniforms. Distributions are compared by chi-square
(discrete) and Kolmogorov-Smirnov (continuous) tests at p > 0.001, on 4,000 draws each.
"""
from __future__ import annotations

import math
import random
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from tests.helpers.timm_recording import record_augmix_weights

from dali_bridge import from_timm
from dali_bridge.errors import RecipeError
from dali_bridge.ops.timm_rand_augment import TimmOperation, to_picture
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.pipeline.sampling import draws, uniforms
from dali_bridge.recipes.from_timm import parse_timm_args

DRAWS = 4000
HEIGHT, WIDTH = 300, 400  # the decoded image the crop draws its window in (not square: the aspect matters)
P_MIN = 0.001

# Real command lines: timm's defaults, ResNet strikes back's A1/A2/A3 (Wightman et al. 2021, table 1:
# RandAugment m7/m7/m6 with mstd 0.5, mixup 0.2/0.1/0.1, cutmix 1.0, smoothing 0.1/0/0, repeated
# augmentation 3/3/-, 224/224/160 pixels), DeiT's, AugMix, flips and colour jitter.
LINES = {
    "timm's defaults": "",
    "ResNet strikes back A1": "--aa rand-m7-mstd0.5-inc1 --mixup 0.2 --cutmix 1.0 --smoothing 0.1 --aug-repeats 3",
    "ResNet strikes back A2": "--aa rand-m7-mstd0.5-inc1 --mixup 0.1 --cutmix 1.0 --smoothing 0 --aug-repeats 3",
    "ResNet strikes back A3": "--img-size 160 --aa rand-m6-mstd0.5-inc1 --mixup 0.1 --cutmix 1.0 --smoothing 0",
    "RandAugment, bicubic": "--aa rand-m7-mstd0.5-inc1 --train-interpolation bicubic",
    "DeiT": "--aa rand-m9-mstd0.5-inc1 --reprob 0.25 --mixup 0.8 --cutmix 1.0 --smoothing 0.1",
    "AugMix": "--aa augmix-m3-w3 --reprob 0.4 --remode pixel",
    "AutoAugment, nearest": "--aa original-mstd0.5 --train-interpolation nearest --mixup-prob 0.5 --mixup 0.4",
    "DeiT III's 3a keeps colour jitter": "--aa 3a --color-jitter 0.3 --reprob 0.25 --remode const --cutmix 1.0",
    "vertical flips only": "--hflip 0 --vflip 0.5",
    "colour jitter": "--color-jitter 0.4",
    "colour jitter with --aa (timm drops it)": "--color-jitter 0.4 --aa rand-m9-mstd0.5-inc1",
    "grayscale": "--grayscale-prob 0.2 --input-size 3 192 256",
    "SimCLR-style jitter and blur chances": "--color-jitter 0.4 --color-jitter-prob 0.8 --grayscale-prob 0.2 "
                                            "--gaussian-blur-prob 0.5",
}
REFUSED = {
    "AugMix with its JSD loss": ("--aa augmix-m3-w3 --aug-splits 3 --jsd-loss",
                                 "--aug-splits/--jsd-loss/--resplit: augmentation splits"),
    "no augmentation": ("--no-aug", "--no-aug: timm then trains on Resize \\+ CenterCrop"),
    "per-element mixing": ("--mixup 0.8 --mixup-mode elem", "--mixup-mode elem: mixing draws one λ per batch"),
}
OPS_OF_TIMM = {"RandomResizedCropAndInterpolation": "random_resized_crop", "RandomHorizontalFlip": "horizontal_flip",
               "RandomVerticalFlip": "vertical_flip", "RandAugment": "rand_augment", "AutoAugment": "timm_auto_augment",
               "AugMixAugment": "timm_augmix", "ColorJitter": "color_jitter", "RandomGrayscale": "random_grayscale",
               "Normalize": "normalize", "RandomErasing": "random_erasing", "Mixup": "mix",
               "GaussianBlur": "gaussian_blur"}
CONTAINERS = ("MaybeToTensor",)  # PIL to float tensor: the bridge's decode and finish


def timm_data():
    return pytest.importorskip("timm.data", reason="timm is not installed: its own create_transform is the reference")


def timm_side(line: str) -> tuple[list, Any]:
    """What timm's train.py builds for ``line``: the training transform's steps and its Mixup (or None)."""
    data = timm_data()
    ns = parse_timm_args(line)  # train.py's options and defaults (tests/recipes/test_from_timm.py pins them)
    size = tuple(ns.input_size[1:]) if ns.input_size else (ns.img_size or 224, ns.img_size or 224)
    transform = data.create_transform(
        (3, *size), is_training=True, no_aug=ns.no_aug, train_crop_mode=ns.train_crop_mode, scale=ns.scale,
        ratio=ns.ratio, hflip=ns.hflip, vflip=ns.vflip, color_jitter=ns.color_jitter,
        color_jitter_prob=ns.color_jitter_prob, grayscale_prob=ns.grayscale_prob or 0.0,
        gaussian_blur_prob=ns.gaussian_blur_prob or 0.0, auto_augment=ns.aa,
        interpolation=ns.train_interpolation or ns.interpolation, re_prob=ns.reprob, re_mode=ns.remode,
        re_count=ns.recount, use_prefetcher=False)
    mixup = None
    if ns.mixup > 0 or ns.cutmix > 0 or ns.cutmix_minmax is not None:
        mixup = data.Mixup(mixup_alpha=ns.mixup, cutmix_alpha=ns.cutmix, cutmix_minmax=ns.cutmix_minmax,
                           prob=ns.mixup_prob, switch_prob=ns.mixup_switch_prob, mode=ns.mixup_mode,
                           label_smoothing=ns.smoothing, num_classes=1000)
    return [t for t in transform.transforms if type(t).__name__ not in CONTAINERS], mixup


def _p_same(a: list, b: list) -> float:
    from scipy.stats import chi2_contingency

    a, b = Counter(a), Counter(b)
    keys = sorted(set(a) | set(b), key=repr)
    if len(keys) == 1:
        return 1.0
    return chi2_contingency(np.array([[a[k] for k in keys], [b[k] for k in keys]])).pvalue


def _assert_same_discrete(ours: list, theirs: list, what: str) -> None:
    assert _p_same(ours, theirs) > P_MIN, (what, Counter(ours), Counter(theirs))


def _assert_same_continuous(ours: list, theirs: list, what: str) -> None:
    from scipy.stats import ks_2samp

    assert len(ours) > 50 and len(theirs) > 50, what
    assert ks_2samp(ours, theirs).pvalue > P_MIN, what


def _rows(plan, position: int) -> np.ndarray:
    return draws(plan, seed=11, epoch=0, indices=np.arange(DRAWS))[position]


# ---- each kind of step, sampled on both sides: (ours, theirs) lists of comparable records

def _crop(step, rows, transform, monkeypatch) -> None:
    from PIL import Image
    import timm.data.transforms as timm_transforms

    windows: list = []
    monkeypatch.setattr(timm_transforms.F, "resized_crop",
                        lambda img, i, j, h, w, size, interpolation: windows.append((i, j, h, w, size, interpolation)))
    picture = Image.new("RGB", (WIDTH, HEIGHT))
    random.seed(1)
    for _ in range(DRAWS):
        transform(picture)
    ours = [step.op.sample(step.params, row, HEIGHT, WIDTH) for row in rows]
    assert {tuple(w[4]) for w in windows} == {(ours[0][1].height, ours[0][1].width)}  # timm's output size
    _assert_same_discrete([resize.interpolation for _, resize in ours], [w[5].value for w in windows], "filter")
    for name, of_ours, of_theirs in (
            ("area", lambda c: c.height * c.width, lambda w: w[2] * w[3]),
            ("log aspect", lambda c: math.log(c.width / c.height), lambda w: math.log(w[3] / w[2])),
            ("top", lambda c: c.top / max(HEIGHT - c.height, 1), lambda w: w[0] / max(HEIGHT - w[2], 1)),
            ("left", lambda c: c.left / max(WIDTH - c.width, 1), lambda w: w[1] / max(WIDTH - w[3], 1))):
        _assert_same_continuous([of_ours(crop) for crop, _ in ours], [of_theirs(w) for w in windows], name)


def _flip(step, rows, transform, monkeypatch) -> None:
    torch.manual_seed(1)
    image = torch.arange(4).view(1, 2, 2)  # every corner different: either flip moves them
    theirs = [not torch.equal(transform(image), image) for _ in range(DRAWS)]
    ours = [step.op.sample(step.params, row, HEIGHT, WIDTH)[0].apply for row in rows]
    _assert_same_discrete(ours, theirs, "flipped")


def _operations_recorded(augment, transform, monkeypatch) -> tuple[list, set]:
    """Sample timm's policy, its operations recorded instead of applied; (per call operations, fills)."""
    names = {augment.Image.NEAREST: "nearest", augment.Image.BILINEAR: "bilinear", augment.Image.BICUBIC: "bicubic"}
    applied: list = []
    fills: set = set()

    def recorder(name):
        def record(img, *args, **kwargs):
            kwargs = dict(kwargs)
            fills.add(kwargs.get("fillcolor"))
            resample = None
            if name in ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"):
                augment._check_args_tf(kwargs)  # timm's own choice of the filter
                resample = names[kwargs["resample"]]
            argument = args[0] if args else None
            if name == "GaussianBlurRand":
                argument = random.uniform(0.1, 2.0 * argument)  # the radius timm's kernel draws
            applied.append(TimmOperation(name, argument, resample))
            return img
        return record

    ops = transform.ops if hasattr(transform, "ops") else [op for sub in transform.policy for op in sub]
    for op in ops:
        monkeypatch.setattr(op, "aug_fn", recorder(op.name))
    random.seed(2)
    np.random.seed(2)
    picture, found = to_picture(torch.zeros(3, 4, 4, dtype=torch.uint8)), []
    for _ in range(DRAWS):
        applied.clear()
        transform(picture)
        found.append(tuple(applied))
    return found, fills


def _policy(step, rows, transform, monkeypatch) -> None:
    import timm.data.auto_augment as augment

    theirs, fills = _operations_recorded(augment, transform, monkeypatch)
    drawn = [step.op.sample(step.params, row, 224, 224)[0] for row in rows]
    assert fills == {drawn[0].fill}, (fills, drawn[0].fill)  # timm's img_mean
    ours = [tuple(op for chain in d.chains for op in chain) if hasattr(d, "chains") else d.operations for d in drawn]
    _assert_same_discrete([len(ops) for ops in ours], [len(ops) for ops in theirs], "operations applied")
    flat_ours, flat_theirs = [op for ops in ours for op in ops], [op for ops in theirs for op in ops]
    _assert_same_discrete([op.name for op in flat_ours], [op.name for op in flat_theirs], "operation")
    _assert_same_discrete([op.resample for op in flat_ours], [op.resample for op in flat_theirs], "filter")
    for name in sorted({op.name for op in flat_theirs}):
        a = [op.argument for op in flat_ours if op.name == name]
        b = [op.argument for op in flat_theirs if op.name == name]
        if len(b) < 100 or a[0] is None:
            continue
        if isinstance(b[0], int):
            _assert_same_discrete(a, b, name)
        else:
            _assert_same_continuous(a, b, name)
    if hasattr(drawn[0], "chains"):  # AugMix: the first chain's weight and the blend, as timm's Dirichlet and Beta
        _augmix_weights(drawn, transform, monkeypatch)


def _augmix_weights(drawn, transform, monkeypatch) -> None:
    weights = record_augmix_weights(transform, monkeypatch)
    np.random.seed(3)
    picture = to_picture(torch.zeros(3, 4, 4, dtype=torch.uint8))
    for _ in range(DRAWS // 4):
        transform(picture)
    for n, name in enumerate(("first chain's weight", "blend")):
        _assert_same_continuous([(d.chain_weights[0], d.blend)[n] for d in drawn], [w[n] for w in weights], name)


def _jitter(step, rows, transform, monkeypatch) -> None:
    torch.manual_seed(4)
    theirs = [transform.get_params(transform.brightness, transform.contrast, transform.saturation, transform.hue)
              for _ in range(DRAWS)]
    ours = [step.op.sample(step.params, row, 224, 224)[0] for row in rows]
    _assert_same_discrete([j.order for j in ours], [tuple(int(i) for i in t[0]) for t in theirs], "order")
    for n, name in enumerate(("brightness", "contrast", "saturation", "hue"), start=1):
        a, b = [getattr(j, name) for j in ours], [t[n] for t in theirs]
        if b[0] is None:
            assert set(a) == {None}, name
        else:
            _assert_same_continuous(a, b, name)


def _op_of(transform) -> str:
    """The op a step of timm's transform maps to (a RandomApply: its one transform's)."""
    inner = transform.transforms[0] if type(transform).__name__ == "RandomApply" else transform
    return OPS_OF_TIMM[type(inner).__name__]


def _random_apply(sampler):
    """``sampler`` of a step timm may wrap in a RandomApply: the rate it applies at against the op's
    ``applied``, then the sampler on the transform inside."""
    def sample(step, rows, transform, monkeypatch) -> None:
        if type(transform).__name__ != "RandomApply":
            return sampler(step, rows, transform, monkeypatch)
        (inner,) = transform.transforms
        applied: list = []
        monkeypatch.setattr(inner, "forward", lambda img: applied.append(True) or img)
        torch.manual_seed(8)
        image = torch.zeros(3, 4, 4, dtype=torch.uint8)
        for _ in range(DRAWS):
            transform(image)
        ours = [step.op.sample(step.params, row, 224, 224)[0].applied for row in rows]
        _assert_same_discrete(ours, [True] * len(applied) + [False] * (DRAWS - len(applied)), "applied")
        monkeypatch.undo()
        sampler(step, rows, inner, monkeypatch)
    return sample


def _blur(step, rows, transform, monkeypatch) -> None:
    assert step.params["kernel_size"] == list(transform.kernel_size)
    torch.manual_seed(9)
    theirs = [transform.get_params(*transform.sigma) for _ in range(DRAWS)]
    ours = [step.op.sample(step.params, row, 224, 224)[0].sigma for row in rows]
    _assert_same_continuous(ours, theirs, "sigma")


def _grayscale(step, rows, transform, monkeypatch) -> None:
    torch.manual_seed(5)
    image = torch.tensor([[[255]], [[0]], [[0]]], dtype=torch.uint8)
    theirs = [bool(transform(image)[1, 0, 0] != 0) for _ in range(DRAWS)]
    ours = [step.op.sample(step.params, row, 224, 224)[0].apply for row in rows]
    _assert_same_discrete(ours, theirs, "grey")


def _normalize(step, rows, transform, monkeypatch) -> None:
    assert step.params["mean"] == pytest.approx(transform.mean.tolist())
    assert step.params["std"] == pytest.approx(transform.std.tolist())
    assert step.params["dtype"] == "float32"


def _erasing(step, rows, transform, monkeypatch) -> None:
    size = 64
    random.seed(6)
    torch.manual_seed(6)
    theirs, their_fill = [], []
    for _ in range(DRAWS):
        image = torch.full((3, size, size), 7.0)
        transform(image)
        changed = (image != 7.0).any(0).nonzero()
        if len(changed) == 0:
            theirs.append(None)
            continue
        (top, left), (bottom, right) = changed.min(0).values.tolist(), changed.max(0).values.tolist()
        theirs.append((top, left, bottom - top + 1, right - left + 1))
        their_fill += image[:, top, left].tolist()
    erases = [step.op.sample(step.params, row, size, size)[0] for row in rows]
    ours = [(e.top, e.left, e.height, e.width) if e.apply else None for e in erases]
    if transform.mode == "const":  # timm erases with zeros: the box is where the image changed
        assert step.params["value"] == 0.0
    else:
        our_fill = [v for e in erases[:DRAWS // 4] if e.apply
                    for v in step.op.value(step.params, e, 3)[:, 0, 0].tolist()]
        _assert_same_continuous(our_fill, their_fill, "noise")
    _assert_same_discrete([o is not None for o in ours], [t is not None for t in theirs], "erased")
    boxes_ours, boxes_theirs = [o for o in ours if o], [t for t in theirs if t]
    _assert_same_continuous([h * w for _, _, h, w in boxes_ours], [h * w for _, _, h, w in boxes_theirs], "area")
    _assert_same_continuous([math.log(h / w) for _, _, h, w in boxes_ours],
                            [math.log(h / w) for _, _, h, w in boxes_theirs], "log aspect")


SAMPLERS = {"random_resized_crop": _crop, "horizontal_flip": _flip, "vertical_flip": _flip,
            "rand_augment": _policy, "timm_auto_augment": _policy, "timm_augmix": _policy,
            "color_jitter": _random_apply(_jitter), "random_grayscale": _grayscale, "normalize": _normalize,
            "random_erasing": _erasing, "gaussian_blur": _random_apply(_blur)}


def _mixing(spec, plan, mixup, monkeypatch) -> None:
    """timm's Mixup (batch mode) against the bridge's mixing op: whether a batch mixes, which of the two,
    and λ as each applies it (CutMix's corrected to the box, timm's own cutmix_bbox_and_lam)."""
    from timm.data.mixup import cutmix_bbox_and_lam

    (position, step), = [(n, s) for n, s in plan.post_finish if s.op.category == "batch"]
    assert spec.label_smoothing == mixup.label_smoothing
    beta, betas = np.random.beta, []
    monkeypatch.setattr(np.random, "beta", lambda a, b: betas.append(a) or beta(a, b))  # a batch is mixed
    np.random.seed(7)
    theirs = []
    for _ in range(DRAWS):
        betas.clear()
        lam, use_cutmix = mixup._params_per_batch()
        if not betas:
            theirs.append(("none", 1.0))
        elif use_cutmix:
            theirs.append(("cutmix", cutmix_bbox_and_lam((8, 3, 224, 224), lam, correct_lam=True)[1]))
        else:
            theirs.append(("mixup", lam))
    rows = uniforms(11, 0, np.arange(DRAWS), position + 1, step.op.batch_draws)
    ours = [(m.mode, m.lam) for m in (step.op.sample_batch(step.params, row, 224, 224) for row in rows)]
    _assert_same_discrete([mode for mode, _ in ours], [mode for mode, _ in theirs], "mixing")
    for mode in ("mixup", "cutmix"):
        a, b = [lam for m, lam in ours if m == mode], [lam for m, lam in theirs if m == mode]
        if b:
            _assert_same_continuous(a, b, f"{mode} λ")


@pytest.mark.slow  # 4,000 draws of every step of every line, on both sides
@pytest.mark.parametrize("line", list(LINES.values()), ids=list(LINES))
def test_from_timm_draws_what_timms_create_transform_and_mixup_draw(monkeypatch, line):
    transforms, mixup = timm_side(line)
    spec = from_timm(line, source="data")
    plan = build_plan(spec)
    per_sample = [(n, step) for n, step in enumerate(plan.all_steps) if step.op.category != "batch"]
    assert [_op_of(t) for t in transforms] == [step.name for _, step in per_sample]
    for (position, step), transform in zip(per_sample, transforms):
        rows = _rows(plan, position) if step.random else None
        with monkeypatch.context() as patched:
            SAMPLERS[step.name](step, rows, transform, patched)
    batch_ops = [step for _, step in plan.post_finish if step.op.category == "batch"]
    assert len(batch_ops) == (mixup is not None)
    if mixup is not None:
        _mixing(spec, plan, mixup, monkeypatch)
    else:
        assert spec.label_smoothing == parse_timm_args(line).smoothing  # train.py's LabelSmoothingCrossEntropy
    repeats = parse_timm_args(line).aug_repeats
    assert (spec.loader.repeated_augmentations if repeats else 0) == repeats


@pytest.mark.parametrize("line, reason", list(REFUSED.values()), ids=list(REFUSED))
def test_lines_from_timm_refuses_name_the_argument_and_why(line, reason):
    timm_side(line)  # timm itself builds them (its train.py runs the lines)
    with pytest.raises(RecipeError, match=reason):
        from_timm(line, source="data")


def test_the_sampling_comparison_sees_a_wrong_probability():
    """The comparisons can fail: a flip chance of 0.45 against timm's 0.5 is told apart."""
    transforms, _ = timm_side("--hflip 0.5")
    plan = build_plan(from_timm("--hflip 0.45", source="data"))
    step = plan.all_steps[1]
    with pytest.raises(AssertionError, match="flipped"):
        _flip(step, _rows(plan, 1), transforms[1], None)


def test_the_sampling_comparison_sees_a_wrong_jitter_chance(monkeypatch):
    """A jitter chance of 0.7 against timm's RandomApply of 0.8 is told apart."""
    transforms, _ = timm_side("--color-jitter 0.4 --color-jitter-prob 0.8")
    plan = build_plan(from_timm("--color-jitter 0.4 --color-jitter-prob 0.7", source="data"))
    position, step = next((n, s) for n, s in enumerate(plan.all_steps) if s.name == "color_jitter")
    with pytest.raises(AssertionError, match="applied"):
        SAMPLERS["color_jitter"](step, _rows(plan, position), transforms[position], monkeypatch)


def test_the_sampling_comparison_sees_a_fixed_crop_filter_where_timm_draws_one(monkeypatch):
    """A crop fixed to bilinear (``crop_interpolation``) is told apart from timm's default random filter."""
    transforms, _ = timm_side("")
    plan = build_plan(from_timm("", source="data", crop_interpolation="bilinear"))
    with pytest.raises(AssertionError, match="filter"):
        _crop(plan.all_steps[0], _rows(plan, 0), transforms[0], monkeypatch)
