"""Shards in object storage: the same samples, labels, order and pixels from s3:// and http:// as
from the same shards on disk, on both CPU backends; faults retried, a sample that keeps failing
a sample error, a server that is gone an error within the timeout; listings cached by URL, size
and ETag; credentials never shown. Servers run on 127.0.0.1 only (tests/helpers/s3_fixtures.py)."""
# ruff: noqa: F811 (the loopback fixtures imported from tests.helpers are named again as the tests' parameters)
from __future__ import annotations

import json
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.backends import CPU_BACKENDS
from tests.helpers.paths import TRAIN
from dali_bridge import build_loader
from dali_bridge.errors import ImageError, SampleError
from dali_bridge.errors import SourceError
from dali_bridge.data.sources.webdataset import list_webdataset
from dali_bridge.spec.model import DEFAULT_IMAGE_KEYS
from dali_bridge.spec.pipeline import spec_from_dict
from dali_bridge.spec.problems import SpecError
from dali_bridge.data.storage.store import ObjectStore
from dali_bridge.util.urls import StorageError, redact, require_client
from tests.helpers import s3_fixtures
from tests.helpers.s3_fixtures import PLANTED_KEY_ID, PLANTED_SECRET, free_port, s3_client, upload_folder
from tests.helpers.object_storage import (SHARDS, assert_same_batches, assert_two_epochs_as_local, batches,
                                          everything_shown, first_batch_error, gone_then_shown, local_batches,
                                          overrides)
# fixtures, used by name
from tests.helpers.object_storage import local_shards, private_listing_cache  # noqa: F401

pytestmark = pytest.mark.slow  # local S3 and HTTP servers, retries and timeouts

# The loopback servers' fixtures, used by name below.
moto_endpoint, http_folder, fault_proxy = s3_fixtures.moto_endpoint, s3_fixtures.http_folder, s3_fixtures.fault_proxy


@pytest.fixture(scope="session")
def s3_shards(moto_endpoint: str, local_shards: Path) -> str:
    """The shards, indexes and manifest uploaded to s3://shards-bucket/train; the prefix's URL."""
    return upload_folder(moto_endpoint, local_shards, "shards-bucket", "train")


# ---- the same batches as local shards


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_s3_shards_give_the_local_shards_batches_pixel_for_pixel(backend, local_shards, s3_shards):
    assert_two_epochs_as_local(f"{s3_shards}/{SHARDS}", backend, local_shards)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_http_shards_give_the_local_shards_batches_pixel_for_pixel(backend, local_shards, http_folder):
    root, base = http_folder
    for path in local_shards.iterdir():
        shutil.copy2(path, root / path.name)
    remote = batches(build_loader(TRAIN, backend, overrides=overrides(f"{base}/{SHARDS}")))
    assert_same_batches(remote, local_batches(local_shards, backend))


def test_listing_at_a_url_matches_the_local_listing(local_shards, s3_shards):
    local = list_webdataset(str(local_shards / SHARDS), DEFAULT_IMAGE_KEYS)
    remote = list_webdataset(f"{s3_shards}/{SHARDS}", DEFAULT_IMAGE_KEYS, store=ObjectStore("s3"))
    assert [p.split("#")[1] for p in remote.paths] == [p.split("#")[1] for p in local.paths]
    assert remote.labels.tolist() == local.labels.tolist() and remote.classes == local.classes
    assert remote.shards.offset.tolist() == local.shards.offset.tolist()
    assert [remote.read(i) for i in range(0, 37, 6)] == [local.read(i) for i in range(0, 37, 6)]


# ---- faults

@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_throttling_errors_resets_and_short_bodies_are_retried_and_nothing_is_lost(backend, local_shards,
                                                                                   s3_shards, moto_endpoint,
                                                                                   fault_proxy):
    proxy = fault_proxy(moto_endpoint)
    proxy.every = (3, ["503", "500", "reset", "short"])  # every third ranged GET fails, listing's too
    remote = build_loader(TRAIN, backend, overrides=overrides(
        f"{s3_shards}/{SHARDS}", source={"storage_options": {"endpoint_url": proxy.endpoint}}))
    assert_same_batches(batches(remote), local_batches(local_shards, backend))
    assert set(proxy.injected) == {"503", "500", "reset", "short"}


def remote_and_local(s3_shards: str, local_shards: Path, proxy, **store: Any):
    """The same shards listed at the S3 URL (through ``proxy``, with these store settings) and on disk."""
    remote = list_webdataset(f"{s3_shards}/{SHARDS}", DEFAULT_IMAGE_KEYS,
                             store=ObjectStore("s3", {"endpoint_url": proxy.endpoint}, **store))
    return remote, list_webdataset(str(local_shards / SHARDS), DEFAULT_IMAGE_KEYS)


