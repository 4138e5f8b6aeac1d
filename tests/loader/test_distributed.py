"""Multi-process training with torchrun: the distributed engine is torch.distributed.

The test launches ``python -m torch.distributed.run --standalone --nproc_per_node=2`` on this very
file; each rank joins a gloo process group, builds the loader with no rank arguments (it reads
rank and world size from torch.distributed), iterates, and writes the indices it yielded per epoch
to ``rank<N>.json``. The parent then checks coverage across ranks. CPU only (gloo); the ``dali``
backend would need one GPU per rank.
"""
from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers.backends import backend_params
from tests.helpers.processes import torchrun

pytestmark = pytest.mark.slow  # starts torchrun ranks

SAMPLES = 13      # odd, and not a multiple of world x batch: partial, pad and drop all differ
BATCH = 3
WORLD = 2


def pipeline(root: str, last_batch: str, workers: int) -> dict:
    return {"version": 1, "name": f"ddp-{last_batch}", "source": {"type": "folder", "root": root},
            "batch_size": BATCH, "seed": 11,
            "ops": [{"random_resized_crop": {"size": 16}}, {"horizontal_flip": {}}, {"normalize": {"dtype": "uint8"}}],
            "outputs": ["image", "label", "index", "valid"],
            "loader": {"workers": workers, "last_batch": last_batch}}


def rank_main(backend: str, root: str, out: str, workers: int) -> None:
    """What each torchrun rank runs."""
    import torch.distributed as dist

    from dali_bridge import build_loader

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    report: dict = {"rank": rank, "world": world, "env_rank": int(os.environ["RANK"])}
    for last_batch, epochs in (("partial", 2), ("pad", 1), ("drop", 1)):
        loader = build_loader(pipeline(root, last_batch, workers), backend)
        report.setdefault("loader_rank", []).append([loader.rank, loader.world_size])
        runs = []
        for _ in range(epochs):
            planned = len(loader)
            batches = [{"index": index.tolist(), "valid": valid.tolist(), "shape": list(image.shape)}
                       for image, _, index, valid in loader]
            counts: list = [None] * world
            dist.all_gather_object(counts, len(batches))  # a collective per epoch, as a training step has
            runs.append({"len": planned, "batches": batches, "all_counts": counts})
        report[last_batch] = runs
        loader.close()
    dist.barrier()
    Path(out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


def launch(backend: str, root: Path, out: Path, workers: int) -> None:
    torchrun(Path(__file__).resolve(), backend, str(root), str(out), str(workers), nproc=WORLD)


@pytest.fixture(scope="module")
def ddp_root(tmp_path_factory) -> Path:
    from tests.helpers.hostile import write_image_folder

    root = tmp_path_factory.mktemp("ddp")
    write_image_folder(root, classes=1, per_class=SAMPLES)
    return root


@pytest.mark.parametrize("backend", backend_params(["dali-cpu", "torchvision"]))
def test_torchrun_two_ranks_cover_every_sample_once_and_agree_on_len(ddp_root, tmp_path, backend):
    from dali_bridge.pipeline.sampling import epoch_order

    launch(backend, ddp_root, tmp_path, workers=1)
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(WORLD)]
    for rank, report in enumerate(reports):
        assert (report["rank"], report["world"], report["env_rank"]) == (rank, WORLD, rank)
        assert report["loader_rank"] == [[rank, WORLD]] * 3  # taken from torch.distributed, not arguments

    # partial: each epoch, the ranks' indices together are every sample exactly once
    orders = []
    for epoch in range(2):
        union: Counter = Counter()
        for rank, report in enumerate(reports):
            run = report["partial"][epoch]
            indices = [i for batch in run["batches"] for i in batch["index"]]
            assert indices == epoch_order(SAMPLES, 11, epoch)[rank::WORLD].tolist()
            assert len(run["batches"]) == run["len"] == [3, 2][rank]
            union.update(indices)
        assert union == Counter(range(SAMPLES))
        orders.append([i for report in reports for b in report["partial"][epoch]["batches"] for i in b["index"]])
    assert orders[0] != orders[1] and sorted(orders[0]) == sorted(orders[1])  # new order, same coverage

    # pad: equal len on every rank, full batches, the valid samples cover everything once
    valid_union: Counter = Counter()
    for report in reports:
        (run,) = report["pad"]
        assert run["len"] == len(run["batches"]) == 3 and run["all_counts"] == [3, 3]
        assert all(batch["shape"][0] == BATCH for batch in run["batches"])
        valid_union.update(i for b in run["batches"] for i, ok in zip(b["index"], b["valid"]) if ok)
    assert valid_union == Counter(range(SAMPLES))
    assert sum(not ok for r in reports for b in r["pad"][0]["batches"] for ok in b["valid"]) == WORLD * 9 - SAMPLES

    # drop: equal len on every rank, full batches only, no sample on two ranks
    dropped: Counter = Counter()
    for report in reports:
        (run,) = report["drop"]
        assert run["len"] == len(run["batches"]) == 2 and run["all_counts"] == [2, 2]
        assert all(batch["shape"][0] == BATCH for batch in run["batches"])
        dropped.update(i for b in run["batches"] for i in b["index"])
    assert len(dropped) == 12 and max(dropped.values()) == 1


if __name__ == "__main__":  # a torchrun rank: backend root out workers
    rank_main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
