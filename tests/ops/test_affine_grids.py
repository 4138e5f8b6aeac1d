"""The affine operations' grids kept by a process (dali-cpu's tail workers): the pixels of torchvision's
kernels, which build each grid anew, and no more memory than asked."""
from __future__ import annotations

import pytest
import torch

from dali_bridge.ops import policy_kernels
from dali_bridge.ops.policy_kernels import AffineGrids, apply_operation, keep_affine_grids
from dali_bridge.ops.policy_tables import PolicyOperation, WIDE, magnitudes

AFFINE = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")


@pytest.fixture
def kept():
    keep_affine_grids(64 << 20)
    yield policy_kernels._kept
    policy_kernels._kept = None


def image(height: int, width: int) -> torch.Tensor:
    return torch.randint(0, 256, (3, height, width), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))


@pytest.mark.parametrize("size", [(23, 31), (24, 24)])  # a square one takes rotate's copies at 90 and 270
@pytest.mark.parametrize("interpolation,fill", [("bilinear", None), ("nearest", [128.0, 0.0, 255.0])])
def test_each_affine_operation_at_every_magnitude_and_sign_gives_torchvisions_pixels(kept, size, interpolation,
                                                                                       fill):
    picture = image(*size)
    operations = [PolicyOperation(name, sign * magnitude) for name in AFFINE
                  for magnitude in magnitudes("wide", name, 31, *size) for sign in (1, -1)]
    operations += [PolicyOperation("Rotate", angle) for angle in (90.0, 180.0, 270.0, -90.0)]
    assert set(WIDE) >= set(AFFINE)
    for operation in operations:
        policy_kernels._kept = None
        anew = apply_operation(picture, operation, interpolation, fill)
        policy_kernels._kept = kept
        for _ in range(2):  # made, then found
            assert torch.equal(apply_operation(picture, operation, interpolation, fill), anew), operation
    assert kept._grids  # the grids were kept, and used the second time


def test_the_grids_kept_stay_within_their_memory_the_least_recently_used_dropped_first():
    grids = AffineGrids(max_bytes=3 * 10 * 12 * 2 * 4)  # three grids of 10 x 12
    first = grids.grid(PolicyOperation("ShearX", 0.1), 10, 12)
    for magnitude in (0.2, 0.3):
        grids.grid(PolicyOperation("ShearX", magnitude), 10, 12)
    assert grids.grid(PolicyOperation("ShearX", 0.1), 10, 12) is first  # used again: now the most recent
    grids.grid(PolicyOperation("Rotate", 10.0), 10, 12)
    assert grids.bytes <= grids.max_bytes and len(grids._grids) == 3
    assert ("ShearX", 0.2, 10, 12) not in grids._grids and ("ShearX", 0.1, 10, 12) in grids._grids