def test_a_ranged_get_refused_as_an_expired_signature_is_signed_again_and_a_real_denial_is_named(
        local_shards, s3_shards, moto_endpoint, fault_proxy):
    proxy = fault_proxy(moto_endpoint)
    remote, local = remote_and_local(s3_shards, local_shards, proxy, timeout=5.0)
    assert remote.read(3) == local.read(3)   # its shard's GET signed
    proxy.plan("403")
    assert remote.read(4) == local.read(4)   # the same shard: refused once, signed again, read
    assert proxy.injected["403"] == 1 and proxy.ranged == 3
    proxy.every = (1, ["403"])
    with pytest.raises(ImageError, match=r"access to s3://shards-bucket/train/train-000000.tar denied \(403\)"):
        remote.read(5)
    assert proxy.ranged == 3 + 2   # refused with a fresh signature: not retried again


def failing_loader(proxy, s3_shards: str, **extra: Any):
    loader = build_loader(TRAIN, "torchvision", overrides=overrides(
        f"{s3_shards}/{SHARDS}", source={"storage_options": {"endpoint_url": proxy.endpoint}, "timeout": 3.0},
        **{"loader.shuffle": False, "loader.workers": 0}, **extra))
    return loader


def test_a_sample_that_keeps_failing_raises_naming_url_member_and_last_error(s3_shards, moto_endpoint, fault_proxy):
    proxy = fault_proxy(moto_endpoint)
    loader = failing_loader(proxy, s3_shards)
    proxy.every = (1, ["500"])  # after listing: every sample read fails
    started = time.monotonic()
    with pytest.raises(SampleError) as info:
        next(iter(loader))
    loader.close()
    assert time.monotonic() - started < 30
    assert info.value.index == 0
    assert info.value.path == f"{s3_shards}/train-000000.tar#class_000/img_00000.jpg"
    assert "train-000000.tar" in info.value.reason and "HTTP 500" in info.value.reason
    assert "within source.timeout (3 s)" in info.value.reason


def test_a_failing_sample_is_skipped_and_counted_under_on_error_skip(s3_shards, moto_endpoint, fault_proxy):
    proxy = fault_proxy(moto_endpoint)
    loader = failing_loader(proxy, s3_shards, **{"loader.on_error": "skip"})
    samples = loader.listing.shards
    start, size = int(samples.offset[7]), int(samples.size[7])
    proxy.by_range[f"bytes={start}-{start + size - 1}"] = "500"  # sample 7's every attempt
    seen = [i for _, _, index, _ in loader for i in index.tolist()]
    loader.close()
    assert [s.index for s in loader.skipped] == [7] and "HTTP 500" in loader.skipped[0].reason
    assert seen == [i for i in range(37) if i != 7]


def test_a_stalled_read_is_a_sample_error_within_the_timeout_not_a_hang(s3_shards, moto_endpoint, fault_proxy):
    proxy = fault_proxy(moto_endpoint)
    loader = failing_loader(proxy, s3_shards)
    proxy.stall_s = 20
    proxy.every = (1, ["stall"])
    started = time.monotonic()
    with pytest.raises(SampleError) as info:
        next(iter(loader))
    loader.close()
    assert time.monotonic() - started < 15
    assert "no answer within the 3 s timeout" in info.value.reason


def test_a_server_that_is_gone_is_a_clear_error_within_the_timeout(moto_endpoint):
    gone = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(SourceError) as info:
        build_loader(TRAIN, "torchvision", overrides=overrides(
            f"s3://shards-bucket/train/{SHARDS}", source={"storage_options": {"endpoint_url": gone}, "timeout": 1.5}))
    assert time.monotonic() - started < 15
    message = str(info.value)
    assert "4 of 4 shard(s) cannot be listed" in message and "s3://shards-bucket/train/train-000000.tar" in message
    assert "within source.timeout (1.5 s)" in message and "connect" in message.lower()


def test_an_object_replaced_after_listing_is_an_error_naming_it(moto_endpoint, local_shards):
    prefix = upload_folder(moto_endpoint, local_shards, "replaced-bucket", "train")
    loader = build_loader(TRAIN, "torchvision", overrides=overrides(
        f"{prefix}/{SHARDS}", **{"loader.shuffle": False, "loader.workers": 0}))
    replacement = (local_shards / "train-000001.tar").read_bytes()
    s3_client(moto_endpoint).put_object(Bucket="replaced-bucket", Key="train/train-000000.tar", Body=replacement)
    with pytest.raises(SampleError) as info:
        next(iter(loader))
    loader.close()
    assert "s3://replaced-bucket/train/train-000000.tar changed since it was listed" in info.value.reason


# ---- listing

