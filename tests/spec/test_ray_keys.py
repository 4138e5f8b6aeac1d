"""``loader.executor: ray`` and ``loader.ray``: what validation accepts, refuses with the field named,
and writes back."""
from __future__ import annotations

import pytest

from dali_bridge.spec.model import RaySettings
from dali_bridge.spec.pipeline import spec_from_dict
from dali_bridge.spec.problems import SpecError

BASE = {"version": 1, "source": {"type": "folder", "root": "/nonexistent"}, "batch_size": 2,
        "ops": [{"center_crop": 8}]}


def loader(**keys) -> dict:
    return {**BASE, "loader": {"executor": "ray", **keys}}


def problems(data: dict) -> list[str]:
    with pytest.raises(SpecError) as caught:
        spec_from_dict(data)
    return [f"{p.path}: {p.message}" for p in caught.value.problems]


def test_the_ray_settings_default_to_a_local_cluster_and_auto_bounds():
    spec = spec_from_dict(loader())
    assert spec.loader.executor == "ray" and spec.loader.ray is None


@pytest.mark.parametrize("address", ["auto", "ray://head.example:10001", "10.0.0.5:6379", "ray://[::1]:10001", None])
def test_every_kind_of_address_is_accepted_and_written_back(address):
    spec = spec_from_dict(loader(ray={"address": address, "cpus": 8, "batches_in_flight": "auto"}))
    assert spec.loader.ray == RaySettings(address=address, cpus=8, batches_in_flight=None)
    assert spec_from_dict(spec.to_dict()).loader.ray == spec.loader.ray


@pytest.mark.parametrize("settings, field, expected", [
    ({"address": "head"}, "loader.ray.address", "expected auto, ray://host:port"),
    ({"address": 6379}, "loader.ray.address", "found an integer 6379"),
    ({"cpus": 0}, "loader.ray.cpus", "expected an integer >= 1"),
    ({"batches_in_flight": 5000}, "loader.ray.batches_in_flight", "at most 1024"),
    ({"adress": "auto"}, "loader.ray", "unknown key 'adress'"),
])
def test_a_bad_ray_setting_is_refused_naming_its_field(settings, field, expected):
    found = problems(loader(ray=settings))
    assert any(line.startswith(field) and expected in line for line in found), found


def test_the_ray_settings_must_be_a_mapping():
    assert any("expected the Ray settings as a mapping" in line for line in problems(loader(ray="auto")))
