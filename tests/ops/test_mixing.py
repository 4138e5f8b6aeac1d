"""Batch mixing (mixup, cutmix, batch_mix) and the target output: torchvision's MixUp/CutMix given
the same λ and box, λ ~ Beta(α, α), CutMix's corrected λ as torchvision's, label smoothing as
CrossEntropyLoss's, the same mixed batches on every backend and after a resume."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tests.helpers.backends import CPU_BACKENDS, needs_cpu_backends

from dali_bridge.ops.registry import OPS
from dali_bridge.ops.mixing import Mix, mixup_in_place, mix_batch
from dali_bridge.loader.placement import placement
from dali_bridge.pipeline.plan import build_plan
from dali_bridge.loader.post_finish import PostFinish, batch_uniforms
from dali_bridge.spec.pipeline import spec_from_dict
from dali_bridge.spec.problems import SpecError

BATCHES = 10_000


def spec_of(ops: list, outputs=("image", "target"), **keys):
    return spec_from_dict({"version": 1, "source": {"type": "folder", "root": "/nonexistent"}, "batch_size": 4,
                           "ops": ops, "outputs": list(outputs), **keys})


def mixed_plan(op) -> tuple:
    plan = build_plan(spec_of([{"center_crop": 8}, "normalize", op]))
    return plan, plan.post_finish[-1]


def draws_of(op_name: str, params: dict, height: int, width: int, batches: int = BATCHES) -> list[Mix]:
    op = OPS[op_name]
    return [op.sample_batch(params, batch_uniforms(7, 0, number, 0, 3, op.batch_draws), height, width)
            for number in range(batches)]


def one_hot(labels: torch.Tensor, classes: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(labels, classes).float()


# ---- the spec

def test_batch_mixing_without_the_target_output_is_refused_pointing_to_target():
    with pytest.raises(SpecError) as caught:
        spec_of([{"center_crop": 8}, "normalize", {"mixup": 0.2}], outputs=["image", "label"])
    (problem,) = caught.value.problems
    assert problem.path == "outputs"
    assert "ops[2] 'mixup' blends images and their labels" in problem.message
    assert "add 'target' to outputs" in problem.message


def test_two_batch_ops_are_refused_pointing_to_batch_mix():
    with pytest.raises(SpecError) as caught:
        spec_of([{"center_crop": 8}, "normalize", "mixup", "cutmix"])
    assert any(p.path == "ops[3]" and "use one batch_mix op" in p.message for p in caught.value.problems)


@pytest.mark.parametrize("keys, path, snippet", [
    ({"target": {"label_smoothing": 1.0}}, "target.label_smoothing", "in [0, 1)"),
    ({"target": {"smoothing": 0.1}}, "target.smoothing", "unknown key"),
    ({"outputs": ["image", "label"], "target": {"label_smoothing": 0.1}}, "target.label_smoothing",
     "add 'target' to outputs"),
])
def test_target_section_is_validated(keys, path, snippet):
    with pytest.raises(SpecError) as caught:
        spec_from_dict({"version": 1, "source": {"type": "folder", "root": "/x"}, "batch_size": 4,
                        "ops": [{"center_crop": 8}], "outputs": ["image", "target"], **keys})
    assert any(p.path == path and snippet in p.message for p in caught.value.problems), caught.value.problems


def test_target_output_and_label_smoothing_round_trip_through_yaml():
    spec = spec_of([{"center_crop": 8}, "normalize", "batch_mix"], outputs=["image", "target", "label"],
                   target={"label_smoothing": 0.1})
    assert spec.label_smoothing == 0.1 and spec.replace() == spec
    assert spec.to_dict()["target"] == {"label_smoothing": 0.1}
    assert "target" not in spec_of([{"center_crop": 8}], outputs=["image", "label"]).to_dict()


def test_batch_mix_defaults_are_torchvisions_recipe_and_show_lists_it_on_the_loaders_device():
    plan, (position, step) = mixed_plan("batch_mix")
    assert step.params == {"mixup_alpha": 0.2, "cutmix_alpha": 1.0, "cutmix_probability": 0.5, "probability": 1.0}
    assert position == 2 and step.random and plan.steps == plan.ops[:1]
    for backend, device in (("dali", "cuda"), ("dali-cpu", "cpu"), ("torchvision", "cpu")):
        last = placement(plan, backend)[-1]
        assert (last.stage, last.device) == ("batch_mix", device) and "CutMix (alpha 1)" in last.implementation


# ---- the kernels against torchvision

def test_mixup_equals_torchvision_mixup_given_the_same_lambda(monkeypatch):
    from torchvision.transforms import v2

    images, labels = torch.randn(5, 3, 6, 7), torch.tensor([0, 2, 1, 2, 3])
    lam = 0.3712
    transform = v2.MixUp(alpha=0.2, num_classes=4)
    monkeypatch.setattr(transform, "make_params", lambda flat: {"lam": lam})
    expected_images, expected_targets = transform(images.clone(), labels)
    ours_images, ours_targets = mix_batch(images.clone(), one_hot(labels, 4), Mix("mixup", lam))
    assert torch.equal(ours_images, expected_images) and torch.equal(ours_targets, expected_targets)
    assert torch.allclose(ours_targets.sum(1), torch.ones(5))


@pytest.mark.parametrize("per_sample", [True, False])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC view"])
def test_mixup_in_place_both_forms_equal_torchvision_mixup(per_sample, layout):
    """The host's sample-by-sample form and the GPU's batch-wide one, on a contiguous batch and on
    the NCHW view of an NHWC one (the loader's HWC finish): torchvision's pixels, in the batch itself."""
    from torchvision.transforms import v2

    images = torch.randn(9, 3, 5, 6, generator=torch.Generator().manual_seed(2))
    lam = 0.6183
    transform = v2.MixUp(alpha=0.2, num_classes=2)
    transform.make_params = lambda flat: {"lam": lam}
    expected, _ = transform(images.clone(), torch.zeros(9, dtype=torch.int64))
    batch = images.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2) if layout == "NHWC view" else images.clone()
    ours = mixup_in_place(batch, lam, per_sample=per_sample)
    assert ours.data_ptr() == batch.data_ptr() and torch.equal(ours, expected)


@pytest.mark.parametrize("lam, centre", [(0.37, (3, 2)), (0.05, (0, 6)), (0.9, (6, 5))])
def test_cutmix_equals_torchvision_cutmix_given_the_same_lambda_and_centre(monkeypatch, lam, centre):
    from torchvision.transforms import v2

    height, width = 7, 9
    images, labels = torch.randn(4, 3, height, width), torch.tensor([1, 0, 2, 1])
    transform = v2.CutMix(alpha=1.0, num_classes=3)
    monkeypatch.setattr(transform._dist, "sample", lambda shape=(): torch.tensor(lam))
    centres = iter([torch.tensor([centre[0]]), torch.tensor([centre[1]])])  # its randint(W), then randint(H)
    monkeypatch.setattr(torch, "randint", lambda *args, **kwargs: next(centres))
    expected_images, expected_targets = transform(images.clone(), labels)
    u = np.array([0.0, 0.0, 0.0, (centre[0] + 0.5) / width, (centre[1] + 0.5) / height])
    monkeypatch.setattr("dali_bridge.ops.mixing.beta_draw", lambda alpha, u: float(torch.tensor(lam)))
    mix = OPS["cutmix"].sample_batch({"alpha": 1.0}, u, height, width)
    ours_images, ours_targets = mix_batch(images.clone(), one_hot(labels, 3), mix)
    assert torch.equal(ours_images, expected_images) and torch.equal(ours_targets, expected_targets)
    assert torch.allclose(ours_targets.sum(1), torch.ones(4))


def test_label_smoothing_matches_cross_entropy_label_smoothing():
    plan, _ = mixed_plan({"mixup": 0.2})
    labels = torch.tensor([0, 3, 1, 1, 2])
    targets = PostFinish(plan, 0, 0, num_classes=4, label_smoothing=0.1, wants_target=True).targets(labels)
    logits = torch.randn(5, 4)
    soft = torch.nn.functional.cross_entropy(logits, targets)
    smoothed = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.1)
    assert torch.allclose(soft, smoothed, atol=1e-6)
    assert torch.allclose(targets.sum(1), torch.ones(5))


# ---- the draws

@pytest.mark.parametrize("alpha", [0.2, 1.0])
def test_mixup_lambda_follows_beta_alpha_alpha_over_ten_thousand_batches(alpha):
    from scipy import stats

    lams = [mix.lam for mix in draws_of("mixup", {"alpha": alpha}, 8, 8)]
    assert stats.kstest(lams, stats.beta(alpha, alpha).cdf).pvalue > 1e-3


def test_mixup_lambda_fails_the_test_for_another_alpha():
    from scipy import stats

    lams = [mix.lam for mix in draws_of("mixup", {"alpha": 0.4}, 8, 8)]
    assert stats.kstest(lams, stats.beta(0.2, 0.2).cdf).pvalue < 1e-6


@pytest.mark.parametrize("size", [(224, 224), (30, 17)])
@pytest.mark.slow
def test_cutmix_corrected_lambda_and_box_follow_torchvisions_over_ten_thousand_batches(size):
    from scipy.stats import ks_2samp
    from torchvision.transforms import v2

    height, width = size
    ours = draws_of("cutmix", {"alpha": 1.0}, height, width)
    transform = v2.CutMix(alpha=1.0, num_classes=2)
    torch.manual_seed(0)
    theirs = [transform.make_params([torch.zeros(2, 3, height, width)]) for _ in range(BATCHES)]
    for name, mine, its in (
            ("corrected lambda", [m.lam for m in ours], [t["lam_adjusted"] for t in theirs]),
            ("box width", [m.box[2] - m.box[0] for m in ours], [t["box"][2] - t["box"][0] for t in theirs]),
            ("box left", [m.box[0] for m in ours], [t["box"][0] for t in theirs]),
            ("box top", [m.box[1] for m in ours], [t["box"][1] for t in theirs])):
        assert ks_2samp(mine, its).pvalue > 1e-3, name
    for mix in ours:
        x1, y1, x2, y2 = mix.box
        assert mix.lam == pytest.approx(1 - (x2 - x1) * (y2 - y1) / (width * height))


def test_batch_mix_picks_cutmix_and_mixes_at_the_given_rates():
    params = {"mixup_alpha": 0.2, "cutmix_alpha": 1.0, "cutmix_probability": 0.3, "probability": 0.8}
    modes = [mix.mode for mix in draws_of("batch_mix", params, 16, 16)]
    for mode, rate in (("none", 0.2), ("cutmix", 0.8 * 0.3), ("mixup", 0.8 * 0.7)):
        sigma = math.sqrt(rate * (1 - rate) / BATCHES)
        assert abs(modes.count(mode) / BATCHES - rate) <= 3 * sigma, mode


def test_batch_draws_depend_on_batch_rank_and_epoch_only():
    base = batch_uniforms(1, 2, 3, 0, 4, 5)
    assert np.array_equal(base, batch_uniforms(1, 2, 3, 0, 4, 5))
    for other in (batch_uniforms(1, 2, 4, 0, 4, 5), batch_uniforms(1, 2, 3, 1, 4, 5),
                  batch_uniforms(1, 3, 3, 0, 4, 5), batch_uniforms(2, 2, 3, 0, 4, 5)):
        assert not np.array_equal(base, other)


# ---- through the loader

def pipeline(root, **extra) -> dict:
    return {"version": 1, "source": {"type": "folder", "root": str(root)}, "batch_size": 6, "seed": 4,
            "ops": [{"random_resized_crop": 40}, "horizontal_flip",
                    {"normalize": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}},
                    {"random_erasing": {"probability": 0.5, "value": "random"}},
                    {"batch_mix": {"mixup_alpha": 0.2, "cutmix_alpha": 1.0}}],
            "outputs": ["image", "target", "label", "index"], "target": {"label_smoothing": 0.1},
            "loader": {"workers": 1}, **extra}


@needs_cpu_backends
def test_dali_cpu_and_torchvision_yield_the_same_mixed_images_and_targets(sample_root):
    from dali_bridge.tools.compare import compare

    result = compare(pipeline(sample_root), ("dali-cpu", "torchvision"), batches=None)
    assert result.passed, (result.problems, result.outputs)
    assert result.output("target").mismatches == 0 and result.output("image").max_abs <= 1.0 + 1e-3


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_targets_are_soft_labels_that_sum_to_one_and_labels_stay_hard(sample_root, backend):
    from dali_bridge import build_loader

    with build_loader(pipeline(sample_root), backend) as loader:
        batches = list(loader)
    assert len(batches) == math.ceil(37 / 6)
    for image, target, label, index in batches:
        assert target.dtype == torch.float32 and target.shape == (len(label), 3)
        assert torch.allclose(target.sum(1), torch.ones(len(label)))
        assert label.dtype == torch.int64 and image.dtype == torch.float32
    assert any((target.max(1).values < 0.9 - 1e-6).any() for _, target, _, _ in batches)  # some were mixed


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_resumed_loader_mixes_the_same_pairs_with_the_same_lambda(sample_root, backend):
    from dali_bridge import build_loader

    with build_loader(pipeline(sample_root), backend) as loader:
        full = [tuple(t.clone() for t in batch) for batch in loader]
        iterator = iter(loader)  # epoch 1, abandoned after 2 batches with its state saved
        first = [tuple(t.clone() for t in next(iterator)) for _ in range(2)]
        state = loader.state_dict()
    with build_loader(pipeline(sample_root), backend) as fresh:
        fresh.set_epoch(1)
        fresh.load_state_dict(state)
        rest = [tuple(t.clone() for t in batch) for batch in fresh]
    with build_loader(pipeline(sample_root), backend) as again:
        again.set_epoch(1)
        epoch_one = [tuple(t.clone() for t in batch) for batch in again]
    assert len(first) + len(rest) == len(epoch_one)
    for got, want in zip(first + rest, epoch_one):
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert not torch.equal(full[0][1], epoch_one[0][1])  # another epoch mixes otherwise


def test_the_reference_documents_the_target_output_and_its_key():
    from dali_bridge.spec import reference

    assert "target.label_smoothing" in reference.documented_keys()
    page = reference.render_reference()
    assert "`target` (float32 [N, number of classes]" in page
    for name in ("mixup", "cutmix", "batch_mix", "random_erasing"):
        assert f"### `{name}`" in page


def test_cutmix_rolls_only_its_box_and_pastes_what_rolling_the_batch_would():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Rolls(TorchDispatchMode):
        sizes: list[int] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.startswith("roll"):
                self.sizes.append(args[0].numel())
            return func(*args, **(kwargs or {}))

    images = torch.randn(16, 3, 40, 50, generator=torch.Generator().manual_seed(5))
    mix = Mix("cutmix", 0.4, (7, 3, 31, 29))
    rolled = images.roll(1, 0)
    expected = images.clone()
    expected[..., 3:29, 7:31] = rolled[..., 3:29, 7:31]
    before = images.clone()
    with Rolls() as rolls:
        ours, _ = mix_batch(images, None, mix)
    assert torch.equal(ours, expected) and not torch.equal(ours, before)
    assert rolls.sizes == [16 * 3 * 26 * 24]   # the box of every sample, not the batch
