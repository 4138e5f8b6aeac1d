"""Credentials planted in every place a user can put one — a URL's ``user:password@`` (S3's key
and secret, HTTP's basic authentication), a signed URL's query (``X-Amz-Signature``, ``sig=``,
``token=``), the environment (``AWS_*``, an API key, a Google key file) — never reach an output:
every command's printed output and exit message, log records, warnings, exception texts,
``repr``s, ``loader.skipped``, ``loader.listing``, state dicts, ``loader.stats()``, cache file
names and contents. The URL's credentials still reach the storage client. Servers on 127.0.0.1
only: moto (S3), a GCS emulator, HTTP servers (tests/helpers)."""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Callable
from urllib.parse import quote

import pytest

from dali_bridge import build_loader
from dali_bridge.cli.main import main
from dali_bridge.errors import SampleError, SourceError
from tests.helpers import answering_servers, gcs_fixtures, object_storage, s3_fixtures
from tests.helpers.answering_servers import Behaviour
from tests.helpers.backends import CPU_BACKENDS
from tests.helpers.object_storage import SHARDS, assert_same_batches, batches, local_batches, overrides
from tests.helpers.paths import REPO, TRAIN
from tests.helpers.s3_fixtures import PLANTED_KEY_ID, PLANTED_SECRET, upload_folder

pytestmark = pytest.mark.slow  # local S3 and HTTP servers, every command

# The loopback servers' and shards' fixtures, used by name below.
moto_endpoint, fault_proxy = s3_fixtures.moto_endpoint, s3_fixtures.fault_proxy
gcs_endpoint, answering_server = gcs_fixtures.gcs_endpoint, answering_servers.answering_server
local_shards, private_listing_cache = object_storage.local_shards, object_storage.private_listing_cache

URL_KEY, URL_SECRET = "AKIAPLANTEDURLKEY0002", "planted/url+secret-c0ffee"
HTTP_USER, HTTP_PASSWORD = "planted-reader", "planted-http-pw-5ca1ab1e"
SIGNATURE, QUERY_TOKEN = "plantedsig0123456789abcdef", "plantedquerytoken-7e57"
SESSION_TOKEN, API_KEY = "planted-session-token-FwoGZXIv", "sk-planted-api-key-0001"
GOOGLE_KEY = "MIIEvQplantedgoogleprivatekey"
PLANTED = (PLANTED_SECRET, PLANTED_KEY_ID, URL_KEY, URL_SECRET, quote(URL_SECRET, safe=""), "url+secret",
           HTTP_USER, HTTP_PASSWORD, SIGNATURE, QUERY_TOKEN, SESSION_TOKEN, API_KEY, GOOGLE_KEY)
SIGNED_QUERY = f"X-Amz-Signature={SIGNATURE}&sig={SIGNATURE}&token={QUERY_TOKEN}"


def shown_secrets(texts: list[str]) -> list[str]:
    """The planted values found in any of ``texts``."""
    joined = "\n".join(texts)
    return [value for value in PLANTED if value in joined]


@pytest.fixture
def planted_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Secrets in the environment beside the S3 fixture's key id and secret: a session token, an API
    key, and a Google key file (GOOGLE_APPLICATION_CREDENTIALS)."""
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
    monkeypatch.setenv("LABELLING_SERVICE_API_KEY", API_KEY)
    key_file = tmp_path / "google-key.json"
    key_file.write_text(json.dumps({"type": "service_account", "private_key_id": "0" * 20,
                                    "private_key": f"-----BEGIN PRIVATE KEY-----\n{GOOGLE_KEY}\n-----END "
                                                   f"PRIVATE KEY-----\n"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))


@pytest.fixture(scope="module")
def s3_bucket(moto_endpoint: str, local_shards: Path) -> str:
    """The shards uploaded to s3://cred-bucket/train; the URL of their pattern with the planted key
    and secret as its userinfo."""
    upload_folder(moto_endpoint, local_shards, "cred-bucket", "train")
    return f"s3://{URL_KEY}:{quote(URL_SECRET, safe='')}@cred-bucket/train/{SHARDS}"


@pytest.fixture
def http_shards(local_shards: Path, answering_server) -> tuple[str, Behaviour]:
    """The shards behind a server that demands basic authentication; their URL with the planted
    user and password, and the server's record of requests."""
    behaviour = Behaviour(auth=(HTTP_USER, HTTP_PASSWORD))
    base = answering_server(local_shards, behaviour)
    return f"{base.replace('://', f'://{HTTP_USER}:{HTTP_PASSWORD}@')}/{SHARDS}", behaviour


def loader_outputs(loader) -> list[str]:
    """Everything a loader shows of itself: its listing, skips, state, stats and reprs."""
    return [repr(loader.listing.paths), loader.listing.root, repr(loader.listing), loader.listing.describe(),
            repr(loader.skipped), *(item.path + item.reason for item in loader.skipped),
            repr(loader.state_dict()), repr(loader.stats()), repr(loader)]


