"""Shards served by nginx (the light HTTP server of benchmarks/object_storage.py, started by
tests/helpers/nginx_fixtures.py): the loader reads them with one ranged GET per sample and gives
the local shards' batches; the delayed server the benchmark uses serves the same bytes, later.
Skipped, with the reason, where nginx (or its echo module) is not installed."""
from __future__ import annotations

import shutil
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.backends import CPU_BACKENDS
from tests.helpers.paths import TRAIN
from tests.helpers import nginx_fixtures, object_storage
from tests.helpers.nginx_fixtures import Nginx, missing_reason
from tests.helpers.object_storage import SHARDS, assert_same_batches, batches, local_batches, overrides
from dali_bridge import build_loader

# fixtures, used by name
nginx_folder, local_shards = nginx_fixtures.nginx_folder, object_storage.local_shards
private_listing_cache = object_storage.private_listing_cache

pytestmark = pytest.mark.slow  # an nginx process and whole epochs


def _serve_copy(local_shards: Path, root: Path) -> None:
    for path in local_shards.iterdir():
        shutil.copy2(path, root / path.name)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_nginx_serves_ranged_reads_that_give_the_local_shards_batches(backend, local_shards, nginx_folder):
    root, nginx = nginx_folder
    _serve_copy(local_shards, root)
    remote = batches(build_loader(TRAIN, backend, overrides=overrides(f"{nginx.base}/{SHARDS}")))
    assert_same_batches(remote, local_batches(local_shards, backend))
    # Every one of the 37 samples was its own ranged GET of the shard (206), none a whole shard.
    sample_reads = [line for line in nginx.requests() if line.startswith("GET 206 \"bytes=") and ".tar" in line]
    assert len(sample_reads) >= 37, nginx.requests()
    assert not [line for line in nginx.requests() if line.startswith("GET 200") and line.endswith(".tar")]


def test_the_delayed_nginx_answers_each_request_after_its_delay_with_the_same_ranged_bytes(local_shards,
                                                                                           tmp_path):
    reason = missing_reason(delay=True)
    if reason:
        pytest.skip(reason)
    _serve_copy(local_shards, tmp_path)
    shard = tmp_path / "train-000001.tar"
    nginx = Nginx(tmp_path, delay_s=0.25)
    try:
        started = time.monotonic()
        request = urllib.request.Request(f"{nginx.base}/{shard.name}", headers={"Range": "bytes=1000-1999"})
        with urllib.request.urlopen(request, timeout=30) as answer:
            status, body = answer.status, answer.read()
        waited = time.monotonic() - started
        loader = build_loader(TRAIN, "torchvision", overrides=overrides(f"{nginx.base}/{SHARDS}"))
        remote = batches(loader)
    finally:
        nginx.stop()
    assert status == 206 and body == shard.read_bytes()[1000:2000]
    assert waited >= 0.25   # a lower bound only: the timer ran before the file was served
    assert_same_batches(remote, local_batches(local_shards, "torchvision"))
