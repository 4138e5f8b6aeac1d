"""What a server's answer must be before its bytes are used: a redirect to ``file://`` refused at
once, a redirect to another host refused unless ``source.redirect_hosts`` names it, a ranged
answer holding other bytes than asked (or not saying which) named as the server's error. Servers
on 127.0.0.1 only (tests/helpers/answering_servers.py)."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from dali_bridge import build_loader
from dali_bridge.errors import SourceError
from dali_bridge.spec.pipeline import spec_from_dict
from dali_bridge.spec.problems import SpecError
from tests.helpers import answering_servers, object_storage
from tests.helpers.answering_servers import Behaviour
from tests.helpers.object_storage import (SHARDS, assert_same_batches, batches, first_batch_error, local_batches,
                                          overrides)
from tests.helpers.paths import TRAIN

# The loopback server's and the shards' fixtures, used by name below.
answering_server = answering_servers.answering_server
local_shards, private_listing_cache = object_storage.local_shards, object_storage.private_listing_cache

pytestmark = pytest.mark.slow  # local HTTP servers

pytest.importorskip("aiohttp", reason="the HTTP tests need aiohttp: pip install 'dali-bridge[http]'")


def http_loader(shards: str, **source):
    return build_loader(TRAIN, "torchvision", overrides=overrides(shards, source=source))


def test_a_redirect_to_a_local_file_is_refused_at_once_not_retried_until_the_timeout(local_shards,
                                                                                     answering_server):
    base = answering_server(local_shards, Behaviour(redirect_to="file:///etc"))
    build_loader(TRAIN, "torchvision", overrides=overrides(str(local_shards / SHARDS))).close()  # imports done
    started = time.monotonic()
    with pytest.raises(SourceError) as info:
        http_loader(f"{base}/{SHARDS}", timeout=20)
    assert time.monotonic() - started < 5   # the timeout is 20 s: no attempt was repeated
    message = str(info.value)
    assert "redirected to file:///etc/train-000000.tar, which is not http(s): refused" in message
    assert "attempt" not in message


def test_a_redirect_to_another_host_is_refused_by_default_naming_the_key_that_allows_it(local_shards,
                                                                                         answering_server):
    real = answering_server(local_shards, Behaviour())
    base = answering_server(local_shards, Behaviour(redirect_to=real))
    with pytest.raises(SourceError) as info:
        http_loader(f"{base}/{SHARDS}", timeout=8)
    message = str(info.value)
    assert f"redirected to another host, {real}/train-000000.tar: refused" in message
    assert "source.redirect_hosts" in message


def test_a_redirect_to_a_host_named_in_redirect_hosts_is_followed(local_shards, answering_server):
    target = Behaviour()
    real = answering_server(local_shards, target)
    base = answering_server(local_shards, Behaviour(redirect_to=real.replace("127.0.0.1", "localhost")))
    loader = http_loader(f"{base}/{SHARDS}", redirect_hosts=["localhost"])
    assert_same_batches(batches(loader), local_batches(local_shards, "torchvision"))
    assert any(method == "GET" and "Range" not in path for method, path, _ in target.seen)


def test_credentials_in_the_url_go_only_to_its_own_host_never_across_an_allowed_redirect(local_shards,
                                                                                         answering_server):
    target = Behaviour()
    real = answering_server(local_shards, target)
    start = Behaviour(auth=("reader", "pa55-word"), redirect_to=real)
    base = answering_server(local_shards, start)
    port = real.rsplit(":", 1)[1]
    loader = http_loader(f"{base.replace('://', '://reader:pa55-word@')}/{SHARDS}",
                         redirect_hosts=[f"127.0.0.1:{port}"])
    assert len(batches(loader)) == 8
    assert start.seen and all(auth is not None for _, _, auth in start.seen)
    assert target.seen and all(auth is None for _, _, auth in target.seen)


def test_a_ranged_answer_holding_other_bytes_is_named_as_the_servers_error_not_a_bad_image(local_shards,
                                                                                           answering_server):
    base = answering_server(local_shards, Behaviour(shift=512))
    message = first_batch_error(http_loader(f"{base}/{SHARDS}", timeout=8))
    assert "the server answered bytes" in message and "the server's error" in message
    assert "JPEG" not in message and "image" not in message.split("):", 1)[-1]


def test_a_ranged_answer_without_content_range_is_named_as_the_servers_error(local_shards, answering_server):
    base = answering_server(local_shards, Behaviour(content_range=False))
    message = first_batch_error(http_loader(f"{base}/{SHARDS}", timeout=8))
    assert "carries no Content-Range" in message and "the server's error" in message


def test_redirect_hosts_is_checked_and_applies_to_sources_at_a_url_only(tmp_path: Path):
    def spec(shards: str, hosts):
        return spec_from_dict({"version": 1, "batch_size": 2, "ops": [{"center_crop": {"size": 8}}],
                               "source": {"type": "webdataset", "shards": shards, "redirect_hosts": hosts}})

    assert spec("http://h/s-{0..1}.tar", ["cdn.example.com", "m.example.org:8443"]).source.redirect_hosts == \
        ("cdn.example.com", "m.example.org:8443")
    with pytest.raises(SpecError, match="expected a list of host names"):
        spec("http://h/s-{0..1}.tar", ["https://cdn.example.com/x"])
    with pytest.raises(SpecError, match="'redirect_hosts' applies to a source at a URL"):
        spec(str(tmp_path / "s-{0..1}.tar"), ["cdn.example.com"])
