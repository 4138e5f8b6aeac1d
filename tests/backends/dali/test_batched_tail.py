"""The torch tail on a batch (backends/tail.py, each op's ``batch_kernel``): the pixels of torchvision's
per-sample kernels, and kernel launches that follow the operations drawn, not the batch size.

Pixels are compared on real photos (tests/helpers/real_photos.py) and generated images over every policy
operation at every magnitude bin and both signs, colour jitter with its per-sample order, AugMix,
and the policies as they draw; the launches are counted as aten calls with a dispatch mode.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.helpers.backends import backend_params, plan_of
from dali_bridge.backends.dali.plan import dali_plan
from dali_bridge.backends.dali.tail import run_tail
from dali_bridge.ops.policy_kernels import apply_operation, apply_operations
from dali_bridge.ops.policy_tables import SIGNED, SPACES, PolicyOperation, magnitudes
from dali_bridge.ops.registry import OPS
from dali_bridge.ops.facets import Batching, Sizing, facet
from dali_bridge.pipeline.sampling import draw_count
from tests.helpers.real_photos import write_real_photos

SIZE = (48, 56)  # (height, width) of every test image: small, so the sweep stays quick
BINS = {"original": 31, "wide": 31, "auto": 10, "augmix": 10}


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> torch.Tensor:
    """Crops of the real photos (colour and grey, both JPEG settings) at SIZE, as one uint8 batch."""
    from torchvision.io import ImageReadMode, decode_image, read_file

    root = write_real_photos(tmp_path_factory.mktemp("photos"))
    crops = []
    for path in sorted(Path(root).rglob("*.jpg")):
        image = decode_image(read_file(str(path)), mode=ImageReadMode.RGB)
        top, left = (image.shape[1] - SIZE[0]) // 2, (image.shape[2] - SIZE[1]) // 3
        crops.append(image[:, top:top + SIZE[0], left:left + SIZE[1]])
    return torch.stack(crops)


def generated() -> torch.Tensor:
    """Noise, smooth ramps, flat grey, black and white, saturated colours: edge cases of the kernels."""
    g = torch.Generator().manual_seed(5)
    noise = torch.randint(0, 256, (4, 3, *SIZE), dtype=torch.uint8, generator=g)
    ramp = torch.linspace(0, 255, SIZE[1]).round().to(torch.uint8).expand(3, SIZE[0], SIZE[1])
    flat = [torch.full((3, *SIZE), level, dtype=torch.uint8) for level in (0, 128, 255)]
    primary = torch.zeros(3, *SIZE, dtype=torch.uint8)
    primary[0], primary[1, :, : SIZE[1] // 2] = 255, 200
    return torch.cat([noise, torch.stack([ramp, ramp.flip(-1), *flat, primary])])


@pytest.fixture(scope="module")
def images(photos) -> torch.Tensor:
    return torch.cat([photos, generated()])


def per_sample(step, batch: torch.Tensor, concrete: list[tuple]) -> torch.Tensor:
    return torch.stack([step.op.torchvision_kernel(image, c, step.params) for image, c in zip(batch, concrete)])


def assert_same_pixels(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    differ = (got != want).any(dim=(-3, -2, -1)).nonzero().flatten().tolist()
    assert not differ, f"{what}: samples {differ} differ (at most {(got.int() - want.int()).abs().max()} levels)"


def every_operation(space: str) -> list[PolicyOperation]:
    """Every operation of ``space`` at every magnitude bin, each signed one with both signs."""
    found = []
    for name in SPACES[space]:
        table = magnitudes(space, name, BINS[space], *SIZE)
        values = [0.0] if table is None else list(table) + ([-m for m in table] if name in SIGNED else [])
        found += [PolicyOperation(name, value) for value in values]
    return found


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
@pytest.mark.parametrize("fill", [None, [10.0, 200.0, 30.0]], ids=["zeros", "rgb"])
@pytest.mark.parametrize("space", sorted(BINS))
def test_every_policy_operation_at_every_bin_and_sign_gives_the_per_sample_kernels_pixels(images, space,
                                                                                          interpolation, fill):
    operations = every_operation(space)
    count = len(images)
    # Rows cycle through the operations so that each call groups several samples with different
    # magnitudes, some rows left unchanged (None) in between.
    for start in range(0, len(operations), count - 1):
        chosen = operations[start:start + count - 1] + [None]
        chosen += [None] * (count - len(chosen))
        got = apply_operations(images, chosen, interpolation, fill)
        for row, operation in enumerate(chosen):
            want = images[row] if operation is None else apply_operation(images[row], operation, interpolation, fill)
            assert torch.equal(got[row], want), f"{space} {operation} ({interpolation}, fill {fill}) on row {row}"


@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
def test_rotations_by_quarter_turns_of_square_images_take_torchvisions_fast_path_too(images, interpolation):
    square = images[..., :48]
    table = magnitudes("wide", "Rotate", 31, 48, 48)
    assert 90.0 in table and 0.0 in table   # bins torchvision rotates by rot90 or a copy
    operations = [PolicyOperation("Rotate", sign * m) for m in table for sign in (1, -1)]
    for start in range(0, len(operations), len(square)):
        chosen = operations[start:start + len(square)]
        got = apply_operations(square[:len(chosen)], chosen, interpolation, None)
        for row, operation in enumerate(chosen):
            assert torch.equal(got[row], apply_operation(square[row], operation, interpolation, None)), operation


def drawn(op_name: str, params: dict, count: int, seed: int) -> tuple:
    """The step of ``op_name`` with ``params`` and ``count`` samples' concrete parameters at SIZE."""
    plan = plan_of([{"random_resized_crop": {"size": list(SIZE)}}, {op_name: params}])
    step = next(step for step in plan.steps if step.name == op_name)
    uniforms = np.random.default_rng(seed).random((count, draw_count(step)))
    return step, [step.op.sample(step.params, u, *SIZE) for u in uniforms]


