"""The one scrubber (:func:`dali_bridge.util.urls.redact`): URL userinfo in every form a message may
hold it, signed-URL and credential query parameters, the environment's secrets as a message may
quote them; and :func:`split_userinfo`, which takes credentials out of a URL."""
from __future__ import annotations

import json
from urllib.parse import quote

import pytest

from dali_bridge.util.urls import environment_secrets, redact, split_userinfo, without_userinfo


@pytest.mark.parametrize("text, secret", [
    ("https://user:password1@host/x.tar", "password1"),
    ("s3://AKIAKEY:SECRET/with+slash@bucket/k.tar", "SECRET/with+slash"),
    ("s3:/AKIAKEY:s3cr3tvalue@bucket/k (a URL turned into a path)", "s3cr3tvalue"),
    ("'http://tok3n-only@host/x'", "tok3n-only"),
    ("GET https://u:p%40ss%2Fword@h:8443/a?b=1 failed", "p%40ss%2Fword"),
    ("url='https://u:pw-with-@-inside@host/x'", "pw-with-@-inside"),
    ('Invalid bucket name "AKIAKEY:s3cr3t%2Fkey@bucket": must match', "s3cr3t%2Fkey"),
])
def test_userinfo_is_hidden_in_every_form(text, secret):
    shown = redact(text)
    assert secret not in shown and "***@" in shown


def test_a_port_and_a_path_are_left_alone():
    text = "GET http://127.0.0.1:8080/shards/train-000000.tar bytes 0-9: HTTP 503; mail admin@example.com"
    assert redact(text) == text


@pytest.mark.parametrize("query, secret", [
    ("X-Amz-Signature=0123abcdef", "0123abcdef"),
    ("X-Amz-Credential=AKIDEX%2F2026", "AKIDEX"),
    ("X-Amz-Security-Token=FwoGZXIv", "FwoGZXIv"),
    ("X-Goog-Signature=9f8e7d6c", "9f8e7d6c"),
    ("sig=azureSASsig%3D", "azureSASsig"),
    ("token=ghp_plantedtoken", "ghp_plantedtoken"),
    ("access_token=ya29.planted", "ya29.planted"),
    ("api_key=planted-api-key", "planted-api-key"),
    ("password=hunter2hunter2", "hunter2hunter2"),
])
def test_credential_query_parameters_are_hidden(query, secret):
    shown = redact(f"cannot open https://host/x.parquet?v=2&{query}&part=3: 404")
    assert secret not in shown
    assert "v=2" in shown and "part=3" in shown


def test_the_environments_secrets_are_hidden_as_a_message_may_quote_them(monkeypatch, tmp_path):
    secret = "wJalr/XUtnFEMI+K7MDENG-planted"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "FQoGZXIvYXdzEPlanted")
    monkeypatch.setenv("MY_SERVICE_API_KEY", "sk-planted-api-key")
    monkeypatch.setenv("FSSPEC_GS_TOKEN", "anon")   # too short to be a secret: 'anon' stays readable
    key_file = tmp_path / "key.json"
    private = "-----BEGIN PRIVATE KEY-----\nMIIEplantedprivatekey\n-----END PRIVATE KEY-----\n"
    key_file.write_text(json.dumps({"type": "service_account", "private_key_id": "0f1e2d3c4b5a69788796",
                                    "private_key": private, "client_email": "sa@project.iam"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
    text = (f"raw {secret}; quoted {quote(secret, safe='')}; repr {private!r}; json {json.dumps(private)}; "
            f"FQoGZXIvYXdzEPlanted sk-planted-api-key 0f1e2d3c4b5a69788796 anon")
    shown = redact(text)
    for hidden in (secret, quote(secret, safe=""), "MIIEplantedprivatekey", "FQoGZXIvYXdzEPlanted",
                   "sk-planted-api-key", "0f1e2d3c4b5a69788796"):
        assert hidden not in shown
    assert shown.endswith(" anon") and secret in environment_secrets()


@pytest.mark.parametrize("url, bare, user, password", [
    ("https://alice:s%2Fcret@host:8443/x/{0..3}.tar", "https://host:8443/x/{0..3}.tar", "alice", "s/cret"),
    ("s3://AKIAKEY:abc/def+ghi@bucket/k.tar", "s3://bucket/k.tar", "AKIAKEY", "abc/def+ghi"),
    ("http://token@host/x", "http://host/x", "token", None),
    ("https://host/pkg@1.0/x.tar", "https://host/pkg@1.0/x.tar", None, None),
    ("https://host:8080/a@b.tar", "https://host:8080/a@b.tar", None, None),
    ("/data/a@b/x.tar", "/data/a@b/x.tar", None, None),
])
def test_userinfo_is_split_from_the_url_the_listing_keeps(url, bare, user, password):
    assert split_userinfo(url) == (bare, user, password)
    assert without_userinfo(url) == bare
