"""Overrides change nothing they walk: the data given keeps its containers and values, a failed
override leaves the result as it was, and what no override reaches is shared, not copied."""
from __future__ import annotations

import copy

from dali_bridge.spec.overrides import SetFlags, apply_overrides
from dali_bridge.spec.pipeline import spec_from_dict

DATA = {
    "version": 1,
    "source": {"type": "folder", "root": "images"},
    "batch_size": 8,
    "ops": [{"resize": [256, 256]}, "horizontal_flip", {"center_crop": {"size": 224}}],
    "loader": {"workers": 0, "shuffle": False},
}


def test_apply_overrides_leaves_the_data_it_walks_unchanged():
    data = copy.deepcopy(DATA)
    overrides = {"ops.0.resize.size": [320, 320], "ops.-2.horizontal_flip.p": 0.25, "loader.prefetch": 4,
                 "source.cache.dir": "/tmp/cache", "batch_size": 16}
    result, origin, problems = apply_overrides(data, overrides)
    assert not problems
    assert data == DATA
    assert result["ops"][:2] == [{"resize": {"size": [320, 320]}}, {"horizontal_flip": {"p": 0.25}}]
    assert result["source"] == {"type": "folder", "root": "images", "cache": {"dir": "/tmp/cache"}}
    assert (result["loader"]["prefetch"], result["batch_size"]) == (4, 16)
    assert set(origin) == {("ops", 0, "resize", "size"), ("ops", 1, "horizontal_flip", "p"),
                           ("loader", "prefetch"), ("source", "cache", "dir"), ("batch_size",)}


def test_a_failed_override_leaves_the_result_as_it_was():
    data = copy.deepcopy(DATA)
    result, origin, problems = apply_overrides(data, SetFlags({"ops.0.resize.size.height": 300}))
    assert [(p.path, p.message) for p in problems] == [("ops[0].resize.size.height",
                                                        "cannot address 'height' inside a list")]
    assert problems[0].where == "--set ops.0.resize.size.height=300"
    assert result == DATA and not origin  # the shorthand item reached on the way is as written


def test_apply_overrides_shares_what_no_override_reaches():
    result = apply_overrides(DATA, {"ops.2.center_crop.size": 192})[0]
    assert result["source"] is DATA["source"] and result["loader"] is DATA["loader"]
    assert result["ops"][0] is DATA["ops"][0]
    assert result["ops"] is not DATA["ops"] and result["ops"][2] is not DATA["ops"][2]


def test_a_spec_keeps_none_of_the_callers_containers():
    data = copy.deepcopy(DATA)
    spec = spec_from_dict(data, overrides={"batch_size": 4})
    data["ops"][0]["resize"].append(1)
    data["source"]["root"] = "elsewhere"
    assert spec.ops[0].params["size"] == [256, 256]
    assert spec.source.root.endswith("images")