def test_listing_is_cached_by_url_size_and_etag_and_redone_when_an_object_changes(moto_endpoint, local_shards,
                                                                                  fault_proxy,
                                                                                  private_listing_cache):
    prefix = upload_folder(moto_endpoint, local_shards, "cached-bucket", "train")
    proxy = fault_proxy(moto_endpoint)
    store = ObjectStore("s3", {"endpoint_url": proxy.endpoint})
    first = list_webdataset(f"{prefix}/{SHARDS}", DEFAULT_IMAGE_KEYS, store=store)
    assert proxy.requests == {"GET": 1 + 4 + 1}  # one LIST, 4 indexes, the manifest (labels: the manifest's)
    names = sorted(p.name for p in (private_listing_cache / "dali-bridge" / "listings").iterdir())
    assert len(names) == 4 and all(len(name) == 64 + len(".json") for name in names)  # hashed names
    proxy.requests.clear()
    again = list_webdataset(f"{prefix}/{SHARDS}", DEFAULT_IMAGE_KEYS, store=store)
    assert proxy.requests == {"GET": 1 + 1}  # shards' and indexes' sizes and ETags from one LIST, the manifest
    assert again.paths == first.paths and again.labels.tolist() == first.labels.tolist()
    client = s3_client(moto_endpoint)
    client.put_object(Bucket="cached-bucket", Key="train/train-000003.tar", Body=b"not a tar" * 100)
    proxy.requests.clear()
    with pytest.raises(SourceError, match="train-000003.tar"):
        list_webdataset(f"{prefix}/{SHARDS}", DEFAULT_IMAGE_KEYS, store=store)


def test_listing_a_converted_set_reads_only_the_manifest_and_the_indexes(local_shards, s3_shards, moto_endpoint,
                                                                          fault_proxy, caplog):
    proxy = fault_proxy(moto_endpoint)
    with caplog.at_level(logging.WARNING, logger="dali_bridge"):
        remote = list_webdataset(f"{s3_shards}/{SHARDS}", DEFAULT_IMAGE_KEYS,
                                 store=ObjectStore("s3", {"endpoint_url": proxy.endpoint}))
    assert proxy.ranged == 0 and proxy.requests == {"GET": 1 + 1 + 4}  # LIST, manifest, indexes; no GET per sample
    assert "ranged GET per sample" not in caplog.text
    local = list_webdataset(str(local_shards / SHARDS), DEFAULT_IMAGE_KEYS)
    assert remote.paths == tuple(p.replace(str(local_shards), s3_shards) for p in local.paths)
    assert remote.labels.tolist() == local.labels.tolist()
    assert remote.shards.offset.tolist() == local.shards.offset.tolist()


def test_a_warm_listing_costs_a_list_request_per_page_of_keys_not_a_head_per_object(local_shards, moto_endpoint,
                                                                                     fault_proxy, monkeypatch):
    from dali_bridge.data.storage import store as storage

    prefix = upload_folder(moto_endpoint, local_shards, "paged-bucket", "train")
    client = s3_client(moto_endpoint)
    for key in ("train/aaa-other.tar", "train/train-000000.foo", "train/val-000000.tar", "train/zzz.tar"):
        client.put_object(Bucket="paged-bucket", Key=key, Body=b"another object of the folder")
    store = ObjectStore("s3", {"endpoint_url": moto_endpoint})
    first = list_webdataset(f"{prefix}/{SHARDS}", DEFAULT_IMAGE_KEYS, store=store)
    monkeypatch.setattr(storage, "LIST_PAGE", 3)   # 8 shards and indexes (and one stranger among them)
    proxy = fault_proxy(moto_endpoint)
    again = list_webdataset(f"{prefix}/{SHARDS}", DEFAULT_IMAGE_KEYS,
                            store=ObjectStore("s3", {"endpoint_url": proxy.endpoint}))
    assert proxy.requests == {"GET": 3 + 1}  # ceil(9 / 3) LIST pages, the manifest; nothing outside the keys' range
    assert again.paths == first.paths and again.shards.etags == first.shards.etags


def test_a_missing_shard_is_named_from_the_listing(local_shards, moto_endpoint):
    prefix = upload_folder(moto_endpoint, local_shards, "holed-bucket", "train", skip=("000002.tar",))
    with pytest.raises(SourceError, match=r"1 of 4 shard\(s\) cannot be listed:\n  s3://holed-bucket/train/"
                                          r"train-000002.tar does not exist"):
        list_webdataset(f"{prefix}/{SHARDS}", DEFAULT_IMAGE_KEYS, store=ObjectStore("s3"))


def test_a_missing_bucket_is_named_for_each_shard(moto_endpoint):
    with pytest.raises(SourceError, match=r"s3://no-such-bucket/train/train-000001.tar: LIST s3://no-such-bucket/"
                                          r"train/train-00000: s3://no-such-bucket does not exist \(404\)"):
        list_webdataset("s3://no-such-bucket/train/train-{000000..000001}.tar", DEFAULT_IMAGE_KEYS,
                        store=ObjectStore("s3"))


