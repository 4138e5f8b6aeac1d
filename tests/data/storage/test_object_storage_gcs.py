"""Shards at gs:// URLs against a real GCS JSON API on loopback (fake-gcs-server, tests/helpers/gcs_fixtures.py):
the same samples, labels, order and pixels as the same shards on disk, on both CPU backends; listed
with one LIST request per 1,000 objects, not a HEAD each; an object written again after listing an
error naming it; no gcsfs, an error naming the extra; credentials never shown. Nothing but 127.0.0.1
is looked up while these tests run."""
# ruff: noqa: F811 (the loopback fixtures imported from tests.helpers are named again as the tests' parameters)
from __future__ import annotations

import logging
import math
import sys

import pytest

from tests.helpers.backends import CPU_BACKENDS
from tests.helpers.paths import TRAIN
from dali_bridge import build_loader
from dali_bridge.data.storage import store as storage
from dali_bridge.errors import SampleError
from dali_bridge.errors import SourceError
from dali_bridge.data.sources.webdataset import list_webdataset
from dali_bridge.spec.model import DEFAULT_IMAGE_KEYS
from dali_bridge.data.storage.store import ObjectStore
from dali_bridge.data.storage.listing import FetchError, ObjectInfo
from dali_bridge.util.urls import StorageError
from tests.helpers import gcs_fixtures
from tests.helpers import s3_fixtures
from tests.helpers.gcs_fixtures import gcs_filesystem, upload_folder_to_gcs
# The S3 tests' batch helpers: the same pipeline, another store.
from tests.helpers.object_storage import (SHARDS, assert_two_epochs_as_local, everything_shown, first_batch_error,
                                          gone_then_shown, overrides)
# fixtures, used by name
from tests.helpers.object_storage import local_shards, private_listing_cache  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_only")]  # an emulator process, retries

# The loopback servers' fixtures and the S3 tests' shards on disk and private listing cache, used by name below.
gcs_endpoint, loopback_only = gcs_fixtures.gcs_endpoint, gcs_fixtures.loopback_only
fault_proxy = s3_fixtures.fault_proxy   # a relay that counts requests, in front of the emulator here

PLANTED_TOKEN = "ya29.planted-gcs-token-c0ffee-do-not-show"


@pytest.fixture(scope="session")
def gs_shards(gcs_endpoint: str, local_shards) -> str:
    """The shards, indexes and manifest uploaded to gs://shards-bucket/train; the prefix's URL."""
    return upload_folder_to_gcs(gcs_endpoint, local_shards, "shards-bucket", "train")


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_gs_shards_give_the_local_shards_batches_pixel_for_pixel(backend, local_shards, gs_shards):
    assert_two_epochs_as_local(f"{gs_shards}/{SHARDS}", backend, local_shards)


def test_a_gs_listing_costs_a_list_request_per_page_of_keys_within_their_range(local_shards, gcs_endpoint,
                                                                               fault_proxy, monkeypatch):
    prefix = upload_folder_to_gcs(gcs_endpoint, local_shards, "paged-bucket", "train")
    fs = gcs_filesystem(gcs_endpoint)
    # Outside the keys' prefix, before the first key within it, and one among the keys.
    for name in ("aaa-other.tar", "train-000000.aaa", "train-000001.txt", "val-000000.tar", "zzz.tar"):
        fs.pipe_file(f"paged-bucket/train/{name}", b"another object of the folder")
    first = list_webdataset(f"{prefix}/{SHARDS}", DEFAULT_IMAGE_KEYS, store=ObjectStore("gs"))
    monkeypatch.setattr(storage, "LIST_PAGE", 3)   # 8 shards and indexes and the one stranger among them
    proxy = fault_proxy(gcs_endpoint)
    again = list_webdataset(f"{prefix}/{SHARDS}", DEFAULT_IMAGE_KEYS,
                            store=ObjectStore("gs", {"endpoint_url": proxy.endpoint}))
    assert proxy.requests == {"GET": 3 + 1}  # ceil(9 / 3) LIST pages, the manifest (indexes: the listing cache's)
    assert again.paths == first.paths and again.shards.etags == first.shards.etags
    assert all(etag and etag.isdigit() for etag in again.shards.etags)  # each shard's generation


