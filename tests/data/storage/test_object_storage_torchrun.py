"""Two torchrun ranks on s3:// shards with ``loader.shuffle: shards``: each rank checkpoints its
loader state after every batch and is killed (SIGKILL) after its second; a second launch resumes
from the checkpoints. Together the runs yield every sample exactly once, in the uninterrupted
order. The S3 server (moto) runs in the test process on 127.0.0.1; the ranks reach it through
``AWS_ENDPOINT_URL``."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import s3_fixtures
from tests.helpers.backends import backend_params
from tests.helpers.paths import REPO
from tests.helpers.s3_fixtures import upload_folder

moto_endpoint = s3_fixtures.moto_endpoint  # the loopback S3 server's fixture, used by name below

WORLD = 2
KILLED_AFTER = 2  # batches each rank yields before it is killed


def pipeline(shards: str) -> dict:
    return {"version": 1, "name": "s3-ddp", "source": {"type": "webdataset", "shards": shards},
            "batch_size": 3, "seed": 5,
            "ops": [{"random_resized_crop": {"size": 16}}, {"normalize": {"dtype": "uint8"}}],
            "outputs": ["image", "label", "index"],
            "loader": {"workers": 1, "shuffle": "shards", "shuffle_window": 2}}


def rank_main(mode: str, backend: str, shards: str, out: str) -> None:
    """What each torchrun rank runs: ``kill`` (checkpoint each batch, die after the second) or ``resume``."""
    import torch.distributed as dist

    from dali_bridge import build_loader

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = build_loader(pipeline(shards), backend)
    checkpoint = Path(out, f"rank{rank}.json")
    if mode == "resume":
        saved = json.loads(checkpoint.read_text())
        loader.load_state_dict(saved["state"])
        rest = [i for _, _, index in loader for i in index.tolist()]
        Path(out, f"rank{rank}-rest.json").write_text(json.dumps(rest))
        loader.close()
        dist.barrier()
        dist.destroy_process_group()
        return
    seen: list[int] = []
    for number, (_, _, index) in enumerate(loader, start=1):
        seen.extend(index.tolist())
        partial = checkpoint.with_suffix(".partial")
        partial.write_text(json.dumps({"state": loader.state_dict(), "seen": seen}))
        os.replace(partial, checkpoint)  # a checkpoint is whole or absent, as a trainer's would be
        if number == KILLED_AFTER:
            # Every rank has checkpointed before any dies: torchrun stops the others when one goes.
            dist.barrier()
            os.kill(os.getpid(), signal.SIGKILL)


def launch(mode: str, backend: str, shards: str, out: Path) -> int:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
               f"--nproc_per_node={WORLD}", str(Path(__file__).resolve()), mode, backend, shards, str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    if mode == "resume":
        assert done.returncode == 0, f"torchrun failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done.returncode


@pytest.mark.slow
# One backend: two torchrun launches cost about a minute on two cores, and the backends' reads
# of S3 shards are compared sample for sample in test_object_storage.py.
@pytest.mark.parametrize("backend", backend_params(["torchvision"]))
def test_two_ranks_on_s3_killed_and_resumed_yield_every_sample_once_in_order(backend, moto_endpoint, sample_root,
                                                                             tmp_path, monkeypatch):
    from dali_bridge.tools.convert import convert
    from dali_bridge.pipeline.sampling import rank_batches
    from dali_bridge.data.shards.order import ShardWindows
    from dali_bridge.data.sources.webdataset import list_webdataset
    from dali_bridge.spec.model import DEFAULT_IMAGE_KEYS
    from dali_bridge.data.storage.store import ObjectStore

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    convert(sample_root, str(tmp_path / "shards" / "train-%06d.tar"), shard_size=5)
    prefix = upload_folder(moto_endpoint, tmp_path / "shards", f"ddp-{backend}", "train")
    shards = f"{prefix}/train-{{000000..000007}}.tar"
    out = tmp_path / "out"
    out.mkdir()
    assert launch("kill", backend, shards, out) != 0  # the ranks were killed
    launch("resume", backend, shards, out)
    listing = list_webdataset(shards, DEFAULT_IMAGE_KEYS, store=ObjectStore("s3"))
    windows = ShardWindows(listing.shards.shard, 2)
    union: list[int] = []
    for rank in range(WORLD):
        expected = [i for task in rank_batches(37, 3, 5, 0, rank, WORLD, "partial", "shards", shards=windows)
                    for i in task.indices.tolist()]
        before = json.loads((out / f"rank{rank}.json").read_text())["seen"]
        after = json.loads((out / f"rank{rank}-rest.json").read_text())
        assert len(before) == KILLED_AFTER * 3
        assert before + after == expected
        union += before + after
    assert sorted(union) == list(range(37))


if __name__ == "__main__":  # a torchrun rank: mode backend shards out
    rank_main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4])
