"""Computes the pinned-output batches in a process of its own, under one stated CPU capability.

torch's CPU kernels dispatch on the CPU's vector features (``ATEN_CPU_CAPABILITY``: default, avx2,
avx512): the torchvision backend's uint8 resize takes another arithmetic path under each, one level
apart on some pixels. A digest is only a promise under one capability, so the digests are pinned
under ``default`` — the path every x86-64 CPU runs — and this worker is started with it set (it must
be set before torch is imported, hence the process of its own).

Usage: ``python pinned_worker.py ROOT OUT_DIR [VARIANT ...]``. Writes ``OUT_DIR/digests.json``
(``{variant: {backend: [digest of each batch]}}``) and the batches as ``OUT_DIR/VARIANT.BACKEND.npz``
so a failing digest can be explained by the pixels that moved. ``--print-pins`` prints the digests
as the test file's table instead (to re-pin after an intended change).
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np

#: The capability the digests hold under; the test starts this worker with it.
CAPABILITY = "default"
BATCH_SIZE = 8
EPOCHS = (0, 1)
BATCHES_PER_EPOCH = 2
DIGEST_HEX = 16  # 64 bits per batch: a collision by chance is not a concern


def batch_key(epoch: int, number: int) -> str:
    return f"epoch {epoch} batch {number}"


def variant_batches(root: Path, name: str, backend: str) -> dict[str, tuple[np.ndarray, ...]]:
    """The first batches of each pinned epoch of a variant: {key: (image, label, index)}."""
    from tests.helpers.pinned_variants import VARIANTS

    from dali_bridge.loader.loader import build_loader
    from dali_bridge.spec.pipeline import coerce_spec

    base, overrides = VARIANTS[name]
    spec = coerce_spec(base, {"source": {"type": "folder", "root": str(root)}, "batch_size": BATCH_SIZE,
                              "outputs": ["image", "label", "index"], "loader.workers": 1, **overrides})
    batches = {}
    with build_loader(spec, backend) as loader:
        for epoch in EPOCHS:
            loader.set_epoch(epoch)
            for number, batch in enumerate(loader):
                batches[batch_key(epoch, number)] = tuple(t.contiguous().cpu().numpy() for t in batch)
                if number + 1 == BATCHES_PER_EPOCH:
                    break
    return batches


def batch_digest(arrays: tuple[np.ndarray, ...]) -> str:
    """sha256 of a batch's tensors (shape, dtype and bytes of image, label, index), truncated."""
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(str((array.shape, array.dtype.str)).encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()[:DIGEST_HEX]


def main(argv: list[str]) -> int:
    from tests.helpers.pinned_variants import BACKENDS, VARIANTS

    print_pins = "--print-pins" in argv
    args = [a for a in argv if a != "--print-pins"]
    root, out = Path(args[0]), Path(args[1])
    out.mkdir(parents=True, exist_ok=True)
    names = args[2:] or list(VARIANTS)
    digests: dict[str, dict[str, list[str]]] = {}
    for name in names:
        for backend in BACKENDS:
            batches = variant_batches(root, name, backend)
            digests.setdefault(name, {})[backend] = [batch_digest(arrays) for arrays in batches.values()]
            np.savez(out / f"{name}.{backend}.npz", **{f"{key}|{part}": array for key, arrays in batches.items()
                                                      for part, array in zip(("image", "label", "index"), arrays)})
    (out / "digests.json").write_text(json.dumps(digests, indent=1))
    if print_pins:
        print(json.dumps(digests, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository: tests.helpers
    sys.exit(main(sys.argv[1:]))
