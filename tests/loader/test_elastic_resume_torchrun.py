"""Elastic resume under torchrun: 2 ranks take a few batches, are killed, and the job comes back on
1 rank and on 3 ranks.

As tests/loader/test_distributed.py does, the test launches ``python -m torch.distributed.run --standalone``
on this very file. ``stop``: 2 ranks (gloo) build the loader with no rank arguments, take
``KEPT`` batches of epoch 0 under each last-batch policy with ``repeated_augmentations: 2``, write
their states and the rows they yielded, meet at a barrier and SIGKILL themselves. ``resume``: 1 or 3
ranks load rank 0's state, run the rest of epoch 0 and epoch 1 and write what they yielded. The
parent checks the epoch's entries over the old and new ranks together (each once under
``partial``; under ``pad`` each valid once; under ``drop`` none twice), each resumed sample's pixels
against an uninterrupted run's, every rank the same ``len()`` under ``pad`` and ``drop``, and epoch 1
against fresh loaders at the new world size.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers.backends import backend_params
from tests.helpers.processes import torchrun
from tests.helpers.elastic import BATCH, KEPT, image_folder, kept, pipeline, reference, rows, take

POLICIES = ("partial", "drop", "pad")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return image_folder(tmp_path_factory.mktemp("elastic"))


def stop(backend: str, root: str, out: str) -> None:
    """A rank of the first job: KEPT batches of epoch 0 per policy, its states written, then killed."""
    import torch.distributed as dist

    from dali_bridge import build_loader

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loaders = []
    for policy in POLICIES:
        loader = build_loader(pipeline(Path(root), policy, workers=1), backend)
        iterator = iter(loader)
        seen = [rows(next(iterator)) for _ in range(KEPT)]
        Path(out, f"{policy}-rank{rank}.json").write_text(json.dumps({"state": loader.state_dict(), "rows": seen}))
        loaders.append((loader, iterator))   # still iterating when the kill comes
    dist.barrier()
    os.kill(os.getpid(), signal.SIGKILL)


def resume(backend: str, root: str, out: str) -> None:
    """A rank of the job that comes back: rank 0's state of the first job, then the rest and epoch 1."""
    import torch.distributed as dist

    from dali_bridge import build_loader

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    report: dict = {}
    for policy in POLICIES:
        state = json.loads(Path(out, f"{policy}-rank0.json").read_text())["state"]
        with build_loader(pipeline(Path(root), policy), backend) as loader:   # workers 0 here, 1 before
            loader.load_state_dict(state)
            planned = [len(loader), loader.batches_done, loader.batches_remaining]
            rest, following = take(loader), take(loader)
        lengths: list = [None] * world
        dist.all_gather_object(lengths, planned)
        report[policy] = {"planned": planned, "all_planned": lengths, "rest": rest, "next_epoch": following}
    Path(out, f"world{world}-rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


def as_rows(batches: list) -> list[list[tuple]]:
    return [[tuple(row) for row in batch] for batch in batches]


@pytest.mark.slow
@pytest.mark.parametrize("backend", backend_params(["dali-cpu", "torchvision"]))
def test_two_ranks_killed_mid_epoch_resume_on_one_and_on_three_ranks_each_entry_once_with_its_pixels(
        root, tmp_path, backend):
    from dali_bridge import build_loader

    script = Path(__file__).resolve()
    torchrun(script, "stop", backend, str(root), str(tmp_path), nproc=2, killed=True)
    first = {policy: [json.loads((tmp_path / f"{policy}-rank{rank}.json").read_text()) for rank in range(2)]
             for policy in POLICIES}
    for policy, saved in first.items():
        assert saved[0]["state"] == saved[1]["state"], policy    # the same dict on every rank
    everything = reference(root, backend)
    for world in (1, 3):
        torchrun(script, "resume", backend, str(root), str(tmp_path), nproc=world)
        reports = [json.loads((tmp_path / f"world{world}-rank{rank}.json").read_text()) for rank in range(world)]
        for policy in POLICIES:
            case = f"{policy}, 2 ranks then {world}"
            union = sum((kept(as_rows(saved["rows"])) for saved in first[policy]), Counter())
            for rank, report in enumerate(reports):
                run = report[policy]
                length, done, left = run["planned"]
                assert (done, length - done) == (KEPT, left) and len(run["rest"]) == left, case
                assert all(run["rest"]), case          # never an empty batch
                union += kept(as_rows(run["rest"]))
                with build_loader(pipeline(root, policy), backend, rank=rank, world_size=world) as fresh:
                    fresh.set_epoch(1)
                    assert as_rows(run["next_epoch"]) == take(fresh), case   # as if always at this size
            assert max(union.values()) == 1, case
            if policy == "drop":
                assert not union - everything[0], case
            else:
                assert union == everything[0], case   # every entry once, each with its uninterrupted pixels
            if policy != "partial":
                assert len({tuple(p) for p in reports[0][policy]["all_planned"]}) == 1, case
                assert all(len(batch) == BATCH for r in reports for batch in r[policy]["rest"]), case


if __name__ == "__main__":  # a torchrun rank: stop|resume backend root out
    {"stop": stop, "resume": resume}[sys.argv[1]](*sys.argv[2:5])
