"""A bucket in another region: S3's answer saying so (301 PermanentRedirect, 400
AuthorizationHeaderMalformed, 400 IllegalLocationConstraintException) is an error at its first
occurrence on every request kind — LIST, HEAD, a ranged GET through the presigned URL, a whole
GET, a cache download, a glob — naming the URL, the bucket's region and the setting to change;
never retried until ``source.timeout`` runs out. Another 400 (S3's RequestTimeout) is still
retried. The endpoint is a loopback server answering as S3 does (tests/helpers/region_servers.py)
in front of moto's S3."""
# ruff: noqa: F811 (the loopback fixtures imported from tests.helpers are named again as the tests' parameters)
from __future__ import annotations

import time
from pathlib import Path

import pytest

from dali_bridge import build_loader
from dali_bridge.data.storage.listing import FetchError
from dali_bridge.data.storage.regions import answer_from_xml, is_wrong_region, wrong_region_message
from dali_bridge.data.storage.store import ObjectStore, Range
from dali_bridge.errors import SampleError, SourceError
from dali_bridge.util.urls import StorageError
from tests.helpers import region_servers, s3_fixtures
from tests.helpers.object_storage import SHARDS, overrides
from tests.helpers.paths import TRAIN
from tests.helpers.region_servers import (ANSWERS, BUCKET_REGION, OPT_IN_REGION, TRANSIENT_400, WrongRegionEndpoint,
                                          wrong_region_answer)
from tests.helpers.s3_fixtures import upload_folder
# fixtures, used by name
from tests.helpers.object_storage import local_shards, private_listing_cache  # noqa: F401

moto_endpoint, wrong_region = s3_fixtures.moto_endpoint, region_servers.wrong_region

TIMEOUT = 60.0   # the source's timeout: the error must come long before it
PROMPT = 10.0    # what "at once" is allowed, on a loaded machine
OBJECT = "s3://region-bucket/d/object.bin"


@pytest.fixture(scope="module")
def region_bucket(moto_endpoint: str) -> str:
    client = s3_fixtures.s3_client(moto_endpoint)
    client.create_bucket(Bucket="region-bucket")
    client.put_object(Bucket="region-bucket", Key="d/object.bin", Body=bytes(range(256)) * 4)
    return OBJECT


def region_of(answer: str) -> str:
    return OPT_IN_REGION if answer == "IllegalLocationConstraintException" else BUCKET_REGION


def assert_names_the_region_and_what_to_set(message: str, url: str, region: str) -> None:
    assert url in message, message
    assert f"the bucket s3://region-bucket is in region {region}, not us-east-1 where this client asks" in message
    assert f"AWS_DEFAULT_REGION={region}" in message
    assert f"source.storage_options: {{client_kwargs: {{region_name: {region}}}}}" in message
    assert "AWS_ENDPOINT_URL or storage_options.endpoint_url" in message, message


def assert_asked_once(server: WrongRegionEndpoint, kind: str, answer: str) -> None:
    """One request of ``kind`` signed as the client signs (no retry), and at most one more: botocore's
    own region redirect, signed for the region the answer named."""
    seen = server.answered(kind)
    ours = [one for one in seen if one.signed_for != region_of(answer)]
    assert len(ours) == 1 and len(seen) - len(ours) <= 1, seen


REQUESTS = {
    "list": lambda store: store.listed([OBJECT])[0],
    "head": lambda store: store.info([OBJECT])[0],
    "ranged": lambda store: store.fetch([Range(OBJECT, 16, 32)])[0],
    "whole": lambda store: store.get([OBJECT])[0],
}


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize("kind", sorted(REQUESTS))
def test_a_bucket_in_another_region_is_an_error_at_the_first_answer_of_each_request_kind(
        region_bucket, moto_endpoint, wrong_region, kind, answer):
    server = wrong_region(moto_endpoint, answer, kinds=(kind,))
    store = ObjectStore("s3", {"endpoint_url": server.endpoint}, timeout=TIMEOUT)
    started = time.monotonic()
    failed = REQUESTS[kind](store)
    assert time.monotonic() - started < PROMPT
    assert isinstance(failed, FetchError) and not failed.missing
    assert_names_the_region_and_what_to_set(failed.reason, OBJECT, region_of(answer))
    assert_asked_once(server, kind, answer)


def test_another_400_is_still_retried_within_the_timeout(region_bucket, moto_endpoint, wrong_region):
    server = wrong_region(moto_endpoint, TRANSIENT_400, kinds=("ranged",))
    failed = ObjectStore("s3", {"endpoint_url": server.endpoint}, timeout=1.0).fetch([Range(OBJECT, 0, 8)])[0]
    assert isinstance(failed, FetchError) and "within source.timeout (1 s)" in failed.reason
    assert len(server.answered("ranged")) >= 3 and "is in region" not in failed.reason


