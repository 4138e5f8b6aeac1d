"""Repeated augmentation under torchrun: 2 ranks, ``loader.repeated_augmentations: 3``.

As tests/loader/test_distributed.py does, the test launches ``python -m torch.distributed.run
--standalone --nproc_per_node=2`` on this very file; each rank joins a gloo process group, builds
the loader with no rank arguments, runs one epoch and writes each sample index it yielded with a
digest of its pixels to ``rank<N>.json``. The parent checks that over the ranks every sample came
exactly 3 times, with 3 different augmentations, and that each sample's repeats went to both ranks.
"""
from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers.backends import backend_params
from tests.helpers.processes import torchrun

pytestmark = pytest.mark.slow  # starts torchrun ranks

SAMPLES = 13
BATCH = 4
WORLD = 2
REPEATS = 3


def pipeline(root: str) -> dict:
    return {"version": 1, "name": "ddp-repeated", "source": {"type": "folder", "root": root},
            "batch_size": BATCH, "seed": 11,
            "ops": [{"random_resized_crop": {"size": 16}}, {"horizontal_flip": {}}, {"normalize": {"dtype": "uint8"}}],
            "outputs": ["image", "index", "valid"],
            "loader": {"workers": 1, "repeated_augmentations": REPEATS}}


def rank_main(backend: str, root: str, out: str) -> None:
    """What each torchrun rank runs."""
    import torch.distributed as dist

    from dali_bridge import build_loader

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with build_loader(pipeline(root), backend) as loader:
        planned, seen = len(loader), []
        for image, index, valid in loader:
            for picture, i, ok in zip(image, index.tolist(), valid.tolist()):
                seen.append([i, ok, hashlib.sha256(picture.contiguous().numpy().tobytes()).hexdigest()])
    counts: list = [None] * dist.get_world_size()
    dist.all_gather_object(counts, len(seen))
    Path(out, f"rank{rank}.json").write_text(json.dumps({"len": planned, "seen": seen, "counts": counts}))
    dist.destroy_process_group()


def launch(backend: str, root: Path, out: Path) -> None:
    torchrun(Path(__file__).resolve(), backend, str(root), str(out), nproc=WORLD)


@pytest.fixture(scope="module")
def ddp_root(tmp_path_factory) -> Path:
    from tests.helpers.hostile import write_image_folder

    root = tmp_path_factory.mktemp("ddp-repeated")
    write_image_folder(root, classes=1, per_class=SAMPLES)
    return root


@pytest.mark.parametrize("backend", backend_params(["dali-cpu", "torchvision"]))
def test_torchrun_two_ranks_yield_every_sample_three_times_with_three_augmentations(ddp_root, tmp_path, backend):
    launch(backend, ddp_root, tmp_path)
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(WORLD)]
    # 13 x 3 = 39 entries dealt over 2 ranks: 20 and 19 samples, 5 batches each
    assert [r["len"] for r in reports] == [5, 5] and reports[0]["counts"] == [20, 19]
    copies: dict[int, list[str]] = {}
    ranks_of: dict[int, set[int]] = {}
    for rank, report in enumerate(reports):
        for index, valid, digest in report["seen"]:
            assert valid
            copies.setdefault(index, []).append(digest)
            ranks_of.setdefault(index, set()).add(rank)
    assert Counter({i: len(d) for i, d in copies.items()}) == Counter({i: REPEATS for i in range(SAMPLES)})
    assert all(len(set(digests)) == REPEATS for digests in copies.values())  # 3 different augmentations
    assert all(ranks == {0, 1} for ranks in ranks_of.values())  # a sample's repeats spread over the ranks


if __name__ == "__main__":  # a torchrun rank: backend root out
    rank_main(sys.argv[1], sys.argv[2], sys.argv[3])
