"""A pipeline with views back as transforms.v2: one Compose per view, each with its view's settings."""
from __future__ import annotations

from dali_bridge import load_spec, to_torchvision


def test_a_pipeline_with_views_gives_one_compose_per_view_with_its_own_settings():
    composes = to_torchvision(load_spec("dino_train"))
    assert len(composes) == 10
    solarize = [[t.p for t in compose.transforms if type(t).__name__ == "RandomSolarize"] for compose in composes]
    assert solarize[:2] == [[0.0], [0.2]] and solarize[2:] == [[]] * 8
    sizes = [compose.transforms[0].size for compose in composes]
    assert sizes == [[224, 224]] * 2 + [[96, 96]] * 8