def test_http_shards_are_listed_by_concurrent_heads(local_shards, http_folder, fault_proxy):
    root, base = http_folder
    for path in local_shards.iterdir():
        shutil.copy2(path, root / path.name)
    proxy = fault_proxy(base)
    proxy.ranged_only = False
    listing = list_webdataset(f"{proxy.endpoint}/{SHARDS}", DEFAULT_IMAGE_KEYS, store=ObjectStore("http"))
    assert proxy.requests == {"HEAD": 8, "GET": 1 + 4}  # no LIST over HTTP: a HEAD per shard and index
    assert len(listing) == 37


def without_manifest_labels(local_shards: Path, out: Path) -> Path:
    """The shards with the manifest an older convert wrote: no labels, no index digests."""
    shutil.copytree(local_shards, out)
    manifest = json.loads((out / "train.manifest.json").read_text())
    for entry in manifest["shards"]:
        del entry["labels"], entry["index_sha256"]
    (out / "train.manifest.json").write_text(json.dumps(manifest))
    return out


def test_a_manifest_without_labels_still_lists_reading_each_label_with_a_warning(local_shards, moto_endpoint,
                                                                                 fault_proxy, tmp_path, caplog):
    prefix = upload_folder(moto_endpoint, without_manifest_labels(local_shards, tmp_path / "old"), "old-bucket")
    proxy = fault_proxy(moto_endpoint)
    with caplog.at_level(logging.WARNING, logger="dali_bridge"):
        remote = list_webdataset(f"{prefix}/{SHARDS}", DEFAULT_IMAGE_KEYS,
                                 store=ObjectStore("s3", {"endpoint_url": proxy.endpoint}))
    assert proxy.ranged == 37
    assert "4 shards (train-000000.tar ...) listed with one ranged GET per sample for its label, 37 GETs" \
        in caplog.text and "records no labels" in caplog.text
    local = list_webdataset(str(local_shards / SHARDS), DEFAULT_IMAGE_KEYS)
    assert remote.labels.tolist() == local.labels.tolist()


def test_an_index_other_than_the_one_the_manifest_records_is_checked_against_the_shard(local_shards,
                                                                                       moto_endpoint, tmp_path):
    swapped = tmp_path / "swapped"
    shutil.copytree(local_shards, swapped)
    assert (local_shards / "train-000001.tar").stat().st_size < (local_shards / "train-000000.tar").stat().st_size
    shutil.copy(local_shards / "train-000001.idx", swapped / "train-000000.idx")  # a smaller shard's index
    prefix = upload_folder(moto_endpoint, swapped, "swapped-bucket")
    with pytest.raises(SourceError, match="train-000000.idx disagrees with train-000000.tar"):
        list_webdataset(f"{prefix}/{SHARDS}", DEFAULT_IMAGE_KEYS, store=ObjectStore("s3"))


def test_a_shard_without_an_index_is_downloaded_once_with_a_warning(moto_endpoint, local_shards, caplog):
    prefix = upload_folder(moto_endpoint, local_shards, "unindexed-bucket", "train", skip=("000002.idx",))
    local = list_webdataset(str(local_shards / SHARDS), DEFAULT_IMAGE_KEYS)
    with caplog.at_level(logging.WARNING, logger="dali_bridge"):
        remote = list_webdataset(f"{prefix}/{SHARDS}", DEFAULT_IMAGE_KEYS, store=ObjectStore("s3"))
    assert "1 shard without a usable index (train-000002.tar" in caplog.text and "MiB" in caplog.text
    assert remote.labels.tolist() == local.labels.tolist()
    assert remote.shards.offset.tolist() == local.shards.offset.tolist()


def test_a_batch_is_fetched_concurrently_within_max_requests(s3_shards, moto_endpoint, fault_proxy):
    for max_requests, expected_peak in ((2, 2), (16, 15)):
        proxy = fault_proxy(moto_endpoint)
        loader = build_loader(TRAIN, "torchvision", overrides=overrides(
            f"{s3_shards}/{SHARDS}", source={"storage_options": {"endpoint_url": proxy.endpoint},
                                             "max_requests": max_requests},
            **{"loader.workers": 0}))
        proxy.latency, proxy.peak = 0.3, 0  # long enough for a batch's requests to overlap
        next(iter(loader))
        loader.close()
        # batch_size 5, and the two batches read ahead behind it: all fifteen at once when the limit allows
        assert proxy.peak == expected_peak


def test_a_batch_sample_is_handed_out_as_soon_as_its_bytes_arrive_while_later_ones_are_in_flight(
        local_shards, s3_shards, moto_endpoint, fault_proxy):
    proxy = fault_proxy(moto_endpoint)
    remote, local = remote_and_local(s3_shards, local_shards, proxy, max_requests=1)
    batch = [7, 30, 2, 19]
    proxy.latency, proxy.ranged = 1.0, 0   # one GET at a time, each a second long
    remote.prefetch(batch)
    assert remote.read(batch[0]) == local.read(batch[0])
    assert proxy.ranged < len(batch)  # the first sample came before the batch's last GET was sent
    assert [remote.read(i) for i in batch[1:]] == [local.read(i) for i in batch[1:]]
    assert proxy.ranged == len(batch)  # each GET started by the prefetch, none again by the reads