POLICIES = {
    "trivial_augment_wide": {},
    "trivial_augment_wide-bilinear-fill": {"interpolation": "bilinear", "fill": [128, 0, 255]},
    "rand_augment": {"num_ops": 3, "magnitude": 9},
    "rand_augment-bin0": {"num_ops": 2, "magnitude": 0},
    "auto_augment": {},
    "augmix": {},
    "augmix-partial-depth2": {"all_ops": False, "chain_depth": 2, "mixture_width": 2, "severity": 10},
    "augmix-alpha": {"alpha": 0.5, "interpolation": "nearest", "fill": 77},
    "color_jitter": {"brightness": 0.6, "contrast": 0.6, "saturation": 0.6, "hue": 0.3},
    "color_jitter-wide": {"brightness": [0.0, 3.0], "contrast": [0.0, 4.0], "saturation": [0.0, 5.0],
                          "hue": [-0.5, 0.5]},
    "color_jitter-two": {"contrast": 0.9, "hue": 0.1},
    "random_grayscale": {"probability": 0.5},
    "gaussian_blur": {"kernel_size": 5, "sigma": [0.1, 2.0]},
    "gaussian_blur-fixed": {"kernel_size": [3, 7], "sigma": 1.5},
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_a_batch_kernel_gives_the_per_sample_kernels_pixels_as_the_op_draws(images, name):
    op_name = name.split("-")[0]
    for seed in range(3):
        step, concrete = drawn(op_name, POLICIES[name], len(images), seed)
        got = facet(step.op, Batching).batch_kernel(images, concrete, step.params)
        assert got is not None, f"{op_name} has a batch kernel"
        assert_same_pixels(got, per_sample(step, images, concrete), f"{name} seed {seed}")


def test_colour_jitter_draws_every_order_of_its_four_adjustments_in_one_batch():
    _, concrete = drawn("color_jitter", POLICIES["color_jitter"], 256, 0)
    assert len({c[0].order for c in concrete}) == 24  # so the comparison above covers mixed orders


def test_timms_variant_has_no_batch_kernel_and_the_tail_runs_it_per_sample(images):
    step, concrete = drawn("rand_augment", {"variant": "timm", "num_ops": 2, "magnitude": 9}, 4, 0)
    assert facet(step.op, Batching).batch_kernel(images[:4], concrete, step.params) is None
    tail = [[(c, SIZE)] for c in concrete]
    assert_same_pixels(run_tail([step], images[:4], tail), per_sample(step, images[:4], concrete), "timm")


def test_a_tail_that_starts_with_the_resize_loops_until_the_sizes_agree_then_batches(photos, monkeypatch):
    # parity exact: the resize runs in the tail, on images of every size, before the policy.
    plan = plan_of([{"random_resized_crop": {"size": 32}}, {"horizontal_flip": {}}, {"trivial_augment_wide": {}},
                    {"color_jitter": {"brightness": 0.4, "hue": 0.2}}])
    assert [step.name for step in dali_plan(plan).torch_tail][:1] == ["random_resized_crop"]
    inputs = [photos[n, :, : 40 + n, : 48 - n] for n in range(len(photos))]  # every sample its own size
    rng = np.random.default_rng(3)
    tail = []
    for image in inputs:
        height, width = image.shape[-2:]
        steps = []
        for step in dali_plan(plan).torch_tail:
            concrete = step.op.sample(step.params, rng.random(draw_count(step)), height, width)
            steps.append((concrete, (height, width)))
            height, width = facet(step.op, Sizing).output_size(concrete, height, width)
        tail.append(steps)
    batched_calls = []
    # An op without the batching facet runs the facet's default (no batched kernel): count that one too.
    owners = {type(step.op) if isinstance(step.op, Batching) else Batching for step in dali_plan(plan).torch_tail}
    for owner in owners:
        real = owner.batch_kernel
        def counted(self, images, concrete, params, real=real):
            done = real(self, images, concrete, params)
            batched_calls.append((self.name, done is not None))
            return done

        monkeypatch.setattr(owner, "batch_kernel", counted)
    got = run_tail(dali_plan(plan).torch_tail, inputs, tail)
    want = []
    for image, steps in zip(inputs, tail):
        for step, (concrete, _) in zip(dali_plan(plan).torch_tail, steps):
            image = step.op.torchvision_kernel(image, concrete, step.params)
        want.append(image)
    assert_same_pixels(got, torch.stack(want), "the tail")
    # The resize, on samples of different sizes, and the flip (no batch kernel) ran per sample; the rest batched.
    assert batched_calls == [("random_resized_crop", False), ("horizontal_flip", False),
                             ("trivial_augment_wide", True), ("color_jitter", True)]


def test_the_tail_returns_memory_of_its_own_when_no_step_changes_the_batch(images):
    step, concrete = drawn("auto_augment", {}, 2, 0)
    keep = [(type(c[0])((), c[0].interpolation, c[0].fill),) for c in concrete]  # no operation applies
    batch = images[:2].clone()
    out = run_tail([step], batch, [[(c, SIZE)] for c in keep])
    assert torch.equal(out, batch) and out.data_ptr() != batch.data_ptr()


class AtenCalls(TorchDispatchMode):
    """Counts the aten operators dispatched (each a kernel launch on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def aten_calls(step, batch: torch.Tensor, concrete: list[tuple]) -> int:
    with AtenCalls() as calls:
        run_tail([step], batch, [[(c, SIZE)] for c in concrete])
    return calls.count


@pytest.mark.parametrize("name", ["trivial_augment_wide", "rand_augment", "auto_augment", "augmix",
                                  "color_jitter-wide", "random_grayscale", "gaussian_blur-fixed"])
def test_the_tails_aten_calls_follow_the_operations_drawn_not_the_batch_size(images, name):
    op_name = name.split("-")[0]
    step, concrete = drawn(op_name, POLICIES[name], 8, 1)
    small = images[:8]
    large = small.repeat(4, 1, 1, 1)  # batch 32 drawing the same operations, each four times
    aten_calls(step, small, concrete)   # the first run of a kernel in a process makes one-off tensors: not counted
    # The same calls, but for a broadcast or two inside torchvision's affine once a group holds more than one image.
    count_small, count_large = aten_calls(step, small, concrete), aten_calls(step, large, concrete * 4)
    assert count_small <= count_large <= 1.1 * count_small, (count_small, count_large)
    with AtenCalls() as calls:  # what the per-sample loop launches for the same batch of 32
        per_sample(step, large, concrete * 4)
    assert count_large < calls.count / 2, (count_large, calls.count)


def test_colour_jitters_aten_calls_per_batch_do_not_grow_with_the_batch(images):
    # Continuous factors: every sample has its own, yet a batch of 32 makes as many calls as one of 8
    # (per-sample factors as tensors; at most 4 adjustments x 4 places).
    step, small = drawn("color_jitter", POLICIES["color_jitter"], 8, 7)
    _, large = drawn("color_jitter", POLICIES["color_jitter"], 32, 3)
    for draws in (small, large):  # every adjustment at every place: the most groups a batch can have
        assert all({c[0].order[place] for c in draws} == {0, 1, 2, 3} for place in range(4))
    count_small = aten_calls(step, images[:8], small)
    count_large = aten_calls(step, images[:8].repeat(4, 1, 1, 1), large)
    assert count_large < 1.5 * count_small, (count_small, count_large)


def test_ops_without_a_batch_kernel_fall_back_to_the_per_sample_loop(images):
    assert facet(OPS["vertical_flip"], Batching).batch_kernel(images, [], {}) is None
    assert facet(OPS["horizontal_flip"], Batching).batch_kernel(images, [], {}) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: on a CPU host there is no CUDA "
                                                          "arithmetic to compare the batch kernels with")
@pytest.mark.parametrize("name", ["trivial_augment_wide", "rand_augment", "augmix", "color_jitter-wide",
                                  "gaussian_blur"])
def test_on_cuda_a_batch_kernel_gives_the_per_sample_cuda_kernels_pixels(request, name):
    # The real photos need scikit-image, which a GPU machine with only torch and torchvision lacks:
    # the generated edge cases alone there.
    images = request.getfixturevalue("images") if importlib.util.find_spec("skimage") else generated()
    op_name = name.split("-")[0]
    on_gpu = images.cuda()
    step, concrete = drawn(op_name, POLICIES[name], len(images), 0)
    assert_same_pixels(facet(step.op, Batching).batch_kernel(on_gpu, concrete, step.params).cpu(),
                       per_sample(step, on_gpu, concrete).cpu(), f"{name} on CUDA")


def torchs_fused_multiply_add(base: torch.Tensor, other: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """torch's own ``base.add_(other, alpha=a)``, one scalar alpha per sample: the reference."""
    return torch.stack([b.clone().add_(o, alpha=float(a)) for b, o, a in zip(base, other, alpha.flatten())])


def test_the_per_sample_fused_multiply_add_rounds_as_torchs_own_on_midpoints_and_random_values():
    from dali_bridge.ops.batched import cpu_add_rounding, fused_multiply_add

    # Sums whose float64 value is exactly a float32 midpoint though the exact sum is not: rounding the
    # float64 value again would round to even, the wrong way (errors of both signs).
    a, b = 1 + 2.0 ** -23, 2.0 ** -24 * (1 + 2.0 ** -18)
    base = torch.tensor([[a], [-a], [a], [1.0]], dtype=torch.float64).float().view(4, 1, 1, 1)
    other = torch.tensor([1 - 2.0 ** -18, -(1 - 2.0 ** -18), 1.0, 1 - 2.0 ** -18]).float().view(4, 1, 1, 1)
    alpha = torch.tensor([b, b, b, b]).float().view(4, 1, 1, 1)
    assert torch.equal(fused_multiply_add(base, other, alpha), torchs_fused_multiply_add(base, other, alpha))
    if cpu_add_rounding() == "fused":  # torch's AVX2/AVX-512 kernels; without FMA the product rounds first
        assert fused_multiply_add(base, other, alpha)[0].item() == a   # not 1 + 2**-22, the even neighbour
    g = torch.Generator().manual_seed(0)
    base = (torch.rand((6, 3, 8, 8), generator=g) * 300).float()
    other = (torch.rand((6, 3, 8, 8), generator=g) * 255).floor()
    alpha = torch.tensor([1e-9, 0.3, 1 - 2.0 ** -24, 1.7, -0.99, 2.0 ** -30]).float().view(6, 1, 1, 1)
    assert torch.equal(fused_multiply_add(base, other, alpha), torchs_fused_multiply_add(base, other, alpha))


@pytest.mark.parametrize("backend", backend_params(["dali-cpu"]))
def test_a_dali_cpu_batchs_tail_launches_do_not_scale_with_the_batch_size(tmp_path, monkeypatch, backend):
    from dali_bridge import build_loader
    from dali_bridge.backends.dali.tail_runner import TailRunner
    from tests.helpers.hostile import write_image_folder

    write_image_folder(tmp_path / "data", classes=2, per_class=16)
    counts: list[int] = []
    real = TailRunner.run

    def counted(self, outputs, tail):
        with AtenCalls() as calls:  # in the tail thread: dispatch modes are per thread
            done = real(self, outputs, tail)
        counts.append(calls.count)
        return done

    monkeypatch.setattr(TailRunner, "run", counted)
    per_batch = {}
    for batch_size in (8, 32):
        counts.clear()
        # parity fast: the resize stays in DALI, so the whole tail is the policy (and the finish)
        loader = build_loader({"version": 1, "source": {"type": "folder", "root": str(tmp_path / "data")},
                               "batch_size": batch_size, "seed": 4, "parity": "fast",
                               "ops": [{"random_resized_crop": {"size": 32}}, {"trivial_augment_wide": {}},
                                       {"normalize": {}}], "loader": {"workers": 1, "executor": "threads"}}, backend)
        loader._executor.tail.batched = True  # the GPU's batch kernels, counted on the host (in its thread)
        next(iter(loader))
        loader.close()
        per_batch[batch_size] = counts[0]
    # More operations drawn in the larger batch (99 and 187 calls here), where a per-sample loop makes about 4x.
    assert per_batch[32] < 2.5 * per_batch[8], per_batch


def midpoint_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """base, other, alpha where a fused multiply-add gives ``base`` back (the exact sum rounds down to
    it) and the unfused one the even neighbour above (the rounded product lands on a midpoint)."""
    a, b = 1 + 2.0 ** -23, 2.0 ** -24 * (1 + 2.0 ** -18)
    base = torch.tensor([a], dtype=torch.float64).float().view(1, 1, 1, 1)
    return base, torch.tensor([1 - 2.0 ** -18]).view(1, 1, 1, 1), torch.tensor([b]).view(1, 1, 1, 1), a


def test_the_batch_multiply_add_rounds_as_the_probe_of_its_own_device_says(monkeypatch):
    from dali_bridge.ops import batched

    probed: list[torch.device] = []
    verdict = {"cpu": "unfused"}

    def probe(device: torch.device) -> str:
        probed.append(device)
        return verdict[device.type]

    monkeypatch.setattr(batched, "probe_add_rounding", probe)
    monkeypatch.setattr(batched, "_ADD_ROUNDING", {})
    base, other, alpha, a = midpoint_case()
    for _ in range(2):  # asked of the device once, then remembered
        assert batched.fused_multiply_add(base, other, alpha).item() == 1 + 2.0 ** -22   # the product rounded first
    assert probed == [torch.device("cpu")]
    monkeypatch.setattr(batched, "_ADD_ROUNDING", {})
    verdict["cpu"] = "fused"
    assert batched.fused_multiply_add(base, other, alpha).item() == a   # one rounding
    monkeypatch.setattr(batched, "_ADD_ROUNDING", {})
    verdict["cpu"] = "mixed"   # each sample through torch's own kernel, whatever it does here
    assert torch.equal(batched.fused_multiply_add(base, other, alpha), torchs_fused_multiply_add(base, other, alpha))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device: checks the probe against CUDA's add kernel"))])
def test_the_probe_answers_what_the_devices_add_kernel_does(device):
    from dali_bridge.ops.batched import probe_add_rounding

    base, other, alpha, a = midpoint_case()
    base, other = base.to(device), other.to(device)
    torchs = base.expand(1, 1, 1, 67).clone().add_(other.expand(1, 1, 1, 67), alpha=float(alpha)).flatten().cpu()
    found = probe_add_rounding(torch.device(device))
    if found == "fused":
        assert bool((torchs == a).all())
    elif found == "unfused":
        assert bool((torchs == 1 + 2.0 ** -22).all())
    else:
        assert found == "mixed" and len(set(torchs.tolist())) == 2


def test_the_tail_asks_the_batchs_device_how_it_rounds_before_its_first_step(monkeypatch):
    # On a GPU the probe waits for the device: asked before the first step, it falls in the first batch
    # whatever that batch draws, not inside a later one (where device_check's sync check would refuse it).
    from dali_bridge.ops import batched

    probed: list[torch.device] = []
    monkeypatch.setattr(batched, "probe_add_rounding", lambda device: probed.append(device) or "fused")
    monkeypatch.setattr(batched, "_ADD_ROUNDING", {})
    plan = plan_of([{"random_resized_crop": {"size": list(SIZE)}}, {"vertical_flip": {"probability": 1.0}}])
    step = next(step for step in plan.steps if step.name == "vertical_flip")
    concrete = [step.op.sample(step.params, np.zeros(draw_count(step)), *SIZE) for _ in range(2)]
    batch = torch.empty((2, 3, *SIZE), dtype=torch.uint8, device="meta")   # a device other than the CPU
    for _ in range(2):
        assert run_tail([step], batch, [[(c, SIZE)] for c in concrete]).device.type == "meta"
    assert probed == [torch.device("meta")]
