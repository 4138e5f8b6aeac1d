"""What the object-storage tests share: the local shards, two epochs against them, the first batch's error."""
from __future__ import annotations
from pathlib import Path
from typing import Any
import pytest
import torch
from tests.helpers.paths import TRAIN
from dali_bridge import build_loader
from dali_bridge.tools.convert import convert
from dali_bridge.errors import SampleError
from dali_bridge.errors import SourceError
from tests.helpers.s3_fixtures import free_port


SHARDS = "train-{000000..000003}.tar"


SIZE = 48


UINT8 = {"ops.2": {"normalize": {"dtype": "uint8", "layout": "HWC"}}}


@pytest.fixture(scope="session")
def local_shards(sample_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 37-image sample set as 4 shards of 10, 10, 10, 7 with indexes and a manifest."""
    out = tmp_path_factory.mktemp("local-shards")
    convert(sample_root, str(out / "train-%06d.tar"), shard_size=10)
    return out


def overrides(shards: str, **extra: Any) -> dict[str, Any]:
    source = {"type": "webdataset", "shards": shards}
    source.update(extra.pop("source", {}))
    base = {"source": source, "batch_size": 5, "loader.workers": 1, "outputs": ["image", "label", "index", "valid"],
            "ops.0.random_resized_crop.size": SIZE, **UINT8}
    base.update(extra)
    return base


def batches(loader) -> list[tuple[torch.Tensor, ...]]:
    out = [tuple(t.cpu() for t in batch) for batch in loader]
    loader.close()
    return out


def assert_same_batches(a: list, b: list) -> None:
    assert len(a) == len(b)
    for batch_a, batch_b in zip(a, b):
        assert all(torch.equal(x, y) for x, y in zip(batch_a, batch_b))


def local_batches(local_shards: Path, backend: str, epoch: int = 0, **extra: Any) -> list:
    loader = build_loader(TRAIN, backend, overrides=overrides(str(local_shards / SHARDS), **extra))
    loader.set_epoch(epoch)
    return batches(loader)


def assert_two_epochs_as_local(shards: str, backend: str, local_shards) -> None:
    """Epochs 0 and 1 of the pipeline over ``shards`` (a URL pattern) give the local shards' batches."""
    for epoch in (0, 1):
        remote = build_loader(TRAIN, backend, overrides=overrides(shards))
        remote.set_epoch(epoch)
        assert remote.listing.classes == ("class_000", "class_001", "class_002")  # from the manifest beside them
        assert_same_batches(batches(remote), local_batches(local_shards, backend, epoch))


def gone_then_shown(unreachable: str, shards: str, write_pipeline) -> str:
    """The error of a loader whose store's endpoint answers nothing (a free port, ``unreachable``'s
    shards), after which ``show`` prints a pipeline over ``shards`` (captured by the caller)."""
    from dali_bridge.cli.main import main

    with pytest.raises(SourceError) as gone:
        build_loader(TRAIN, "torchvision", overrides=overrides(
            unreachable, source={"storage_options": {"endpoint_url": f"http://127.0.0.1:{free_port()}"},
                                 "timeout": 1.0}))
    main(["show", str(write_pipeline(source={"type": "webdataset", "shards": shards}))])
    return str(gone.value)


def first_batch_error(loader) -> str:
    """The sample error the loader's first batch raises, after which the loader is closed."""
    with pytest.raises(SampleError) as info:
        next(iter(loader))
    loader.close()
    return str(info.value)


def everything_shown(capsys, caplog, listing_cache) -> list[str]:
    """What was printed and logged, and every file of the listing cache with its name."""
    return [capsys.readouterr().out, caplog.text,
            *(str(p) + p.read_text() for p in listing_cache.rglob("*") if p.is_file())]


@pytest.fixture(autouse=True)
def private_listing_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test lists into its own cache folder (never the user's ~/.cache)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"