# ---- settings and credentials

def test_a_missing_storage_client_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "gcsfs", None)
    with pytest.raises(StorageError, match=r"pip install 'dali-bridge\[gcs\]'"):
        require_client("gs")
    with pytest.raises(SourceError, match=r"source.shards: reading gs:// needs the 'gcsfs' package"):
        build_loader(TRAIN, "torchvision", overrides=overrides(f"gs://bucket/{SHARDS}"))


def test_url_shards_are_kept_as_urls_and_storage_keys_are_checked(tmp_path):
    def spec(**source: Any):
        return spec_from_dict({"version": 1, "batch_size": 2, "ops": [{"center_crop": {"size": 8}}],
                               "source": {"type": "webdataset", **source}}, base_dir=tmp_path)

    resolved = spec(shards=f"s3://b/p/{SHARDS}", manifest="s3://b/p/train.manifest.json",
                    storage_options={"client_kwargs": {"region_name": "eu-west-1"}}, max_requests=8, timeout=5)
    assert resolved.source.shards == f"s3://b/p/{SHARDS}" and resolved.source.max_requests == 8
    cached = spec(shards=f"s3://b/p/{SHARDS}", cache={"dir": "cache", "max_bytes": "2 GiB"})
    assert (cached.source.cache_dir, cached.source.cache_max_bytes) == (str(tmp_path / "cache"), 2 * 2**30)
    assert spec_from_dict(cached.to_dict()).source == cached.source
    with pytest.raises(SpecError, match=r"source.cache.max_bytes: expected a size in bytes"):
        spec(shards=f"s3://b/p/{SHARDS}", cache={"dir": "cache", "max_bytes": "lots"})
    assert spec_from_dict(resolved.to_dict()).source == resolved.source
    with pytest.raises(SpecError) as info:
        spec(shards=f"s3://b/{SHARDS}", storage_options={"secret": "hunter2-value", "client_kwargs": {"token": "t0k"}},
             max_requests=0, timeout=-1)
    message = str(info.value)
    assert "'secret' looks like a credential" in message and "'client_kwargs.token' looks like a credential" in message
    assert "hunter2-value" not in message and "t0k" not in message
    assert "source.max_requests" in message and "source.timeout" in message
    with pytest.raises(SpecError, match="applies to a source at a URL"):
        spec(shards=str(tmp_path / SHARDS), max_requests=4)


def test_credentials_never_appear_in_errors_logs_show_state_or_cache(moto_endpoint, s3_shards, fault_proxy,
                                                                     private_listing_cache, caplog, capsys,
                                                                     write_pipeline):
    shown: list[str] = []
    with caplog.at_level(logging.DEBUG, logger="dali_bridge"):  # our log lines (botocore logs its own at DEBUG)
        proxy = fault_proxy(moto_endpoint)
        loader = failing_loader(proxy, s3_shards)
        shown.append(repr(loader.state_dict()))
        proxy.every = (1, ["500"])
        shown.append(first_batch_error(loader))
        shown.append(gone_then_shown(f"s3://shards-bucket/train/{SHARDS}", f"{s3_shards}/{SHARDS}", write_pipeline))
    shown += everything_shown(capsys, caplog, private_listing_cache)
    text = "\n".join(shown)
    assert "train-000000.tar" in text  # the outputs were gathered
    assert PLANTED_SECRET not in text and PLANTED_KEY_ID not in text
    assert redact(f"key {PLANTED_KEY_ID} secret {PLANTED_SECRET} at https://user:pw@host/x") == \
        "key *** secret *** at https://***@host/x"


def test_a_signed_urls_credential_parts_are_hidden_in_any_message():
    signed = ("http://127.0.0.1:9/b/k.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDEXAMPLE%2F20261202"
              "%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20261202T000000Z&X-Amz-Expires=3600"
              "&X-Amz-SignedHeaders=host&X-Amz-Security-Token=FwoGZXIvYXdzEXAMPLE&X-Amz-Signature=0123abcd")
    legacy = "https://b.s3.amazonaws.com/k?AWSAccessKeyId=AKIDLEGACY&Signature=c2lnbmF0dXJl&Expires=1"
    shown = redact(f"ServerDisconnectedError: url='{signed}'; {legacy}")
    for secret in ("AKIDEXAMPLE", "FwoGZXIvYXdzEXAMPLE", "0123abcd", "AKIDLEGACY", "c2lnbmF0dXJl"):
        assert secret not in shown
    assert "X-Amz-Date=20261202T000000Z" in shown and "http://127.0.0.1:9/b/k.tar" in shown


# ---- cache mode

