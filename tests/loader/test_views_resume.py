"""The loader's resume guarantees with views: a state saved mid-epoch continues with the next batch's
every view, pixel for pixel; ranks stopped mid-epoch continue on another world size, each sample once
with its views; two torchrun ranks share an epoch of views."""
from __future__ import annotations

import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from dali_bridge import build_loader
from tests.helpers.backends import backend_params
from tests.helpers.processes import torchrun

SAMPLES, BATCH = 11, 3


def pipeline(root: str | Path, last_batch: str = "partial", workers: int = 0) -> dict:
    return {"version": 1, "name": "views-resume", "source": {"type": "folder", "root": str(root)},
            "batch_size": BATCH, "seed": 7,
            "views": {"global": {"count": 2, "ops": [{"random_resized_crop": {"size": 16}}, "horizontal_flip",
                                                     {"normalize": {"dtype": "uint8"}}],
                                 "per_view": [{}, {"horizontal_flip": {"probability": 0.1}}]},
                      "local": {"count": 2, "ops": [{"random_resized_crop": {"size": 8, "scale": [0.05, 0.4]}},
                                                    {"normalize": {"dtype": "uint8"}}]}},
            "outputs": ["views", "label", "index", "valid"],
            "loader": {"workers": workers, "last_batch": last_batch}}


def rows(batch) -> list[tuple[int, bool, str]]:
    """(index, valid, digest of every view's pixels) of each row."""
    views, _, index, valid = batch
    digests = [hashlib.sha256(b"".join(view[row].contiguous().numpy().tobytes() for view in views)).hexdigest()
               for row in range(len(index))]
    return list(zip(index.tolist(), valid.tolist(), digests))


def kept(batches) -> Counter:
    return Counter((i, digest) for batch in batches for i, ok, digest in batch if ok)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    from tests.helpers.hostile import write_image_folder

    folder = tmp_path_factory.mktemp("views-resume")
    write_image_folder(folder, classes=1, per_class=SAMPLES)
    return folder


@pytest.mark.parametrize("backend", backend_params(["torchvision", "dali-cpu"]))
def test_a_state_saved_mid_epoch_resumes_with_the_next_batchs_views(root, backend):
    with build_loader(pipeline(root), backend) as whole:
        expected = [rows(batch) for batch in whole]
    with build_loader(pipeline(root), backend) as first:
        iterator = iter(first)
        taken = [rows(next(iterator)) for _ in range(2)]
        state = first.state_dict()
    with build_loader(pipeline(root), backend) as resumed:
        resumed.load_state_dict(state)
        assert (len(resumed), resumed.batches_done) == (len(expected), 2)
        rest = [rows(batch) for batch in resumed]
    assert taken + rest == expected


@pytest.mark.parametrize("last_batch", ["partial", "pad"])
@pytest.mark.parametrize("new_world", [1, 3])
def test_ranks_stopped_mid_epoch_continue_on_another_world_size_each_sample_once_with_its_views(
        root, last_batch, new_world):
    with build_loader(pipeline(root), "torchvision") as single:
        everything = kept(rows(batch) for batch in single)
    states, seen = [], Counter()
    for rank in range(2):
        with build_loader(pipeline(root, last_batch), "torchvision", rank=rank, world_size=2) as loader:
            iterator = iter(loader)
            seen += kept([rows(next(iterator))])
            states.append(loader.state_dict())
    assert states[0] == states[1]
    for rank in range(new_world):
        with build_loader(pipeline(root, last_batch), "torchvision", rank=rank, world_size=new_world) as loader:
            loader.load_state_dict(states[0])
            seen += kept(rows(batch) for batch in loader)
    assert seen == everything


@pytest.mark.slow  # starts torchrun ranks
@pytest.mark.parametrize("backend", backend_params(["torchvision", "dali-cpu"]))
def test_two_torchrun_ranks_share_an_epoch_of_views(root, tmp_path, backend):
    torchrun(Path(__file__).resolve(), backend, str(root), str(tmp_path), nproc=2)
    reports = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    assert [report["len"] for report in reports] == [2, 2]   # pad: the same len() on both ranks
    union = Counter((i, digest) for report in reports for i, ok, digest in report["rows"] if ok)
    with build_loader(pipeline(root), backend) as single:
        assert union == kept(rows(batch) for batch in single)


def rank_main(backend: str, root: str, out: str) -> None:
    """What each torchrun rank runs: an epoch of views under pad, its rows written to rank<N>.json."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    with build_loader(pipeline(root, "pad", workers=1), backend) as loader:
        found = [row for batch in loader for row in rows(batch)]
        report = {"len": len(loader), "rows": found}
    dist.barrier()
    Path(out, f"rank{dist.get_rank()}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":  # a torchrun rank: backend root out
    rank_main(sys.argv[1], sys.argv[2], sys.argv[3])
