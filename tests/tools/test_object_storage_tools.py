"""``convert`` to an s3:// pattern and ``verify`` of shards at a URL, against moto on 127.0.0.1."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tests.helpers import s3_fixtures
from dali_bridge.tools.convert import convert, verify_shards
from dali_bridge.tools.convert_staging import ConvertError
from dali_bridge.data.sources.webdataset import list_webdataset
from dali_bridge.spec.model import DEFAULT_IMAGE_KEYS
from dali_bridge.data.storage.store import ObjectStore
from tests.helpers.s3_fixtures import s3_client

moto_endpoint = s3_fixtures.moto_endpoint  # the loopback S3 server's fixture, used by name below


@pytest.fixture
def bucket(moto_endpoint: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    name = "tools-" + request.node.name.split("[")[0].replace("_", "-")[5:40].strip("-")
    s3_client(moto_endpoint).create_bucket(Bucket=name)
    return name


@pytest.mark.slow
def test_convert_to_s3_writes_shards_indexes_and_manifest_that_list_like_local_ones(sample_root, bucket, tmp_path):
    result = convert(sample_root, f"s3://{bucket}/out/train-%06d.tar", shard_size=10)
    assert result.pattern == f"s3://{bucket}/out/train-{{000000..000003}}.tar"
    assert result.manifest == f"s3://{bucket}/out/train.manifest.json"
    keys = {o["Key"] for o in client().list_objects_v2(Bucket=bucket)["Contents"]}
    shards = {f"out/train-00000{n}.{ext}" for n in range(4) for ext in ("tar", "idx")}
    assert keys == shards | {"out/train.manifest.json"}
    local = convert(sample_root, str(tmp_path / "train-%06d.tar"), shard_size=10)
    remote = list_webdataset(result.pattern, DEFAULT_IMAGE_KEYS, store=ObjectStore("s3"))
    here = list_webdataset(local.pattern, DEFAULT_IMAGE_KEYS)
    assert remote.labels.tolist() == here.labels.tolist() and remote.classes == here.classes
    assert [remote.read(i) for i in range(37)] == [here.read(i) for i in range(37)]
    with pytest.raises(ConvertError, match="output exists: s3://.*train-000000.tar"):
        convert(sample_root, f"s3://{bucket}/out/train-%06d.tar", shard_size=10)
    convert(sample_root, f"s3://{bucket}/out/train-%06d.tar", shard_size=10, overwrite=True)


def client():
    return s3_client(os.environ["AWS_ENDPOINT_URL"])  # moto's, set by the moto_endpoint fixture


def test_verify_checks_sizes_and_sha256_of_shards_at_a_url(sample_root, bucket):
    from dali_bridge.cli.main import main

    result = convert(sample_root, f"s3://{bucket}/v/train-%06d.tar", shard_size=10)
    assert verify_shards(result.manifest) == []
    assert main(["verify", result.pattern]) == 0
    s3 = client()
    recorded = json.loads(s3.get_object(Bucket=bucket, Key="v/train.manifest.json")["Body"].read())["shards"]
    body = bytearray(s3.get_object(Bucket=bucket, Key="v/train-000001.tar")["Body"].read())
    body[1000] ^= 0xFF
    s3.put_object(Bucket=bucket, Key="v/train-000001.tar", Body=bytes(body))  # same size, other bytes
    s3.put_object(Bucket=bucket, Key="v/train-000002.tar", Body=b"short")
    s3.delete_object(Bucket=bucket, Key="v/train-000003.tar")
    index = s3.get_object(Bucket=bucket, Key="v/train-000000.idx")["Body"].read()
    s3.put_object(Bucket=bucket, Key="v/train-000000.idx", Body=index.replace(b"jpg", b"png", 1))  # damaged
    problems = verify_shards(result.manifest)
    assert len(problems) == 4
    assert problems[0].startswith(f"s3://{bucket}/v/train-000001.tar: sha256 ")
    assert problems[1] == f"s3://{bucket}/v/train-000002.tar: 5 bytes, the manifest records {recorded[2]['bytes']}"
    assert problems[2] == f"s3://{bucket}/v/train-000003.tar: missing"
    damaged = hashlib.sha256(index.replace(b"jpg", b"png", 1)).hexdigest()
    assert problems[3].startswith(f"s3://{bucket}/v/train-000000.idx: sha256 {damaged} "
                                  f"differs from the manifest's {recorded[0]['index_sha256']}: not the index "
                                  f"s3://{bucket}/v/train.manifest.json records")
    assert main(["verify", result.pattern]) != 0