def test_listing_thousands_of_gs_objects_takes_a_request_per_thousand_not_a_head_each(gcs_endpoint, fault_proxy):
    count = 2100
    names = [f"many/part-{n:05d}.tar" for n in range(count)]
    fs = gcs_filesystem(gcs_endpoint)
    fs.mkdir("many-bucket")
    fs.pipe({f"many-bucket/{name}": b"x" * (n % 7 + 1) for n, name in enumerate(names)})
    proxy = fault_proxy(gcs_endpoint)
    store = ObjectStore("gs", {"endpoint_url": proxy.endpoint})
    urls = [f"gs://many-bucket/{name}" for name in names] + ["gs://many-bucket/many/part-99999.tar"]
    found = store.listed(urls)
    assert proxy.requests == {"GET": math.ceil(count / storage.LIST_PAGE)}  # 3 LIST pages, not 2,101 HEADs
    assert [info.size for info in found[:count]] == [n % 7 + 1 for n in range(count)]
    assert isinstance(found[-1], FetchError) and found[-1].missing and "part-99999.tar does not exist" in str(found[-1])
    proxy.requests.clear()
    assert store.info(urls[:3]) == found[:3]   # a HEAD records what the LIST did: size, generation, time
    assert proxy.requests == {"GET": 3} and all(isinstance(info, ObjectInfo) for info in found[:3])


def test_a_missing_gs_bucket_is_named_for_each_shard(gcs_endpoint):
    with pytest.raises(SourceError, match=r"gs://no-such-bucket/train/train-000001.tar: LIST gs://no-such-bucket/"
                                          r"train/train-00000: gs://no-such-bucket does not exist \(404\)"):
        list_webdataset("gs://no-such-bucket/train/train-{000000..000001}.tar", DEFAULT_IMAGE_KEYS,
                        store=ObjectStore("gs"))


def replaced_loader(gcs_endpoint: str, local_shards, bucket: str):
    """A loader over shards in ``bucket`` whose first shard is written again after the listing."""
    prefix = upload_folder_to_gcs(gcs_endpoint, local_shards, bucket, "train")
    loader = build_loader(TRAIN, "torchvision", overrides=overrides(
        f"{prefix}/{SHARDS}", **{"loader.shuffle": False, "loader.workers": 0}))
    gcs_filesystem(gcs_endpoint).pipe_file(f"{bucket}/train/train-000000.tar",
                                           (local_shards / "train-000001.tar").read_bytes())
    return loader


def test_a_gs_object_written_again_after_listing_is_an_error_naming_it(gcs_endpoint, local_shards):
    loader = replaced_loader(gcs_endpoint, local_shards, "replaced-bucket")
    with pytest.raises(SampleError) as info:
        next(iter(loader))
    loader.close()
    assert "gs://replaced-bucket/train/train-000000.tar changed since it was listed" in info.value.reason


def test_without_gcsfs_gs_and_gcs_urls_name_the_gcs_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gcsfs", None)
    monkeypatch.setattr(storage, "_stores", {})   # no store made earlier in the session answers instead
    for scheme in ("gs", "gcs"):
        with pytest.raises(StorageError, match=rf"reading {scheme}:// needs the 'gcsfs' package: "
                                               r"pip install 'dali-bridge\[gcs\]'"):
            storage.store_for(f"{scheme}://bucket/train-000000.tar")
    with pytest.raises(SourceError, match=r"source.shards: reading gcs:// needs the 'gcsfs' package"):
        build_loader(TRAIN, "torchvision", overrides=overrides(f"gcs://bucket/{SHARDS}"))


def test_a_gcs_token_is_sent_but_never_appears_in_errors_logs_or_show(gcs_endpoint, gs_shards, local_shards,
                                                                      monkeypatch, caplog, capsys,
                                                                      write_pipeline, private_listing_cache):
    import fsspec.config


    # A raw OAuth token as FSSPEC_GS_TOKEN would give it (storage_options refuse credentials);
    # FETCH_RAW_TOKEN_EXPIRY=false: gcsfs does not ask Google's tokeninfo endpoint about it.
    monkeypatch.setenv("FSSPEC_GS_TOKEN", PLANTED_TOKEN)
    monkeypatch.setenv("FETCH_RAW_TOKEN_EXPIRY", "false")
    for protocol in gcs_fixtures.PROTOCOLS:
        monkeypatch.setitem(fsspec.config.conf, protocol, {"token": PLANTED_TOKEN, "project": "dali-bridge-tests"})
    monkeypatch.setattr(storage, "_stores", {})
    shown: list[str] = []
    with caplog.at_level(logging.DEBUG, logger="dali_bridge"):
        loader = replaced_loader(gcs_endpoint, local_shards, "token-bucket")
        sent = loader.listing.shards.store._filesystem().credentials.credentials.token
        shown.append(first_batch_error(loader))
        shown.append(gone_then_shown(f"{gs_shards}/{SHARDS}", f"{gs_shards}/{SHARDS}", write_pipeline))
    shown += everything_shown(capsys, caplog, private_listing_cache)
    text = "\n".join(shown)
    assert sent == PLANTED_TOKEN  # the requests carried it
    assert "changed since it was listed" in text and "within source.timeout (1 s)" in text
    assert PLANTED_TOKEN not in text
