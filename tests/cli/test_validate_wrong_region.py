"""``dali-bridge validate`` of a pipeline whose S3 bucket is in another region than the client
asks in: it fails at once (well within ``source.timeout``) with the bucket's region and the
setting to change, positioned at the source's key, for shards (a LIST), Parquet files and a file
list (HEADs) — one request each, not retried. The endpoint is a loopback server answering as S3
does for a bucket of another region (tests/helpers/region_servers.py), in front of moto's S3."""
# ruff: noqa: F811 (the loopback fixtures imported from tests.helpers are named again as the tests' parameters)
from __future__ import annotations

import collections
import time

import pytest

from dali_bridge.cli.main import main
from dali_bridge.cli.options import EXIT_INVALID
from tests.helpers import region_servers, remote_sources, s3_fixtures
from tests.helpers.paths import TRAIN
from tests.helpers.region_servers import ANSWERS, BUCKET_REGION, OPT_IN_REGION
from tests.helpers.remote_sources import remote_source

moto_endpoint, wrong_region = s3_fixtures.moto_endpoint, region_servers.wrong_region
local_tree, s3_tree = remote_sources.local_tree, remote_sources.s3_tree

TIMEOUT = 60   # the source's timeout: validate must answer long before it
PROMPT = 10.0
KEYS = {"shards": "shards:", "parquet": "files:", "file_list": "file_list:"}


def _line_of(path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), start=1) if text in line)


@pytest.mark.parametrize("answer", ANSWERS)
@pytest.mark.parametrize("kind", sorted(KEYS))
def test_validate_names_the_buckets_region_at_once_at_the_sources_key(s3_tree, moto_endpoint, wrong_region,
                                                                      write_pipeline, capsys, kind, answer):
    server = wrong_region(moto_endpoint, answer)
    region = OPT_IN_REGION if answer == "IllegalLocationConstraintException" else BUCKET_REGION
    source = remote_source(kind, s3_tree, storage_options={"endpoint_url": server.endpoint}, timeout=TIMEOUT)
    path = write_pipeline(TRAIN, source=source, batch_size=5, loader__workers=1)
    started = time.monotonic()
    assert main(["validate", str(path)]) == EXIT_INVALID
    assert time.monotonic() - started < PROMPT
    err = capsys.readouterr().err
    assert f"{path}:{_line_of(path, KEYS[kind])}:" in err, err
    assert "s3://remote-sources" in err
    assert f"the bucket s3://remote-sources is in region {region}, not us-east-1 where this client asks" in err, err
    assert f"AWS_DEFAULT_REGION={region} or source.storage_options: {{client_kwargs: {{region_name: {region}}}}}" in err
    assert "check the endpoint" not in err   # the region's own advice, not the generic one
    # Each object or LIST asked once as the client signs; botocore's own redirect may ask once more,
    # signed for the region the answer named.
    asked = collections.Counter((one.kind, one.path) for one in server.seen if one.signed_for != region)
    assert asked and max(asked.values()) == 1, server.seen
    assert len(server.seen) <= 2 * len(asked), server.seen