def cached_overrides(s3_shards: str, proxy, folder: Path, max_bytes: Any, **extra: Any) -> dict[str, Any]:
    return overrides(f"{s3_shards}/{SHARDS}", source={"storage_options": {"endpoint_url": proxy.endpoint},
                                                      "cache": {"dir": str(folder), "max_bytes": max_bytes}}, **extra)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_cache_mode_gives_the_local_shards_batches_and_downloads_each_shard_once(backend, local_shards, s3_shards,
                                                                                  moto_endpoint, fault_proxy,
                                                                                  tmp_path):
    proxy = fault_proxy(moto_endpoint)
    loader = build_loader(TRAIN, backend, overrides=cached_overrides(s3_shards, proxy, tmp_path / "c", "1GB"))
    proxy.requests.clear()
    assert_same_batches(batches(loader), local_batches(local_shards, backend))
    assert proxy.requests["GET"] == 4  # one whole-shard download each (a single piece: the shards are small)
    again = build_loader(TRAIN, backend, overrides=cached_overrides(s3_shards, proxy, tmp_path / "c", "1GB"))
    proxy.requests.clear()
    assert_same_batches(batches(again), local_batches(local_shards, backend))
    assert proxy.requests["GET"] == 0


def test_the_cache_stays_within_its_bound_evicting_the_least_recently_used(local_shards, s3_shards, moto_endpoint,
                                                                         fault_proxy, tmp_path):
    from dali_bridge.data.shards.cache import CachedShard, cache_usage

    largest = max(p.stat().st_size for p in local_shards.glob("*.tar"))
    bound = 2 * largest + 1000
    proxy = fault_proxy(moto_endpoint)
    loader = build_loader(TRAIN, "torchvision", overrides=cached_overrides(
        s3_shards, proxy, tmp_path / "c", bound, **{"loader.workers": 0, "loader.shuffle": False}))
    seen = []
    for _, _, index, _ in loader:
        seen.extend(index.tolist())
        assert cache_usage(tmp_path / "c") <= bound
    loader.close()
    assert seen == list(range(37))
    samples = loader.listing.shards
    cached = [samples.cache.path_for(CachedShard(url, size, etag, None)).exists()
              for url, size, etag in zip(samples.shards, samples.shard_bytes, samples.etags)]
    assert cached[0] is False and cached[-1] is True  # the least recently used went first


def test_a_damaged_cache_file_is_detected_and_fetched_again(local_shards, s3_shards, moto_endpoint, fault_proxy,
                                                            tmp_path, caplog):
    proxy = fault_proxy(moto_endpoint)
    expected = local_batches(local_shards, "torchvision", **{"loader.workers": 0})
    batches(build_loader(TRAIN, "torchvision", overrides=cached_overrides(s3_shards, proxy, tmp_path / "c", "1GB",
                                                                          **{"loader.workers": 0})))
    for cached in (tmp_path / "c").glob("*.tar"):
        data = bytearray(cached.read_bytes())
        data[len(data) // 2] ^= 0xFF  # same size, other bytes
        cached.write_bytes(bytes(data))
    proxy.requests.clear()
    with caplog.at_level(logging.WARNING, logger="dali_bridge"):
        got = batches(build_loader(TRAIN, "torchvision", overrides=cached_overrides(
            s3_shards, proxy, tmp_path / "c", "1GB", **{"loader.workers": 0})))
    assert_same_batches(got, expected)
    assert proxy.requests["GET"] == 1 + 1 + 4  # the LIST, the manifest (listing from its cache), each shard again
    assert caplog.text.count("is damaged: deleted, fetching it again") == 4


def _ensure_in_child(cache, shard, queue) -> None:
    queue.put(str(cache.ensure(shard)))


def test_the_processes_of_a_node_download_a_shard_once(s3_shards, moto_endpoint, fault_proxy, tmp_path):
    import multiprocessing

    from dali_bridge.data.shards.cache import CachedShard, ShardCache

    proxy = fault_proxy(moto_endpoint, latency=0.3)  # a slow download: the others wait on its lock
    store = ObjectStore("s3", {"endpoint_url": proxy.endpoint})
    url = f"{s3_shards}/train-000000.tar"
    info = store.info([url])[0]
    shard = CachedShard(url, info.size, info.etag, None)
    cache = ShardCache(tmp_path / "c", 10**9, store)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    children = [context.Process(target=_ensure_in_child, args=(cache, shard, queue)) for _ in range(3)]
    for child in children:
        child.start()
    paths = {queue.get(timeout=60) for _ in children}
    for child in children:
        child.join(timeout=60)
    assert len(paths) == 1 and proxy.requests["GET"] == 1


def test_partial_downloads_count_against_the_bound(s3_shards, moto_endpoint, tmp_path):
    from dali_bridge.data.shards.cache import CacheError, CachedShard, ShardCache

    store = ObjectStore("s3", timeout=0.5)
    url = f"{s3_shards}/train-000000.tar"
    info = store.info([url])[0]
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "0123.tar.partial-99999").write_bytes(bytes(info.size))  # another process's download
    cache = ShardCache(folder, int(info.size * 1.5), store)
    with pytest.raises(CacheError, match="cannot hold"):
        cache.ensure(CachedShard(url, info.size, info.etag, None))
    with pytest.raises(CacheError, match="more than source.cache.max_bytes"):
        ShardCache(folder, info.size - 1, store).ensure(CachedShard(url, info.size, info.etag, None))


