"""The schema of the pipeline keys (spec/keys.py) is the one home of each key: validation accepts
exactly its keys and fills in its defaults, the reference page documents each of them, and a change
to an entry changes what validation does and what the page says."""
from __future__ import annotations

import dataclasses
import re

import pytest

from dali_bridge.spec import keys, reference
from dali_bridge.spec.model import LoaderSpec, SourceSpec
from dali_bridge.spec.pipeline import PipelineSpec, spec_from_dict
from dali_bridge.ops.base import REQUIRED
from dali_bridge.spec.problems import SpecError

BASE = {"version": 1, "source": {"type": "folder", "root": "/nonexistent"}, "batch_size": 2,
        "ops": [{"center_crop": 8}]}
# One minimal source of each type, the remote ones at a URL so that their object-storage keys apply.
SOURCES = {
    "folder": {"type": "folder", "root": "/nonexistent"},
    "file_list": {"type": "file_list", "file_list": "/nonexistent/list.txt"},
    "webdataset": {"type": "webdataset", "shards": "s3://bucket/train-{0..3}.tar"},
    "parquet": {"type": "parquet", "files": "gs://bucket/train.parquet"},
}
# The spec field a key fills where it is not the key's own name.
_FIELDS = {"source.image_key": "image_keys", "source.cache": "cache_dir", "decode.device": "decode_device",
           "target.label_smoothing": "label_smoothing"}


def _problems(data: dict) -> list[str]:
    with pytest.raises(SpecError) as caught:
        spec_from_dict(data)
    return [f"{p.path}: {p.message}" for p in caught.value.problems]


def _listed_as_expected(data: dict, at: str) -> list[str]:
    """The keys the unknown-key message at ``at`` lists: what validation accepts there."""
    message = next(p for p in _problems(data) if p.startswith(f"{at}: unknown key 'zzz'"))
    return re.search(r"expected one of: ([^)]*)\)", message).group(1).split(", ")


def _accepted_keys() -> set[str]:
    """Every dotted key validation accepts, read from its own unknown-key messages."""
    accepted = set()
    for name in _listed_as_expected({**BASE, "zzz": 1}, "zzz"):
        if name not in ("source", "decode", "target", "loader"):
            accepted.add(name)
    for section in ("decode", "target", "loader"):
        accepted |= {f"{section}.{name}" for name in _listed_as_expected({**BASE, section: {"zzz": 1}},
                                                                          f"{section}.zzz")}
    for source in SOURCES.values():
        accepted |= {f"source.{name}" for name in _listed_as_expected({**BASE, "source": {**source, "zzz": 1}},
                                                                       "source.zzz")}
    return accepted


def _field(name: str) -> str:
    return _FIELDS.get(name, name.rsplit(".", 1)[-1])


def _filled_in(spec: PipelineSpec, name: str):
    holder = {"source": spec.source, "loader": spec.loader}.get(name.split(".")[0], spec)
    return getattr(holder, _field(name))


def test_validation_accepts_exactly_the_schemas_keys_and_the_page_documents_each():
    assert _accepted_keys() == set(keys.KEYS)
    page = reference.render_reference()
    for name in keys.KEYS:
        assert f"| `{name}` |" in page, name
    assert reference.documented_keys() == list(keys.KEYS)


def test_the_schema_defaults_are_what_validation_fills_in():
    specs = {stype: spec_from_dict({**BASE, "source": source}) for stype, source in SOURCES.items()}
    checked = set()
    for key in keys.KEYS.values():
        if key.default is REQUIRED or key.required_for:
            continue
        for stype, spec in specs.items():
            if key.path != ("source",) or key.leaf in keys.SOURCE_KEYS[stype]:
                assert _filled_in(spec, key.name) == key.default, (key.name, stype)
                checked.add(key.name)
    assert len(checked) == sum(1 for k in keys.KEYS.values() if k.default is not REQUIRED and not k.required_for)


def test_the_settings_dataclasses_take_their_defaults_from_the_schema():
    source, loader = SourceSpec(type="folder"), LoaderSpec()
    for field in dataclasses.fields(LoaderSpec):
        assert getattr(loader, field.name) == keys.default_of(f"loader.{field.name}"), field.name
    for key in keys.KEYS.values():
        if key.path == ("source",) and key.leaf != "type":
            assert getattr(source, _field(key.name)) == key.default, key.name


@pytest.mark.parametrize("key", [k for k in keys.KEYS.values() if k.default is REQUIRED or k.required_for],
                         ids=lambda k: k.name)
def test_a_required_key_left_out_is_reported_missing(key):
    data = {**BASE, "source": dict(SOURCES[key.required_for or "folder"])}
    holder = data["source"] if key.path == ("source",) else data
    del holder[key.leaf]
    assert any(f"missing required key '{key.name}'" in problem for problem in _problems(data))


def _changed(monkeypatch, name: str, **fields) -> None:
    monkeypatch.setitem(keys.KEYS, name, dataclasses.replace(keys.KEYS[name], **fields))


def _row(name: str) -> str:
    return next(line for line in reference.render_reference().splitlines() if line.startswith(f"| `{name}` |"))


def test_a_changed_default_changes_validation_and_the_page(monkeypatch):
    _changed(monkeypatch, "loader.prefetch", default=5)
    assert spec_from_dict(BASE).loader.prefetch == 5
    assert _row("loader.prefetch").startswith("| `loader.prefetch` | integer >= 1 | `5` |")


def test_a_changed_range_changes_validation_and_the_page(monkeypatch):
    _changed(monkeypatch, "seed", maximum=keys.Bound(1000, "a test's bound"))
    assert _problems({**BASE, "seed": 1001}) == ["seed: expected an integer >= 0, at most 1000 (a test's bound), "
                                                 "found 1001"]
    assert spec_from_dict({**BASE, "seed": 1000}).seed == 1000
    assert "| integer from 0 to 1000 |" in _row("seed")
    _changed(monkeypatch, "source.timeout", interval=keys.Interval(0, 10, "(]"))
    webdataset = {**BASE, "source": {**SOURCES["webdataset"], "timeout": 11}}
    assert _problems(webdataset) == ["source.timeout: expected seconds in (0, 10], found 11"]
    assert "| seconds in (0, 10] |" in _row("source.timeout")


def test_changed_choices_change_validation_and_the_page(monkeypatch):
    _changed(monkeypatch, "parity", choices=("exact", "fast", "fastest"))
    assert spec_from_dict({**BASE, "parity": "fastest"}).parity == "fastest"
    assert "| `exact` \\| `fast` \\| `fastest` |" in _row("parity")
    _changed(monkeypatch, "outputs", default=("image",))
    assert spec_from_dict(BASE).outputs == ("image",)
    assert "| `[image]` |" in _row("outputs")
