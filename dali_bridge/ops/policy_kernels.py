"""The augmentation policies' operation kernels: one :class:`~.policy_tables.PolicyOperation` on a
CHW uint8 image as torchvision applies it, and the batched form that groups a batch's samples by
operation (shear, translate and rotate with one matrix per sample, on torchvision's grid)."""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from typing import Any, Callable

from .policy_tables import PolicyOperation


class AffineGrids:
    """The sampling grids of the affine operations (shear, translate, rotate), kept by operation,
    magnitude and image size, up to ``max_bytes``, the least recently used dropped first.

    torchvision's ``affine_image`` and ``rotate_image`` build each call's grid anew (``_affine_grid``:
    a batch matrix product over every output pixel), which cost more than the sampling itself. The
    grid depends only on the matrix and the size, and the policies draw their magnitudes from a few
    dozen bins, so a process that runs many samples finds nearly every grid made before. Each is
    made by torchvision's own ``_affine_grid`` from the matrix it would build (:func:`_inverse_matrix`),
    so the pixels are those of the call that builds it anew. 31 bins of each sign for five
    operations at 176 x 176 take about 75 MB."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self.bytes = max_bytes, 0
        self._grids: OrderedDict[tuple, Any] = OrderedDict()
        self._lock = threading.Lock()

    def grid(self, operation: PolicyOperation, height: int, width: int) -> Any:
        """The float32 grid (1 x height x width x 2) of ``operation`` on an image of that size."""
        import torch
        from torchvision.transforms.v2.functional._geometry import _affine_grid

        key = (operation.name, operation.magnitude, height, width)
        with self._lock:
            grid = self._grids.get(key)
            if grid is not None:
                self._grids.move_to_end(key)
                return grid
        theta = torch.tensor(_inverse_matrix(operation, height, width), dtype=torch.float32).reshape(1, 2, 3)
        grid = _affine_grid(theta, w=width, h=height, ow=width, oh=height)
        with self._lock:
            if key not in self._grids:
                self._grids[key] = grid
                self.bytes += grid.nbytes
            while self.bytes > self.max_bytes and self._grids:
                self.bytes -= self._grids.popitem(last=False)[1].nbytes
        return grid


# The grids this process keeps, where it asked to (keep_affine_grids); None: each call builds its own.
_kept: AffineGrids | None = None


def keep_affine_grids(max_bytes: int) -> None:
    """From now on this process keeps the affine operations' grids (:class:`AffineGrids`): for a process
    that runs a policy on many samples of one size (``dali-cpu``'s tail worker processes)."""
    global _kept
    _kept = AffineGrids(max_bytes)


def apply_operation(image: Any, operation: PolicyOperation, interpolation: str, fill: Any) -> Any:
    """torchvision's ``_AutoAugmentBase._apply_image_or_video_transform`` on a CHW uint8 tensor."""
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as F

    name, magnitude = operation.name, operation.magnitude
    mode = InterpolationMode(interpolation)
    kept = _kept
    if (kept is not None and name in _AFFINE and image.device.type == "cpu" and not image.is_floating_point()
            and image.numel() and not _rotates_by_copy(operation, *image.shape[-2:])):
        # affine_image's and rotate_image's own last step, on the grid they would have built
        from torchvision.transforms.v2.functional._geometry import _apply_grid_transform

        return _apply_grid_transform(image, kept.grid(operation, *image.shape[-2:]), mode.value, fill=fill)
    affine = dict(angle=0.0, scale=1.0, interpolation=mode, fill=fill)
    if name == "ShearX":  # shear angle arctan(magnitude), about the top-left corner
        return F.affine(image, translate=[0, 0], shear=[math.degrees(math.atan(magnitude)), 0.0], center=[0, 0],
                        **affine)
    if name == "ShearY":
        return F.affine(image, translate=[0, 0], shear=[0.0, math.degrees(math.atan(magnitude))], center=[0, 0],
                        **affine)
    if name == "TranslateX":
        return F.affine(image, translate=[int(magnitude), 0], shear=[0.0, 0.0], **affine)
    if name == "TranslateY":
        return F.affine(image, translate=[0, int(magnitude)], shear=[0.0, 0.0], **affine)
    kernels: dict[str, Callable[[], Any]] = {
        "Identity": lambda: image,
        "Rotate": lambda: F.rotate(image, angle=magnitude, interpolation=mode, fill=fill),
        "Brightness": lambda: F.adjust_brightness(image, brightness_factor=1.0 + magnitude),
        "Color": lambda: F.adjust_saturation(image, saturation_factor=1.0 + magnitude),
        "Contrast": lambda: F.adjust_contrast(image, contrast_factor=1.0 + magnitude),
        "Sharpness": lambda: F.adjust_sharpness(image, sharpness_factor=1.0 + magnitude),
        "Posterize": lambda: F.posterize(image, bits=int(magnitude)),
        "Solarize": lambda: F.solarize(image, threshold=255 * magnitude),  # the uint8 bound times the magnitude
        "AutoContrast": lambda: F.autocontrast(image),
        "Equalize": lambda: F.equalize(image),
        "Invert": lambda: F.invert(image),
    }
    return kernels[name]()



# Operations whose parameter a batched kernel takes per sample (ops/batched.py): one call per operation
# drawn, whatever the magnitudes; shear, translate and rotate together take one matrix per sample.
_PER_SAMPLE_MAGNITUDE = {
    "Brightness": ("adjust_brightness", lambda m: 1.0 + m), "Color": ("adjust_saturation", lambda m: 1.0 + m),
    "Contrast": ("adjust_contrast", lambda m: 1.0 + m), "Sharpness": ("adjust_sharpness", lambda m: 1.0 + m),
    "Posterize": ("posterize", int), "Solarize": ("solarize", lambda m: 255 * m),
}
_NO_MAGNITUDE = frozenset({"AutoContrast", "Equalize", "Invert"})
_AFFINE = frozenset({"ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"})


def _inverse_matrix(operation: PolicyOperation, height: int, width: int) -> list[float]:
    """The inverse affine matrix torchvision's ``affine_image``/``rotate_image`` builds for ``operation``
    (as :func:`apply_operation` calls them), from the same private helper with the same arguments."""
    from torchvision.transforms.v2.functional._geometry import _get_inverse_affine_matrix

    name, magnitude = operation.name, operation.magnitude
    if name == "Rotate":  # rotate_image: -angle about the centre, no expand
        return _get_inverse_affine_matrix([0.0, 0.0], -(magnitude % 360), [0.0, 0.0], 1.0, [0.0, 0.0])
    if name in ("ShearX", "ShearY"):  # affine_image about the top-left corner: centre [0, 0] in pixels
        shear = math.degrees(math.atan(magnitude))
        return _get_inverse_affine_matrix([-width * 0.5, -height * 0.5], 0.0, [0.0, 0.0], 1.0,
                                          [shear, 0.0] if name == "ShearX" else [0.0, shear])
    shift = [float(int(magnitude)), 0.0] if name == "TranslateX" else [0.0, float(int(magnitude))]
    return _get_inverse_affine_matrix([0.0, 0.0], 0.0, shift, 1.0, [0.0, 0.0])


def _rotates_by_copy(operation: PolicyOperation, height: int, width: int) -> bool:
    """Whether torchvision's ``rotate_image`` takes a fast path (a copy or ``rot90``) for it."""
    angle = operation.magnitude % 360
    return operation.name == "Rotate" and (angle in (0, 180) or (height == width and angle in (90, 270)))


def affine_operations(images: Any, operations: list[PolicyOperation], interpolation: str, fill: Any) -> Any:
    """Shear, translate and rotate on a batch with a matrix per sample: torchvision's grid (its
    ``_affine_grid`` arithmetic, the batch's matrices in one ``bmm``) and ``_apply_grid_transform``."""
    import torch
    from torchvision.transforms.v2.functional._geometry import _apply_grid_transform

    def on_device(values: list) -> Any:  # built on the host, one copy per call to a GPU's batch
        host = torch.tensor(values, dtype=torch.float32)
        return host if images.device.type == "cpu" else host.to(images.device, non_blocking=True)

    height, width = images.shape[-2:]
    theta = on_device([_inverse_matrix(op, height, width) for op in operations]).reshape(-1, 2, 3)
    base = torch.empty(1, height, width, 3, dtype=torch.float32, device=images.device)
    base[..., 0].copy_(torch.linspace((1.0 - width) * 0.5, (width - 1.0) * 0.5, steps=width, device=images.device))
    base[..., 1].copy_(torch.linspace((1.0 - height) * 0.5, (height - 1.0) * 0.5, steps=height,
                                      device=images.device).unsqueeze_(-1))
    base[..., 2].fill_(1)
    rescaled = theta.transpose(1, 2).div_(on_device([0.5 * width, 0.5 * height]))
    grid = base.view(1, height * width, 3).expand(len(operations), -1, -1).bmm(rescaled)
    return _apply_grid_transform(images, grid.view(-1, height, width, 2), interpolation, fill=fill)


def apply_operations(images: Any, operations: list[PolicyOperation | None], interpolation: str, fill: Any) -> Any:
    """:func:`apply_operation` on a batch (N x C x H x W uint8): sample n gets ``operations[n]`` (None:
    kept). Samples are grouped by operation — and by magnitude where the kernel takes one magnitude —
    and each group runs in one call; the pixels are the per-sample kernel's."""
    from . import batched

    groups: dict[Any, list[int]] = {}
    for row, operation in enumerate(operations):
        if operation is None or operation.name == "Identity":
            continue
        name = operation.name
        if _rotates_by_copy(operation, *images.shape[-2:]):  # torchvision's own kernel, once per angle
            key: Any = (name, operation.magnitude)
        else:
            key = "affine" if name in _AFFINE else name
        groups.setdefault(key, []).append(row)

    def kernel(key: Any, group: Any, rows: list[int]) -> Any:
        if isinstance(key, tuple) or key in _NO_MAGNITUDE:  # one call of torchvision's own kernel on the stack
            return apply_operation(group, operations[rows[0]], interpolation, fill)
        if key == "affine":
            return affine_operations(group, [operations[row] for row in rows], interpolation, fill)
        function, parameter = _PER_SAMPLE_MAGNITUDE[key]
        return getattr(batched, function)(group, [parameter(operations[row].magnitude) for row in rows])

    return batched.by_group(images, groups, kernel)
