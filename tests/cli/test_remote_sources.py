"""Every command with a source at a URL of each scheme — s3:// (moto), gs:// (the GCS emulator),
http:// (Python's server), all on 127.0.0.1: shards, Parquet files and a file list are read
through the store, checked by ``validate`` as the loader reads them, and never taken for a local
path (no "folder s3:" or "s3:/bucket" anywhere)."""
from __future__ import annotations

import json
import re

import pytest

from dali_bridge.cli.main import main
from dali_bridge.cli.options import EXIT_INVALID
from dali_bridge.data.storage.store import ObjectStore
from tests.helpers import gcs_fixtures, remote_sources, s3_fixtures
from tests.helpers.paths import TRAIN
from tests.helpers.remote_sources import FILE_LIST, SHARDS, remote_source, tree_for, unreachable

# The loopback stores' fixtures, used by name.
moto_endpoint = s3_fixtures.moto_endpoint
gcs_endpoint, loopback_only = gcs_fixtures.gcs_endpoint, gcs_fixtures.loopback_only
local_tree, http_tree, s3_tree, gs_tree = (remote_sources.local_tree, remote_sources.http_tree,
                                           remote_sources.s3_tree, remote_sources.gs_tree)

# The GCS emulator is a process of its own: its scheme runs with the slow lane.
SCHEMES = [pytest.param("http"), pytest.param("s3"), pytest.param("gs", marks=pytest.mark.slow)]
KINDS = ("shards", "parquet", "file_list")


