"""Shared fixtures: a small generated sample set and pipeline files written on the fly."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from tests.helpers.paths import TRAIN


@pytest.fixture
def no_cuda(monkeypatch):
    """The same answers on every host: CUDA switched off through DALI_BRIDGE_DISABLE."""
    from dali_bridge.loader.select import probe

    monkeypatch.setenv("DALI_BRIDGE_DISABLE", "cuda")
    probe.cache_clear()
    yield
    probe.cache_clear()


@pytest.fixture(scope="session")
def sample_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """37 natural-looking JPEGs in 3 classes (an odd count, so partial batches happen)."""
    from dali_bridge.data.sources.synthetic import generate_sample_data

    root = tmp_path_factory.mktemp("samples")
    generate_sample_data(root, images=37, classes=3, seed=1, workers=1)
    return root


@pytest.fixture(scope="session")
def corpus_root(tmp_path_factory: pytest.TempPathFactory, sample_root: Path) -> Path:
    """Every unusual-image corpus kind (grayscale-origin, CMYK, PNG kinds, 1x1 to 4000x3000; one
    class each) plus 10 generated photo-like JPEGs (class 'natural')."""
    import shutil

    from tests.helpers.corpus import write_unusual_images

    root = tmp_path_factory.mktemp("corpus")
    write_unusual_images(root)
    natural = root / "natural"
    natural.mkdir()
    for path in sorted(sample_root.rglob("*.jpg"))[:10]:
        shutil.copy(path, natural / path.name)
    return root


@pytest.fixture
def write_pipeline(tmp_path: Path) -> Callable[..., Path]:
    """Write a pipeline file: a shipped one (by path) with dotted overrides, or raw data."""
    counter = iter(range(10_000))

    def write(base: Path | dict[str, Any] = TRAIN, **overrides: Any) -> Path:
        data = yaml.safe_load(Path(base).read_text()) if not isinstance(base, dict) else dict(base)
        for dotted, value in overrides.items():
            node = data
            parts = dotted.split("__")
            for part in parts[:-1]:
                node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
            last = parts[-1]
            if isinstance(node, list):
                node[int(last)] = value
            else:
                node[last] = value
        path = tmp_path / f"pipeline_{next(counter)}.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    return write


# ---- lifecycle helpers: what a loader leaves behind (Linux /proc)