def our_log(caplog: pytest.LogCaptureFixture) -> str:
    """dali-bridge's log records as they were formatted (the test servers log requests of their own)."""
    return "\n".join(caplog.handler.format(r) for r in caplog.records if r.name.startswith("dali_bridge"))


def cache_contents(*folders: Path) -> list[str]:
    """Every file's name and contents (as text) under ``folders``."""
    return [str(path) + path.read_bytes().decode("utf-8", "replace")
            for folder in folders if folder.exists() for path in folder.rglob("*") if path.is_file()]


# ---- the library: a loader over URLs with credentials


def test_s3_credentials_in_the_url_reach_the_client_and_no_output(s3_bucket, moto_endpoint, fault_proxy,
                                                                  planted_environment, private_listing_cache,
                                                                  tmp_path, caplog, capfd):
    proxy = fault_proxy(moto_endpoint)
    cache = tmp_path / "shard-cache"
    source = {"storage_options": {"endpoint_url": proxy.endpoint}, "timeout": 1.0}
    shown: list[str] = []
    with caplog.at_level(logging.DEBUG, logger="dali_bridge"), warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        loader = build_loader(TRAIN, "torchvision", overrides=overrides(
            s3_bucket, source=source, **{"loader.on_error": "skip", "loader.workers": 0}))
        assert loader.listing.paths[0].startswith("s3://cred-bucket/train/train-000000.tar#")
        client = loader.listing.shards.store._filesystem()
        assert (client.key, client.secret) == (URL_KEY, URL_SECRET)   # the client has them, the listing not
        proxy.every = (1, ["500"])   # every sample read fails: skipped, warned, counted
        batches(loader)
        assert loader.skipped
        shown += loader_outputs(loader)
        failing = build_loader(TRAIN, "torchvision", overrides=overrides(s3_bucket, source=source))
        with pytest.raises(SampleError) as raised:
            next(iter(failing))
        failing.close()
        shown += [str(raised.value), repr(raised.value), raised.value.path, raised.value.reason]
        cached = build_loader(TRAIN, "torchvision", overrides=overrides(s3_bucket, source={
            **source, "cache": {"dir": str(cache), "max_bytes": "1GB"}}))
        proxy.every = None
        assert len(batches(cached)) == 8
        with pytest.raises(SourceError) as missing:
            build_loader(TRAIN, "torchvision", overrides=overrides(
                s3_bucket.replace("cred-bucket", "no-such-bucket"), source=source))
        shown += [str(missing.value), repr(missing.value)]
    out, err = capfd.readouterr()
    shown += [out, err, our_log(caplog), *(str(w.message) for w in warned),
              *cache_contents(cache, private_listing_cache)]
    assert "train-000000.tar" in "\n".join(shown) and "no-such-bucket" in str(missing.value)
    assert shown_secrets(shown) == []


def test_http_credentials_in_the_url_reach_the_server_and_no_output(http_shards, local_shards, planted_environment,
                                                                    private_listing_cache, caplog, capfd):
    shards, server = http_shards
    with caplog.at_level(logging.DEBUG, logger="dali_bridge"):
        loader = build_loader(TRAIN, "torchvision", overrides=overrides(shards, source={"timeout": 5.0}))
        shown = loader_outputs(loader)
        assert_same_batches(batches(loader), local_batches(local_shards, "torchvision"))
        with pytest.raises(SourceError) as refused:   # the server refuses other credentials, by name
            build_loader(TRAIN, "torchvision", overrides=overrides(shards.replace(HTTP_PASSWORD, "wrong-pw-9"),
                                                                   source={"timeout": 5.0}))
    assert server.seen and all(auth for _, _, auth in server.seen if auth is not None)
    assert "denied (401)" in str(refused.value) and "wrong-pw-9" not in str(refused.value)
    out, err = capfd.readouterr()
    shown += [str(refused.value), out, err, our_log(caplog), *cache_contents(private_listing_cache)]
    assert "train-000000.tar" in "\n".join(shown)
    assert shown_secrets(shown) == []


def test_a_signed_urls_query_is_kept_to_fetch_and_hidden_in_the_listing(local_shards, answering_server,
                                                                          planted_environment, tmp_path):
    served = tmp_path / "signed"   # the shards alone: a manifest names them without the query
    served.mkdir()
    for path in local_shards.glob("train-*"):
        shutil.copy(path, served / path.name)
    server = Behaviour()
    base = answering_server(served, server)
    loader = build_loader(TRAIN, "torchvision", overrides=overrides(
        f"{base}/{SHARDS}?{SIGNED_QUERY}", source={"timeout": 5.0}))
    shown = loader_outputs(loader)
    assert len(batches(loader)) == 8
    assert any(SIGNATURE in path for method, path, _ in server.seen if method == "GET")   # sent to the server
    assert "X-Amz-Signature=***" in loader.listing.paths[0]
    assert shown_secrets(shown) == []