def _fetch_in_child(store, request, queue) -> None:
    inherited = store._fs
    data = store.fetch([request])[0]
    queue.put((data, store._fs is not inherited and store._fs is not None))


def test_a_forked_process_makes_its_own_client_and_reads_through_it(s3_shards):
    import multiprocessing

    from dali_bridge.data.storage.store import Range

    store = ObjectStore("s3")
    url = f"{s3_shards}/train-000000.tar"
    request = Range(url, 0, 512)
    expected = store.fetch([request])[0]  # the parent's client exists (and its event loop thread)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_fetch_in_child, args=(store, request, queue))
    child.start()
    data, own_client = queue.get(timeout=60)
    child.join(timeout=60)
    assert data == expected and own_client


def _drop_inherited_in_child(store, request, queue) -> None:
    import gc
    import weakref

    inherited = weakref.ref(store._fs)
    store.fetch([request])
    gc.collect()
    queue.put(inherited() is not None)


def test_a_forked_process_never_closes_the_client_it_inherited(s3_shards):
    """Closing it would close the parent's pooled connections in the event-loop selector the two
    processes share after a fork: the parent's next answers on them would never arrive."""
    import multiprocessing

    from dali_bridge.data.storage.store import Range

    store = ObjectStore("s3")
    request = Range(f"{s3_shards}/train-000000.tar", 0, 512)
    store.fetch([request])
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_drop_inherited_in_child, args=(store, request, queue))
    child.start()
    kept = queue.get(timeout=60)
    child.join(timeout=60)
    assert kept
    assert len(store.fetch([request])[0]) == 512  # and the parent reads on


def test_a_sample_twice_in_a_batch_is_fetched_once(s3_shards, moto_endpoint, fault_proxy):
    proxy = fault_proxy(moto_endpoint)
    listing = list_webdataset(f"{s3_shards}/{SHARDS}", DEFAULT_IMAGE_KEYS,
                              store=ObjectStore("s3", {"endpoint_url": proxy.endpoint}))
    proxy.requests.clear()
    listing.prefetch([3, 5, 3])  # a padded batch, or repeated augmentation
    assert listing.read(3) == listing.read(3) and len(listing.read(5)) > 0
    assert proxy.requests["GET"] == 2


# ---- read-ahead into the cache (shuffle: shards)

SHARD_ORDER = {"loader.workers": 0, "loader.shuffle": "shards", "loader.shuffle_window": 1}


def is_cached(samples, shard: int) -> bool:
    return samples.cache.path_for(samples.cached_shard(shard)).exists()


def test_the_next_shard_is_read_ahead_into_the_cache_before_its_first_batch(local_shards, s3_shards, moto_endpoint,
                                                                             fault_proxy, tmp_path):
    from dali_bridge.data.shards.cache import cache_usage

    largest = max(p.stat().st_size for p in local_shards.glob("*.tar"))
    bound = 2 * largest + 1000
    proxy = fault_proxy(moto_endpoint)
    loader = build_loader(TRAIN, "torchvision", overrides=cached_overrides(s3_shards, proxy, tmp_path / "c", bound,
                                                                           **SHARD_ORDER))
    samples = loader.listing.shards
    proxy.requests.clear()
    got, read_ahead = [], []
    for number, batch in enumerate(loader):  # workers 0: batch k+1 is not read before it is asked for
        got.append(tuple(t.clone() for t in batch))
        loader.read_ahead.wait()
        ahead = loader.read_ahead
        upcoming = [s for s in ahead.order if ahead.first[s] > number]
        if upcoming:
            assert is_cached(samples, upcoming[0]), f"after batch {number}, shard {upcoming[0]} is not cached yet"
            read_ahead.append(upcoming[0])
        assert cache_usage(tmp_path / "c") <= bound
    loader.close()
    assert_same_batches(got, local_batches(local_shards, "torchvision", **SHARD_ORDER))
    assert len(set(read_ahead)) == 3 and set(read_ahead) <= set(ahead.fetched)  # every shard after the first
    assert proxy.requests["GET"] == 4  # each shard downloaded once: by the read-ahead, or at first touch