@pytest.fixture(params=SCHEMES)
def tree(request: pytest.FixtureRequest, tmp_path, monkeypatch) -> str:
    """The base URL of the source tree in one scheme's loopback store."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))   # shard listings: never the user's ~/.cache
    return tree_for(request, request.param)


def small(source: dict, base=TRAIN, write=None, **extra):
    """A pipeline over ``source``: batches of 5 at 24 pixels, one worker."""
    return write(base, source=source, batch_size=5, ops__0__random_resized_crop__size=24, loader__workers=1, **extra)


def assert_no_url_made_a_path(text: str) -> None:
    assert not re.search(r"(folder|file) (s3|gs|https?):|(s3|gs|https?):/[^/]", text), text


def test_validate_checks_each_kind_of_source_at_a_url_through_the_store(tree, write_pipeline, capsys):
    for kind in KINDS:
        path = small(remote_source(kind, tree), write=write_pipeline)
        assert main(["validate", str(path)]) == 0, capsys.readouterr().err
        assert f"{path}: ok" in capsys.readouterr().out


def _line_of(path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), start=1) if text in line)


def test_validate_names_what_is_missing_at_a_url_at_its_key(tree, write_pipeline, capsys):
    missing = {
        "shards": ({"type": "webdataset", "shards": f"{tree}/shards/train-{{000000..000005}}.tar"},
                   "shards:", "2 of 6 shard(s) do not exist; the first: "),
        "parquet": ({"type": "parquet", "files": f"{tree}/parquet/train-{{00000..00002}}.parquet"},
                    "files:", f"{tree}/parquet/train-00002.parquet does not exist"),
        "file_list": ({"type": "file_list", "file_list": f"{tree}/images/lists.txt"},
                      "file_list:", f"{tree}/images/lists.txt does not exist"),
        "manifest": ({"type": "webdataset", "shards": f"{tree}/{SHARDS}", "manifest": f"{tree}/shards/x.json"},
                     "manifest:", f"{tree}/shards/x.json does not exist"),
    }
    for source, key, said in missing.values():
        path = small(source, write=write_pipeline)
        assert main(["validate", str(path)]) == EXIT_INVALID
        err = capsys.readouterr().err
        assert f"{path}:{_line_of(path, key)}:" in err and said in err, err
        assert "--no-source-check makes a missing source a warning" in err
        assert_no_url_made_a_path(err)


def test_validate_says_what_to_check_when_the_store_does_not_answer_and_no_source_check_asks_nothing(
        tree, write_pipeline, capsys, monkeypatch):
    scheme = tree.split("://")[0]
    where, options = unreachable(scheme, s3_fixtures.free_port())
    path = small({"type": "webdataset", "shards": f"{where}/{SHARDS}", "storage_options": options, "timeout": 1},
                 write=write_pipeline)
    assert main(["validate", str(path)]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert "4 of 4 shard(s) cannot be listed" in err and "within source.timeout (1 s)" in err
    advice = {"s3": ("AWS_ENDPOINT_URL", "region", "credentials"), "gs": ("STORAGE_EMULATOR_HOST", "credentials"),
              "http": ("server in the URL is up",)}[scheme]
    assert all(word in err for word in advice), err
    assert_no_url_made_a_path(err)

    def no_request(*args, **kwargs):
        raise AssertionError("validate --no-source-check made a request")

    for method in ("listed", "info", "get", "fetch", "glob"):
        monkeypatch.setattr(ObjectStore, method, no_request)
    for kind in KINDS:
        away = small(remote_source(kind, where, storage_options=options, timeout=1), write=write_pipeline)
        assert main(["validate", "--no-source-check", str(away)]) == 0
        assert capsys.readouterr().err == ""


def test_show_prints_each_url_as_written(tree, write_pipeline, capsys):
    for kind in KINDS:
        source = remote_source(kind, tree)
        assert main(["show", str(small(source, write=write_pipeline))]) == 0
        out = capsys.readouterr().out
        location = source.get("shards") or source.get("file_list") or source["files"]
        assert location in out
        assert_no_url_made_a_path(out)
    assert main(["show", "--order", str(small(remote_source("shards", tree), write=write_pipeline))]) == 0
    assert "global shuffle" in capsys.readouterr().out


def test_doctor_says_whether_this_host_reaches_a_source_at_a_url(tree, write_pipeline, capsys):
    reached = [small(remote_source(kind, tree), write=write_pipeline) for kind in KINDS]
    assert main(["doctor", "--json", *map(str, reached)]) == 0
    info = json.loads(capsys.readouterr().out)
    scheme = tree.split("://")[0]
    assert not info["object_storage_clients"][next(k for k in info["object_storage_clients"]
                                                   if f"{scheme}://" in k)].startswith("unavailable")
    for path in reached:
        assert info[f"source of {path}"]["reached"].startswith("yes (listed as the loader lists it"), info
    gone = small({"type": "webdataset", "shards": f"{tree}/shards/train-{{000000..000005}}.tar"}, write=write_pipeline)
    assert main(["doctor", str(gone)]) == EXIT_INVALID
    out = capsys.readouterr().out
    assert "no: source.shards: 2 of 6 shard(s) do not exist" in out
    assert_no_url_made_a_path(out)


def test_convert_packs_a_file_list_and_parquet_files_at_a_url_as_their_local_copies(tree, local_tree, tmp_path,
                                                                                   capsys):
    from dali_bridge.data.sources.webdataset import list_webdataset
    from dali_bridge.spec.model import DEFAULT_IMAGE_KEYS

    local = list_webdataset(str(local_tree / SHARDS), DEFAULT_IMAGE_KEYS)
    for number, source in enumerate((f"{tree}/{FILE_LIST}", f"{tree}/parquet/train-00000.parquet")):
        out = tmp_path / f"out{number}" / "t-%06d.tar"
        assert main(["convert", source, str(out), "-q"]) == 0, capsys.readouterr().err
        manifest = json.loads((out.parent / "t.manifest.json").read_text())
        assert manifest["source"]["path"] == source
        packed = list_webdataset(str(out.parent / "t-{000000..000000}.tar"), DEFAULT_IMAGE_KEYS)
        count = len(packed)
        assert count == (37 if number == 0 else 20)
        assert [packed.read(i) for i in range(count)] == [local.read(i) for i in range(count)]
        assert packed.labels.tolist() == local.labels.tolist()[:count]
    names = [m for m in __import__("tarfile").open(tmp_path / "out0" / "t-000000.tar").getnames()][:2]
    assert names == ["class_000/img_00000.cls", "class_000/img_00000.jpg"]   # keys relative to the list's folder
    assert main(["convert", f"{tree}/images/absent.txt", str(tmp_path / "x" / "t-%06d.tar"), "-q"]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert "absent.txt does not exist" in err
    assert_no_url_made_a_path(err)


def test_verify_checks_shards_at_a_url_and_names_a_missing_manifest_as_a_url(tree, capsys):
    assert main(["verify", "-q", f"{tree}/{SHARDS}"]) == 0
    assert "every shard matches its recorded size and sha256" in capsys.readouterr().out
    assert main(["verify", "-q", f"{tree}/nowhere/train-{{000000..000001}}.tar"]) != 0
    captured = capsys.readouterr()
    assert f"{tree}/nowhere/train.manifest.json" in captured.out + captured.err
    assert_no_url_made_a_path(captured.out + captured.err)


@pytest.mark.slow
def test_run_reads_each_kind_of_source_at_a_url(tree, write_pipeline, capsys):
    for kind in KINDS:
        path = small(remote_source(kind, tree), write=write_pipeline)
        assert main(["run", str(path), "--backends", "torchvision", "-q", "--json", str(path) + ".json"]) == 0
        row = json.loads(open(str(path) + ".json").read())[0]
        assert row["images"] == 37 and row["skipped"] == 0, row


def test_data_at_a_url_stays_a_url_and_is_refused_as_a_folder_with_what_to_use(http_tree, write_pipeline, capsys):
    path = small(remote_source("shards", http_tree), write=write_pipeline)
    assert main(["show", str(path), "--data", f"{http_tree}/images"]) == EXIT_INVALID
    err = capsys.readouterr().err
    assert f"a folder source reads a local folder, not {http_tree}/images" in err and "file_list" in err
    assert_no_url_made_a_path(err)


@pytest.mark.slow
def test_compare_runs_two_backends_on_a_source_at_a_url(tree, write_pipeline, capsys):
    from tests.helpers.backends import CPU_BACKENDS

    path = small(remote_source("file_list", tree), write=write_pipeline)
    assert main(["compare", str(path), "--backends", ",".join(CPU_BACKENDS), "--batches", "2", "-q"]) == 0
    out = capsys.readouterr().out
    assert f"{tree}/images/class_" in out and "PASS" in out
    assert_no_url_made_a_path(out)


@pytest.mark.slow
def test_bench_measures_a_source_at_a_url(tree, write_pipeline, capsys, tmp_path):
    path = small(remote_source("parquet", tree), write=write_pipeline)
    report = tmp_path / "bench.json"
    assert main(["bench", str(path), "--backends", "torchvision", "--baselines", "ceiling", "--batches", "1",
                 "--warmup", "1", "--repeat", "1", "-q", "--json", str(report)]) == 0, capsys.readouterr().err
    rows = json.loads(report.read_text())["results"]
    assert len(rows) == 2 and not any("error" in row for row in rows), rows
