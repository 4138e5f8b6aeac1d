"""One tree of sources — WebDataset shards, Parquet files, images with a file list — put in each
loopback store (moto's S3, the GCS emulator, Python's HTTP server), for the tests that read every
kind of source at a URL of every scheme. Everything listens on 127.0.0.1.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from dali_bridge.data.sources.local import list_folder
from dali_bridge.spec.model import DEFAULT_EXTENSIONS
from dali_bridge.tools.convert import convert
from tests.helpers import gcs_fixtures, s3_fixtures

SCHEMES = ("s3", "gs", "http")
SHARDS = "shards/train-{000000..000003}.tar"
PARQUET = "parquet/train-{00000..00001}.parquet"
FILE_LIST = "images/list.txt"


def source_tree(sample_root: Path, out: Path) -> Path:
    """``out`` holding the 37 sample images (``images/<class>/...`` and ``images/list.txt``, paths
    relative to the list), the same as 4 shards of 10 with indexes and a manifest (``shards/``) and
    as two Parquet files of 20 and 17 rows (``parquet/``), all in the folder listing's order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = list_folder(sample_root, DEFAULT_EXTENSIONS)
    images = out / "images"
    lines = []
    for path, label in zip(folder.paths, folder.labels.tolist()):
        relative = os.path.relpath(path, sample_root)
        (images / relative).parent.mkdir(parents=True, exist_ok=True)
        (images / relative).write_bytes(Path(path).read_bytes())
        lines.append(f"{relative} {label}")
    (out / FILE_LIST).write_text("\n".join(lines) + "\n")
    convert(sample_root, str(out / "shards" / "train-%06d.tar"), shard_size=10)
    (out / "parquet").mkdir()
    data = [Path(p).read_bytes() for p in folder.paths]
    labels = folder.labels.tolist()
    for number, rows in enumerate((slice(0, 20), slice(20, 37))):
        table = pa.table({"image": pa.array(data[rows], type=pa.binary()),
                          "label": pa.array(labels[rows], type=pa.int64())})
        pq.write_table(table, out / "parquet" / f"train-{number:05d}.parquet", row_group_size=4)
    return out


def _files(root: Path) -> Iterator[tuple[str, bytes]]:
    for path in sorted(root.rglob("*")):
        if path.is_file():
            yield path.relative_to(root).as_posix(), path.read_bytes()


def upload_s3(endpoint: str, root: Path, bucket: str) -> str:
    client = s3_fixtures.s3_client(endpoint)
    client.create_bucket(Bucket=bucket)
    for key, body in _files(root):
        client.put_object(Bucket=bucket, Key=f"tree/{key}", Body=body)
    return f"s3://{bucket}/tree"


def upload_gcs(endpoint: str, root: Path, bucket: str) -> str:
    fs = gcs_fixtures.gcs_filesystem(endpoint)
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    for key, body in _files(root):
        fs.pipe_file(f"{bucket}/tree/{key}", body)
    return f"gs://{bucket}/tree"


@pytest.fixture(scope="session")
def local_tree(sample_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The source tree on local disk (see :func:`source_tree`)."""
    return source_tree(sample_root, tmp_path_factory.mktemp("tree"))


@pytest.fixture(scope="session")
def http_tree(local_tree: Path) -> Iterator[str]:
    """The source tree served by Python's HTTP server on 127.0.0.1 (Range support): its base URL."""
    server, base = s3_fixtures.serve_folder(local_tree)
    yield base
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def s3_tree(moto_endpoint: str, local_tree: Path) -> str:
    """The source tree in moto's S3 on 127.0.0.1: its base URL."""
    return upload_s3(moto_endpoint, local_tree, "remote-sources")


@pytest.fixture(scope="session")
def gs_tree(gcs_endpoint: str, local_tree: Path) -> str:
    """The source tree in the GCS emulator on 127.0.0.1: its base URL."""
    return upload_gcs(gcs_endpoint, local_tree, "remote-sources")


def tree_for(request: pytest.FixtureRequest, scheme: str) -> str:
    """The base URL of the source tree in ``scheme``'s loopback store (GCS: with every name lookup
    but the loopback one refused)."""
    if scheme == "gs":
        request.getfixturevalue("loopback_only")
    return request.getfixturevalue(f"{scheme}_tree")


def unreachable(scheme: str, port: int) -> tuple[str, dict]:
    """A source location of ``scheme`` and storage options that send its requests to ``port`` on
    127.0.0.1, where nothing listens."""
    if scheme == "http":
        return f"http://127.0.0.1:{port}/tree", {}
    return f"{scheme}://remote-sources/tree", {"endpoint_url": f"http://127.0.0.1:{port}"}


def remote_source(kind: str, base: str, **extra) -> dict:
    """A ``source`` mapping of ``kind`` (``shards``, ``parquet``, ``file_list``) under ``base``."""
    source = {"shards": {"type": "webdataset", "shards": f"{base}/{SHARDS}"},
              "parquet": {"type": "parquet", "files": f"{base}/{PARQUET}"},
              "file_list": {"type": "file_list", "file_list": f"{base}/{FILE_LIST}"}}[kind]
    return {**source, **extra}