def test_an_http_301_without_a_location_is_not_retried(region_bucket, moto_endpoint, wrong_region):
    server = wrong_region(moto_endpoint, "PermanentRedirect", kinds=("ranged",))
    url = f"{server.endpoint}/region-bucket/d/object.bin"
    failed = ObjectStore("http", timeout=TIMEOUT).fetch([Range(url, 0, 8)])[0]
    assert isinstance(failed, FetchError)
    assert f"{url} has moved permanently (301) and the server does not say where (no Location)" in failed.reason
    assert len(server.answered("ranged")) == 1


def test_a_cache_download_of_a_bucket_in_another_region_fails_at_once(region_bucket, moto_endpoint, wrong_region,
                                                                       tmp_path):
    server = wrong_region(moto_endpoint, "PermanentRedirect", kinds=("ranged",))
    store = ObjectStore("s3", {"endpoint_url": server.endpoint}, timeout=TIMEOUT)
    started = time.monotonic()
    with pytest.raises(StorageError) as info:
        store.download(OBJECT, str(tmp_path / "object.bin"), 1024)
    assert time.monotonic() - started < PROMPT
    assert_names_the_region_and_what_to_set(str(info.value), OBJECT, BUCKET_REGION)
    assert len(server.answered("ranged")) == 1


def test_a_glob_in_a_bucket_in_another_region_names_the_region(region_bucket, moto_endpoint, wrong_region):
    server = wrong_region(moto_endpoint, "PermanentRedirect", kinds=("list", "head"))
    store = ObjectStore("s3", {"endpoint_url": server.endpoint}, timeout=TIMEOUT)
    started = time.monotonic()
    with pytest.raises(StorageError) as info:
        store.glob("s3://region-bucket/d/*.bin")
    assert time.monotonic() - started < PROMPT
    message = str(info.value)
    assert "cannot list s3://region-bucket/d/*.bin" in message
    assert f"the bucket s3://region-bucket is in region {BUCKET_REGION}" in message
    assert f"AWS_DEFAULT_REGION={BUCKET_REGION}" in message


# ---- the loader


@pytest.fixture(scope="module")
def region_shards(moto_endpoint: str, local_shards: Path) -> str:
    return upload_folder(moto_endpoint, local_shards, "region-bucket", "train")


def loader_over(server: WrongRegionEndpoint, shards: str, **source):
    return build_loader(TRAIN, "torchvision", overrides=overrides(
        f"{shards}/{SHARDS}", source={"storage_options": {"endpoint_url": server.endpoint}, "timeout": TIMEOUT,
                                      **source},
        **{"loader.shuffle": False, "loader.workers": 0}))


@pytest.mark.slow   # a loader over moto's S3
@pytest.mark.parametrize("answer", ANSWERS)
def test_the_loaders_first_batch_fails_at_once_naming_the_region(region_shards, moto_endpoint, wrong_region, answer):
    server = wrong_region(moto_endpoint, answer, kinds=("ranged",))   # listed through moto; every sample refused
    loader = loader_over(server, region_shards)
    started = time.monotonic()
    with pytest.raises(SampleError) as info:
        next(iter(loader))
    loader.close()
    assert time.monotonic() - started < PROMPT
    assert_names_the_region_and_what_to_set(info.value.reason, f"{region_shards}/train-000000.tar", region_of(answer))
    asked = [(one.path, one.range) for one in server.answered("ranged")]
    assert asked and len(asked) == len(set(asked)), asked   # no sample's GET asked twice


@pytest.mark.slow   # a loader over moto's S3
def test_a_cached_loaders_first_batch_fails_at_once_naming_the_region(region_shards, moto_endpoint, wrong_region,
                                                                       tmp_path):
    server = wrong_region(moto_endpoint, "PermanentRedirect", kinds=("ranged",))
    loader = loader_over(server, region_shards, cache={"dir": str(tmp_path / "cache"), "max_bytes": "1GB"})
    started = time.monotonic()
    with pytest.raises((SampleError, StorageError)) as info:
        next(iter(loader))
    loader.close()
    assert time.monotonic() - started < PROMPT
    assert_names_the_region_and_what_to_set(str(info.value), f"{region_shards}/train-000000.tar", BUCKET_REGION)
    # One download when the batch's shards are brought in (its failure left to the samples' reads), one
    # when the first sample is read: each a single request, neither retried.
    asked = [(one.path, one.range) for one in server.answered("ranged")]
    assert asked == [("/region-bucket/train/train-000000.tar", asked[0][1])] * len(asked) and len(asked) <= 2, asked