def test_a_signed_urls_query_and_credentials_are_hidden_in_listing_errors(local_shards, answering_server,
                                                                          planted_environment, caplog):
    base = answering_server(local_shards, Behaviour())
    signed = f"{base.replace('://', f'://{HTTP_USER}:{HTTP_PASSWORD}@')}/missing-{{0..1}}.tar?{SIGNED_QUERY}"
    with caplog.at_level(logging.DEBUG, logger="dali_bridge"), pytest.raises(SourceError) as info:
        build_loader(TRAIN, "torchvision", overrides=overrides(signed, source={"timeout": 2.0}))
    assert "missing-0.tar" in str(info.value)
    assert shown_secrets([str(info.value), repr(info.value), our_log(caplog)]) == []


def test_gcs_urls_refuse_userinfo_and_their_errors_show_no_environment_secret(gcs_endpoint, planted_environment,
                                                                              monkeypatch):
    pytest.importorskip("gcsfs")
    monkeypatch.setenv("GCS_PLANTED_ACCESS_TOKEN", SESSION_TOKEN)
    with pytest.raises(SourceError) as userinfo:
        build_loader(TRAIN, "torchvision", overrides=overrides(f"gs://{URL_KEY}:{URL_SECRET}@bucket/{SHARDS}"))
    assert "gs:// URLs take no user:password@" in str(userinfo.value)
    with pytest.raises(SourceError) as missing:
        build_loader(TRAIN, "torchvision", overrides=overrides(
            f"gs://no-such-gcs-bucket/{SHARDS}?token={QUERY_TOKEN}", source={"timeout": 3.0}))
    assert "no-such-gcs-bucket" in str(missing.value)
    assert shown_secrets([str(userinfo.value), str(missing.value)]) == []


# ---- every command


@pytest.fixture
def pipelines(s3_bucket: str, http_shards, local_shards: Path, moto_endpoint: str,
              write_pipeline: Callable[..., Path]) -> dict[str, Path]:
    """A pipeline over each planted URL: S3 userinfo, HTTP userinfo, a signed query."""
    http, _ = http_shards
    base = http.rsplit("/", 1)[0]

    def pipeline(shards: str) -> Path:
        return write_pipeline(TRAIN, source={"type": "webdataset", "shards": shards, "timeout": 5.0}, batch_size=4,
                              loader__workers=0)

    return {"s3": pipeline(s3_bucket), "http": pipeline(http),
            "signed": pipeline(f"{base}/train-{{000000..000003}}.tar?{SIGNED_QUERY}")}


def command_lines(pipelines: dict[str, Path], s3_bucket: str, http: str, sample_root: Path) -> list[list[str]]:
    """Every command, over every planted URL where it takes one."""
    lines: list[list[str]] = [["doctor"]]
    for name, path in pipelines.items():
        lines += [["validate", str(path)], ["show", str(path)],
                  ["--verbose", "run", str(path), "--backends", "torchvision", "--batches", "1"],
                  ["bench", str(path), "--backends", "torchvision", "--baselines", "none", "--threads", "1",
                   "--batches", "1", "--warmup", "1", "--repeat", "1"]]
        if len(CPU_BACKENDS) == 2:
            lines.append(["compare", str(path), "--backends", ",".join(CPU_BACKENDS), "--batches", "1"])
    lines += [["validate", str(pipelines["http"]), "--set", f"source.shards={s3_bucket}"],
              ["verify", s3_bucket], ["verify", http],
              ["convert", str(sample_root), s3_bucket.replace("train/" + SHARDS, "out/x-%06d.tar"), "--shard-size",
               "20", "-q"],
              ["convert", str(sample_root), http.replace(SHARDS, "out/x-%06d.tar"), "--shard-size", "20", "-q"]]
    return lines


def test_no_command_shows_a_planted_credential(pipelines, s3_bucket, http_shards, sample_root, planted_environment,
                                               private_listing_cache, capfd, caplog):
    failures: dict[str, list[str]] = {}
    for line in command_lines(pipelines, s3_bucket, http_shards[0], sample_root):
        with caplog.at_level(logging.INFO, logger="dali_bridge"):
            try:
                code: Any = main(line)
            except SystemExit as exc:
                code = exc.code
        out, err = capfd.readouterr()
        found = shown_secrets([out, err, our_log(caplog), str(code)])
        caplog.clear()
        if found:
            failures[" ".join(line)] = found
    assert failures == {}


def test_a_commands_error_in_its_own_process_shows_no_planted_credential(pipelines, planted_environment):
    for name in ("s3", "http", "signed"):
        done = subprocess.run([sys.executable, "-m", "dali_bridge", "--verbose", "run", str(pipelines[name]),
                               "--backends", "torchvision", "--batches", "1"], capture_output=True, text=True,
                              timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert "imagenet-train" in done.stdout + done.stderr
        assert shown_secrets([done.stdout, done.stderr]) == []