def test_the_next_epochs_first_shard_is_cached_before_that_epoch_starts(local_shards, s3_shards, moto_endpoint,
                                                                        fault_proxy, tmp_path):
    largest = max(p.stat().st_size for p in local_shards.glob("*.tar"))
    bound = 2 * largest + 1000   # room for two shards: every epoch evicts the shards the next one starts with
    proxy = fault_proxy(moto_endpoint)
    loader = build_loader(TRAIN, "torchvision", overrides=cached_overrides(s3_shards, proxy, tmp_path / "c", bound,
                                                                           **SHARD_ORDER))
    samples = loader.listing.shards
    first_of = [int(samples.shard[int(loader.tasks(epoch)[0].indices[0])]) for epoch in range(3)]
    got = []
    for epoch in range(3):
        for batch in loader:
            got.append(tuple(t.clone() for t in batch))
            loader.read_ahead.wait()
        if epoch < 2:   # its last batch taken: the next epoch's first shard was read ahead
            assert loader.read_ahead.fetched_following == [first_of[epoch + 1]]
            assert is_cached(samples, first_of[epoch + 1])
    loader.close()
    expected = [b for epoch in range(3) for b in local_batches(local_shards, "torchvision", epoch, **SHARD_ORDER)]
    assert_same_batches(got, expected)


def test_the_read_ahead_never_evicts_a_shard_still_in_use(s3_shards, moto_endpoint, fault_proxy, tmp_path):
    from dali_bridge.data.shards.cache import cache_usage
    from dali_bridge.data.shards.read_ahead import ShardReadAhead

    proxy = fault_proxy(moto_endpoint)
    probe = build_loader(TRAIN, "torchvision", overrides=cached_overrides(s3_shards, proxy, tmp_path / "c", "1GB",
                                                                          **SHARD_ORDER))
    plan = ShardReadAhead(probe.listing.shards, [t.indices for t in probe.tasks(0)], ahead=1)
    first, target = plan.order[0], plan.targets(1)[0]
    assert first in plan.in_use(1, target)  # every shard holds more than one batch: still in use after batch 0
    sizes = probe.listing.shards.shard_bytes
    bound = sizes[first] + sizes[target] - 1  # the next shard fits only by evicting the current one
    loader = build_loader(TRAIN, "torchvision", overrides=cached_overrides(s3_shards, proxy, tmp_path / "c", bound,
                                                                           **SHARD_ORDER))
    samples = loader.listing.shards
    iterator = iter(loader)
    next(iterator)
    loader.read_ahead.wait()
    assert is_cached(samples, first) and not is_cached(samples, target) and loader.read_ahead.fetched == []
    assert cache_usage(tmp_path / "c") <= bound
    loader.close()


def test_a_failed_read_ahead_is_fetched_again_at_first_touch(local_shards, s3_shards, moto_endpoint, fault_proxy,
                                                             tmp_path):
    proxy = fault_proxy(moto_endpoint)
    overrides_ = cached_overrides(s3_shards, proxy, tmp_path / "c", "1GB", **SHARD_ORDER)
    overrides_["source"]["timeout"] = 3.0
    loader = build_loader(TRAIN, "torchvision", overrides=overrides_)
    samples = loader.listing.shards
    tasks = loader.tasks(0)
    shard_order = list(dict.fromkeys(int(samples.shard[i]) for task in tasks for i in task.indices))
    second = shard_order[1]
    whole = f"bytes=0-{samples.shard_bytes[second] - 1}"
    assert whole != f"bytes=0-{samples.shard_bytes[shard_order[0]] - 1}"
    proxy.by_range[whole] = "500"  # the second shard's download fails, every attempt
    iterator = iter(loader)
    got = [tuple(t.clone() for t in next(iterator))]
    loader.read_ahead.wait()
    assert loader.read_ahead.failed == [second] and not is_cached(samples, second)
    proxy.by_range.clear()  # the store works again: the first touch fetches the shard
    got += [tuple(t.clone() for t in batch) for batch in iterator]
    loader.close()
    assert_same_batches(got, local_batches(local_shards, "torchvision", **SHARD_ORDER))
    assert loader.skipped == [] and is_cached(samples, second)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_reading_ahead_keeps_the_local_shards_batches_and_the_bound_with_workers(backend, local_shards, s3_shards,
                                                                                 moto_endpoint, fault_proxy, tmp_path):
    from dali_bridge.data.shards.cache import cache_usage

    largest = max(p.stat().st_size for p in local_shards.glob("*.tar"))
    bound = 2 * largest + 1000
    extra = {**SHARD_ORDER, "loader.workers": 1}
    loader = build_loader(TRAIN, backend, overrides=cached_overrides(
        s3_shards, fault_proxy(moto_endpoint), tmp_path / "c", bound, **extra))
    got = []
    for batch in loader:  # the executor reads ahead of the consumer too: the shards race the read-ahead
        got.append(tuple(t.cpu().clone() for t in batch))
        assert cache_usage(tmp_path / "c") <= bound
    loader.close()
    assert_same_batches(got, local_batches(local_shards, backend, **extra))
    assert loader.read_ahead.failed == []
