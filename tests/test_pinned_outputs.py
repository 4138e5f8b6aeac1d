"""Pinned outputs: sha256 of whole batches (images, labels, indices) and of the sampler's draws.

The op layer may be reorganised freely, but not one output pixel, order or random draw of an
existing pipeline may change on any backend. These digests were computed from the pipelines below
on the generated sample set of tests/conftest.py; a failing digest means a pipeline's output
changed (the set's own digest is pinned too, so a change of the generated images is told apart).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from conftest import MEAN, STD, TRAIN, VAL, backend_params

from dali_bridge.loader import build_loader
from dali_bridge.plan import build_plan
from dali_bridge.spec import coerce_spec

UINT8 = {"normalize": {"dtype": "uint8"}}

# name → (shipped pipeline, overrides): the shipped pipelines and variants covering every resize
# method of the DALI backend, a mid-pipeline flip, crop_mirror_normalize and float16 HWC.
VARIANTS: dict[str, tuple[Path, dict]] = {
    "train": (TRAIN, {}),
    "val": (VAL, {}),
    "train-nearest-uint8": (TRAIN, {"ops": [{"random_resized_crop": {"size": 96, "interpolation": "nearest"}},
                                            {"horizontal_flip": 0.5}, UINT8]}),
    "train-bicubic": (TRAIN, {"ops.0.random_resized_crop.interpolation": "bicubic"}),
    "train-no-antialias": (TRAIN, {"ops.0.random_resized_crop.antialias": False}),
    "val-bicubic": (VAL, {"ops.0.resize.interpolation": "bicubic"}),
    "resize-to-fixed-size": (VAL, {"ops": [{"resize": [180, 200]}, UINT8]}),
    "resize-fixed-then-crop": (VAL, {"ops": [{"resize": [240, 250]}, {"center_crop": 200}, UINT8]}),
    "crop-mirror-normalize": (VAL, {"ops": [{"resize": 256}, {"crop_mirror_normalize": {
        "crop": 224, "mirror": 0.5, "mean": MEAN, "std": STD}}]}),
    "flip-in-the-middle": (VAL, {"ops": [{"resize": 128}, {"horizontal_flip": 0.5}, {"center_crop": 112}, UINT8]}),
    "rrc-after-resize": (VAL, {"ops": [{"resize": 300}, {"random_resized_crop": [200, 160]}, UINT8]}),
    "train-float16-hwc": (TRAIN, {"ops.2.normalize.dtype": "float16", "ops.2.normalize.layout": "HWC"}),
    "train-parity-fast": (TRAIN, {"parity": "fast"}),
}

SAMPLE_SET = "e0367bef"  # first 8 hex digits of the generated set's digest (see sample_set_digest)

PINNED: dict[tuple[str, str], str] = {
    ("train", "dali-cpu"): "6c1084d2564493a411cac2af984c588ca8a7dd11b80db8270157d4246282a725",
    ("train", "torchvision"): "7172487c8d1070150ffd9ccb730e4f98d9ee976951c3054b6181abb4dc1d6d51",
    ("val", "dali-cpu"): "9e87da345073ec73b406a9215f434910bd8a31f7382d006ad8023362dfe42839",
    ("val", "torchvision"): "6260730027a2543c5a17820ce75f8d51e0b063bfb3a431d3d1d7538ca6491040",
    ("train-nearest-uint8", "dali-cpu"): "a2b71de365354547d7e12689b51b2b89c85e7922de16ddc7838db0e5f8d962ac",
    ("train-nearest-uint8", "torchvision"): "a2b71de365354547d7e12689b51b2b89c85e7922de16ddc7838db0e5f8d962ac",
    ("train-bicubic", "dali-cpu"): "f88b1c96086776d5ff0ef80437641ac8c272eec3dc21668e3c446c9990201a31",
    ("train-bicubic", "torchvision"): "c0c906cc2ff4ad0320fa2f7599fc103ac45153e9cf8ca191e9293bcdb6032c4a",
    ("train-no-antialias", "dali-cpu"): "0b8515057baeef64bd68107d7520c73e86ec110502fab49c98e1d79c49400258",
    ("train-no-antialias", "torchvision"): "76eba556c5ccb19cfc014c10ed241f2c236c546865d9ceae8d461b09130c6e23",
    ("val-bicubic", "dali-cpu"): "e9fbaead39e4d272ec890e4a2c8fc4686f7a534d013ffb1f17bbb9e41c419780",
    ("val-bicubic", "torchvision"): "10bef18d286521e88bde1c71e3f1c7a48b8c3feced08d3ea8503979d1826c26c",
    ("resize-to-fixed-size", "dali-cpu"): "a4e40aa2f4452149cb98554d755c22f25a8617d76b1fbeda75d3e8be9b50b4fc",
    ("resize-to-fixed-size", "torchvision"): "e4228c94da18ef7c33aa14d0d0e540ff6592a3b0ef205e3a96cf51d6c5e83c20",
    ("resize-fixed-then-crop", "dali-cpu"): "c90885ee5069e88d6a8c82a30b3e251549cabd4fd6edbd2682e7158c822a32f5",
    ("resize-fixed-then-crop", "torchvision"): "a62165397394ef4d8b1639eb485fdb21fd6f75b179ae6b5da05205bea32353fe",
    ("crop-mirror-normalize", "dali-cpu"): "f47334736120983163598b528000b1ccadf3c6e4e673ffbab923997d499819e0",
    ("crop-mirror-normalize", "torchvision"): "be433a21f2195cf1882931a0d39fa0c630815dca8cfa6e5c58f2999833ea9b29",
    ("flip-in-the-middle", "dali-cpu"): "536351c1079bd65b4ad375f14aa5133ffbc157166ceaa8cc31e30e81902017cc",
    ("flip-in-the-middle", "torchvision"): "6d691c412c9dc1ed50106e76f697ea30aafedd97d6af4a645503a3681fd1f190",
    ("rrc-after-resize", "dali-cpu"): "f604b3b000bfd4d6bd2f1d284e0ab07b709e386cc1052694995bf2b0d9873f59",
    ("rrc-after-resize", "torchvision"): "2139a05adf405f512be80f5f241ba7e95dc5030377cf0398a0dea1b1b5da6748",
    ("train-float16-hwc", "dali-cpu"): "2d26ea835d42a612be06a8790dee17eea838095922d1f80360179cc3b2ab0db0",
    ("train-float16-hwc", "torchvision"): "9f6e0220ad90d9f1bee959f6a0fe5299776338707a0bb97d691b845dbbe7f11a",
    ("train-parity-fast", "dali-cpu"): "0d4cb4e73968fedc4d9ac9beb7cd133a5cb1e1fe4b0ad03089ea5b26b977da2c",
    ("train-parity-fast", "torchvision"): "7172487c8d1070150ffd9ccb730e4f98d9ee976951c3054b6181abb4dc1d6d51",
}


def sample_set_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.jpg")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:8]


def output_digest(root: Path, name: str, backend: str) -> str:
    """sha256 of the first two batches of epochs 0 and 1 (images, labels, indices), 8 per batch."""
    base, overrides = VARIANTS[name]
    spec = coerce_spec(base, {"source": {"type": "folder", "root": str(root)}, "batch_size": 8,
                              "outputs": ["image", "label", "index"], "loader.workers": 1, **overrides})
    digest = hashlib.sha256()
    with build_loader(spec, backend) as loader:
        for epoch in (0, 1):
            loader.set_epoch(epoch)
            for number, (image, label, index) in enumerate(loader):
                for tensor in (image, label, index):
                    digest.update(str((tuple(tensor.shape), tensor.dtype)).encode())
                    digest.update(tensor.contiguous().cpu().numpy().tobytes())
                if number == 1:
                    break
    return digest.hexdigest()


def test_the_generated_sample_set_is_the_one_the_digests_were_computed_on(sample_root):
    assert sample_set_digest(sample_root) == SAMPLE_SET


@pytest.mark.parametrize("backend", backend_params(["dali-cpu", "torchvision"]))
@pytest.mark.parametrize("name", list(VARIANTS))
def test_pipeline_outputs_are_bit_identical_to_the_pinned_digests(sample_root, name, backend):
    assert output_digest(sample_root, name, backend) == PINNED[name, backend]


# ---------------------------------------------------------------------------------------------
# The sampler's draws and the geometry they give

def plan_of(ops: list):
    from dali_bridge.spec import spec_from_dict

    return build_plan(spec_from_dict({"version": 1, "source": {"type": "folder", "root": "/nonexistent"},
                                      "batch_size": 2, "ops": ops}))


@pytest.mark.parametrize("ops, streams, expected", [
    ([{"random_resized_crop": 32}, {"resize": 40}, {"center_crop": 32}, {"horizontal_flip": 0.5}, {"normalize": {}}],
     [0, 3], "27a05283098c24a6b85c608b83eadbf71b73591c94079d47a048c4ee7f80b171"),
    ([{"resize": 64}, {"crop_mirror_normalize": {"crop": 48, "mirror": 0.3}}],
     [2], "4eed0eaab42ceeb93cb9e943cd98f29f8b40d3432fd9235d29a377d612272f31"),
], ids=["every-geometry-op", "crop-mirror-normalize"])
def test_draws_are_bit_identical_to_the_pinned_digests(ops, streams, expected):
    from dali_bridge.sampling import draws

    got = draws(plan_of(ops), 7, 3, np.arange(100, 164))
    assert sorted(got) == streams
    digest = hashlib.sha256()
    for position in sorted(got):
        digest.update(str((position, got[position].shape)).encode())
        digest.update(got[position].tobytes())
    assert digest.hexdigest() == expected


def test_train_crop_windows_and_flips_are_the_pinned_ones():
    from dali_bridge.sampling import draws, sample_geometry

    plan = plan_of([{"random_resized_crop": 224}, {"horizontal_flip": 0.5}, {"normalize": {}}])
    indices = np.array([0, 1, 5, 8, 11])
    sample_draws = draws(plan, 0, 2, indices)
    got = []
    for row in range(len(indices)):
        crop, resize, flip = sample_geometry(plan, 375, 500, {k: v[row] for k, v in sample_draws.items()})
        assert (resize.height, resize.width) == (224, 224)
        got.append((crop.top, crop.left, crop.height, crop.width, flip.apply))
    assert got == [(103, 252, 192, 200, False), (72, 61, 289, 245, True), (48, 11, 302, 283, False),
                   (125, 110, 240, 299, False), (27, 115, 310, 382, True)]