@pytest.mark.slow   # a loader over moto's S3
@pytest.mark.parametrize("answer", ANSWERS)
def test_listing_shards_in_a_bucket_in_another_region_fails_at_once(region_shards, moto_endpoint, wrong_region,
                                                                      answer):
    server = wrong_region(moto_endpoint, answer)
    started = time.monotonic()
    with pytest.raises(SourceError) as info:
        loader_over(server, region_shards)
    assert time.monotonic() - started < PROMPT
    message = str(info.value)
    assert "4 of 4 shard(s) cannot be listed" in message
    assert_names_the_region_and_what_to_set(message, f"LIST {region_shards}/train-00", region_of(answer))
    assert "check the endpoint" not in message   # the region's advice, not the generic one
    assert_asked_once(server, "list", answer)


# ---- reading S3's answers


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize("presigned", [False, True])
def test_each_wrong_region_answer_as_s3_sends_it_names_the_buckets_region(answer, presigned):
    status, headers, body = wrong_region_answer(answer, "GET", "region-bucket", "us-east-1", presigned=presigned)
    read = answer_from_xml(status, headers, body)
    assert read.region == region_of(answer) and is_wrong_region(read, "us-east-1")
    del headers["x-amz-bucket-region"]   # the body alone says where
    read = answer_from_xml(status, headers, body)
    assert read.region == region_of(answer) and is_wrong_region(read, "us-east-1")
    assert read.code == ("AuthorizationQueryParametersError" if presigned and answer == "AuthorizationHeaderMalformed"
                         else answer)


@pytest.mark.parametrize("answer", ANSWERS)
def test_a_head_answer_says_the_region_in_its_header_only(answer):
    status, headers, body = wrong_region_answer(answer, "HEAD", "region-bucket", "us-east-1", presigned=False)
    assert body == b""
    read = answer_from_xml(status, headers, body)
    assert read.region == region_of(answer) and is_wrong_region(read, "us-east-1")
    del headers["x-amz-bucket-region"]   # a 301 says it all the same; a bare 400 without it says nothing
    assert is_wrong_region(answer_from_xml(status, headers, body), "us-east-1") == (status == 301)


def test_a_bare_400_is_a_region_error_only_when_its_region_header_differs_from_the_clients():
    assert is_wrong_region(answer_from_xml(400, {"x-amz-bucket-region": "eu-west-1"}, b""), "us-east-1")
    assert not is_wrong_region(answer_from_xml(400, {"x-amz-bucket-region": "us-east-1"}, b""), "us-east-1")
    assert not is_wrong_region(answer_from_xml(400, {}, b""), "us-east-1")
    status, headers, body = wrong_region_answer(TRANSIENT_400, "GET", "region-bucket", "us-east-1", presigned=False)
    assert not is_wrong_region(answer_from_xml(status, headers, body), "us-east-1")
    assert not is_wrong_region(answer_from_xml(400, {}, b"<html>proxy error</html>"), "us-east-1")


def test_a_301_that_names_no_region_still_says_what_to_set_and_quotes_nothing_unchecked():
    body = (b"<Error><Code>PermanentRedirect</Code><Message>Moved &#x202E;elsewhere</Message>"
            b"<Region>eu-west-1 or anywhere</Region><Endpoint>a host/with a path</Endpoint></Error>")
    read = answer_from_xml(301, {}, body)
    assert read.region is None and read.endpoint is None and is_wrong_region(read, "us-east-1")
    message = wrong_region_message(read, "s3://region-bucket", "us-east-1")
    assert message.startswith("S3 answered 301 PermanentRedirect: 'Moved \\u202eelsewhere' — the bucket "
                              "s3://region-bucket is not served by this endpoint in this region"), message
    assert "AWS_DEFAULT_REGION or source.storage_options: {client_kwargs: {region_name: ...}}" in message
    assert "AWS_ENDPOINT_URL or storage_options.endpoint_url" in message and "\u202e" not in message


def test_a_malformed_signature_naming_no_region_says_to_check_the_region_and_the_credentials():
    body = (b"<Error><Code>AuthorizationHeaderMalformed</Code><Message>The authorization header is malformed; a "
            b"non-empty Access Key (AKID) must be provided in the credential.</Message></Error>")
    read = answer_from_xml(400, {}, body)
    assert read.region is None and is_wrong_region(read, "us-east-1")
    message = wrong_region_message(read, "s3://region-bucket", "us-east-1")
    assert "a non-empty Access Key (AKID) must be provided" in message
    assert "check the region (AWS_DEFAULT_REGION" in message and "the credentials (AWS_* variables" in message


def test_a_301_for_the_region_the_client_asks_in_says_to_set_that_regions_endpoint():
    read = answer_from_xml(301, {"x-amz-bucket-region": "us-east-1"}, b"")
    message = wrong_region_message(read, "s3://region-bucket", "us-east-1")
    assert message == ("the bucket s3://region-bucket is in region us-east-1, but the endpoint asked does not serve it "
                       "(S3 answered 301): set an endpoint of us-east-1 (AWS_ENDPOINT_URL or "
                       "storage_options.endpoint_url: https://s3.us-east-1.amazonaws.com)")
