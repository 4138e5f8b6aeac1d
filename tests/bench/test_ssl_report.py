"""The benchmarks page's section for ``benchmarks/ssl_views.py``: every candidate with its views per
sample, each goal's ratio per round and whether it is met, the profile side by side, the machine."""
from __future__ import annotations

import json

from dali_bridge.bench.report import render_file
from dali_bridge.bench.ssl_report import SSL_VIEWS_FORMAT


def _report() -> dict:
    window = {"samples": 256, "seconds": 8.0, "cpu_seconds": 10.0, "images_per_s": 32.0, "cpu_ms_per_image": 39.0,
              "load_before": 1.25, "load_after": 2.5}
    candidate = {"images_per_s": 32.0, "images_per_s_min": 30.5, "images_per_s_max": 34.0, "cpu_ms_per_image": 39.0}
    return {"format": SSL_VIEWS_FORMAT, "command": "python benchmarks/ssl_views.py ", "pipeline": "dino_train",
            "data": {"root": "data/sample", "images": 2000},
            "settings": {"batch_size": 32, "warmup": 3, "batches": 8, "rounds": 2},
            "machine": {"cpu_model": "AMD EPYC", "cpu_cores_available": 2, "ram_gib": 23.5, "gpus": [],
                        "versions": {"torch": "2.14", "torchvision": "0.29", "nvidia.dali": "2.4", "lightly": "1.6.0"}},
            "run_s": 250.0, "rounds": [{"lightly": window}, {"lightly": {**window, "load_after": 3.75}}],
            "candidates": {"dino-torchvision": {**candidate, "views_per_sample": 10, "description": "the bridge"},
                           "lightly": {**candidate, "images_per_s": 40.0, "views_per_sample": 10,
                                       "description": "lightly's loader"}},
            "goals": [{"goal": "torchvision backend ≥ 2 × lightly's DataLoader", "numerator": "dino-torchvision",
                       "denominator": "lightly", "bound": 2.0, "kind": "min", "median": 0.8,
                       "per_round": [0.75, 0.85], "cpu_median": 0.74, "met": False}],
            "figures": [{"figure": "decoding once against decoding per view (torchvision)",
                         "numerator": "dino-torchvision", "denominator": "dino-per-view-decode", "median": 1.4,
                         "per_round": [1.3, 1.5], "cpu_median": 1.25}],
            "profile": {"samples": 24, "bridge-torchvision": {"decode": 0.5, "gaussian_blur": 21.0},
                        "lightly": {"decode": 0.9, "GaussianBlur": 3.0, "ColorJitter": 7.0}}}


def test_ssl_views_section_shows_candidates_goals_profile_and_machine(tmp_path):
    path = tmp_path / "ssl_views.json"
    path.write_text(json.dumps(_report()))
    section = render_file(path, out_dir=tmp_path)
    assert section.startswith("## Several views per image: DINO's multi-crop (ssl_views.json)")
    assert "`python benchmarks/ssl_views.py`" in section
    assert ("AMD EPYC, 2 cores, 23.5 GiB RAM, no GPU; torch 2.14, torchvision 0.29, DALI 2.4, lightly 1.6.0. "
            "1-minute load average during the run: 1.25–3.75; the run took 250 s.") in section
    assert "| dino-torchvision | 10 | 32.0 (30.5–34.0) | 39.0 | the bridge |" in section
    assert "| lightly | 10 | 40.0 (30.5–34.0) | 39.0 | lightly's loader |" in section
    assert ("| torchvision backend ≥ 2 × lightly's DataLoader | dino-torchvision / lightly = 0.80 | 0.75, 0.85 | "
            "0.74 | **no** |") in section
    assert ("| decoding once against decoding per view (torchvision) (no goal) | dino-torchvision / "
            "dino-per-view-decode = 1.40 | 1.30, 1.50 | 1.25 | – |") in section
    # each side's stages dearest first, the shorter list padded, then the totals
    assert "| gaussian_blur | 21.00 | ColorJitter | 7.00 |" in section
    assert "| decode | 0.50 | GaussianBlur | 3.00 |" in section
    assert "|  |  | decode | 0.90 |" in section
    assert "| **total** | **21.50** | **total** | **10.90** |" in section


def test_ssl_views_section_without_a_profile_ends_with_the_goals(tmp_path):
    report = _report()
    del report["profile"]
    path = tmp_path / "ssl_views.json"
    path.write_text(json.dumps(report))
    section = render_file(path, out_dir=tmp_path)
    assert "Profile:" not in section and section.rstrip().endswith("| 1.25 | – |")


def _figures(value) -> set[str]:
    """Every number in a JSON value, as 1 and 2 decimals; each profile's total too."""
    if isinstance(value, dict):
        found = set().union(*(_figures(v) for v in value.values())) if value else set()
        if value and all(isinstance(v, float) for v in value.values()):
            found |= _figures(sum(value.values()))
        return found
    if isinstance(value, list):
        return set().union(*(_figures(v) for v in value)) if value else set()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return {f"{value:.1f}", f"{value:.2f}"}
    return set()


def test_the_self_supervised_guide_quotes_only_the_recorded_figures():
    import re

    from tests.helpers.paths import REPO

    recorded = _figures(json.loads((REPO / "benchmarks" / "results" / "ssl_views.json").read_text()))
    guide = (REPO / "docs" / "self-supervised.md").read_text()
    section = guide[guide.index("## Throughput"):]
    quoted = re.findall(r"(?<![\d.])\d+\.\d+(?![\d.])", section)
    assert quoted and [n for n in quoted if n not in recorded] == [], \
        "docs/self-supervised.md quotes figures that benchmarks/results/ssl_views.json does not hold: " \
        "quote the recorded run"
