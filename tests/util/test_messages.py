"""The one path out for messages (:mod:`dali_bridge.util.messages`): the package's errors scrubbed
when made, the package logger's records scrubbed before any handler sees them, a command's
streams scrubbed line by line; and every module logging through that logger."""
from __future__ import annotations

import io
import logging
import pickle
import re
from pathlib import Path

import pytest

import dali_bridge
from dali_bridge.errors import ImageError, RecipeError, SampleError, SourceError
from dali_bridge.spec.problems import Problem, SpecError
from dali_bridge.util.messages import ScrubbedStream, package_log, scrubbed_output
from dali_bridge.util.urls import StorageError

URL = "https://reader:pl4nted-pw@host/s-000000.tar"


@pytest.mark.parametrize("make", [
    lambda: ImageError(f"cannot read {URL}"),
    lambda: SourceError(f"source.shards: {URL} does not exist"),
    lambda: SampleError(3, URL + "#a.jpg", f"GET {URL}?X-Amz-Signature=pl4nted-sig failed"),
    lambda: RecipeError([f"cannot convert {URL}"]),
    lambda: StorageError(f"cannot open {URL}"),
    lambda: SpecError([Problem(f"--set source.shards={URL}", "source.shards", f"folder {URL} does not exist")]),
])
def test_the_packages_errors_hold_no_credential_in_str_repr_args_or_pickle(make):
    error = make()
    for text in (str(error), repr(error), repr(error.args), repr(pickle.loads(pickle.dumps(error)).args)):
        assert "pl4nted" not in text
    assert "host/s-000000.tar" in str(error)


def test_log_records_are_scrubbed_before_any_handler_sees_them():
    log = package_log()
    seen = io.StringIO()
    handler = logging.StreamHandler(seen)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    try:
        log.warning("skipped %s: %s", URL, "token=pl4nted-token")
        try:
            raise OSError(f"connection to {URL} reset")
        except OSError:
            log.exception("reading %s", URL)
    finally:
        log.removeHandler(handler)
    assert "pl4nted" not in seen.getvalue()
    assert "reset" in seen.getvalue() and "host/s-000000.tar" in seen.getvalue()


def test_a_commands_streams_are_scrubbed_line_by_line_even_when_a_secret_spans_two_writes(capsys):
    with scrubbed_output():
        import sys

        sys.stdout.write("https://reader:pl4nted")
        sys.stdout.write("-pw@host/x\n")
        print(URL, file=sys.stderr)
        sys.stdout.write("pending " + URL)   # no newline: written out at the end
    out, err = capsys.readouterr()
    assert "pl4nted" not in out + err and out.endswith("pending https://***@host/s-000000.tar")


def test_the_stream_keeps_the_wrapped_streams_attributes():
    raw = io.StringIO()
    stream = ScrubbedStream(raw)
    assert stream.isatty() is False and stream.getvalue() == ""


def test_every_module_logs_through_the_scrubbing_package_logger():
    package = Path(dali_bridge.__file__).parent
    direct = [str(path.relative_to(package)) for path in package.rglob("*.py")
              if re.search(r"logging\.getLogger\(", path.read_text(encoding="utf-8"))
              and path.name != "messages.py"]
    assert direct == [], f"log through dali_bridge.util.messages.package_log() instead: {direct}"
