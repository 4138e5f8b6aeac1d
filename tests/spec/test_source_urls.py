"""What a source location at a URL may be in a pipeline file: kept as written (never resolved against
the file's folder), refused where only a local path makes sense, and given the storage keys
wherever the samples are read through a store."""
from __future__ import annotations

import pytest

from dali_bridge.spec.pipeline import load_spec, spec_from_dict
from dali_bridge.spec.problems import SpecError


def spec(source: dict, tmp_path, check_sources: bool = False):
    return spec_from_dict({"version": 1, "batch_size": 2, "ops": [{"center_crop": 8}], "source": source},
                          base_dir=tmp_path, check_sources=check_sources)


@pytest.mark.parametrize("source", [
    {"type": "webdataset", "shards": "s3://b/x/s-{000000..000001}.tar", "manifest": "s3://b/x/s.manifest.json"},
    {"type": "parquet", "files": "gs://b/hf/train-*.parquet"},
    {"type": "file_list", "file_list": "https://host/lists/train.txt"},
    {"type": "file_list", "file_list": "train.txt", "root": "s3://b/images"},
])
def test_a_location_at_a_url_is_kept_as_written_and_never_checked_as_a_local_path(source, tmp_path):
    if source.get("file_list") == "train.txt":
        (tmp_path / "train.txt").write_text("a.jpg 0\n")
    checked = spec({**source, "timeout": 5, "max_requests": 8}, tmp_path, check_sources=True).source
    for key in ("shards", "manifest", "file_list", "root"):
        if isinstance(source.get(key), str) and "://" in source[key]:
            assert getattr(checked, key) == source[key]
    assert checked.timeout == 5 and checked.max_requests == 8
    assert spec(dict(spec(source, tmp_path).to_dict()["source"]), tmp_path).source == spec(source, tmp_path).source


def test_a_file_list_and_parquet_files_at_a_url_take_the_node_cache_and_a_local_one_takes_no_storage_key(tmp_path):
    cached = spec({"type": "file_list", "file_list": "s3://b/train.txt", "cache": {"dir": "c", "max_bytes": "1GB"}},
                  tmp_path).source
    assert cached.cache_dir == str(tmp_path / "c") and cached.cache_max_bytes == 10 ** 9
    assert spec({"type": "parquet", "files": "s3://b/t.parquet", "cache": {"dir": "c", "max_bytes": 10}},
                tmp_path).source.cache_dir == str(tmp_path / "c")
    with pytest.raises(SpecError, match="'timeout' applies to a source at a URL.*source.file_list and source.root "
                                        "are local"):
        spec({"type": "file_list", "file_list": "train.txt", "timeout": 3}, tmp_path)


@pytest.mark.parametrize("source, said", [
    ({"type": "folder", "root": "s3://b/images"}, "source.root: a folder source reads a local folder, not s3://b/images"),
    ({"type": "webdataset", "shards": "s3://b/s-{0..1}.tar", "manifest": "m.json"},
     "source.manifest: expected the manifest where the shards are: the shards are at s3://, the manifest a local path"),
    ({"type": "webdataset", "shards": "s3://b/s-{0..1}.tar", "cache": {"dir": "s3://b/cache", "max_bytes": 10}},
     "source.cache.dir: expected a folder on this node's disk"),
])
def test_a_url_where_only_a_local_path_can_be_is_a_problem_naming_it(source, said, tmp_path):
    with pytest.raises(SpecError) as caught:
        spec(source, tmp_path)
    assert said in str(caught.value)


def test_load_spec_with_source_checks_reads_no_url_as_a_path(tmp_path):
    path = tmp_path / "remote.yaml"
    path.write_text("version: 1\nbatch_size: 2\nops: [{center_crop: 8}]\n"
                    "source: {type: webdataset, shards: 's3://bucket/x/s-{000000..000001}.tar'}\n")
    assert load_spec(path, check_sources=True).source.shards == "s3://bucket/x/s-{000000..000001}.tar"
