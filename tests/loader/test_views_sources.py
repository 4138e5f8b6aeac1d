"""Views beyond a folder: WebDataset shards on both CPU backends, the same shards read over HTTP,
and a Lightning fit on a shipped self-supervised recipe whose training step takes the list of views."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.helpers import s3_fixtures
from tests.helpers.backends import CPU_BACKENDS, needs_cpu_backends
from tests.helpers.object_storage import SHARDS, local_shards  # noqa: F401  (the fixture)

http_folder = s3_fixtures.http_folder  # the fixture, used by name below

OVERRIDES = {"batch_size": 5, "loader.workers": 1, "outputs": ["views", "label", "index"],
             "views.global.ops.0.random_resized_crop.size": 32, "views.local.ops.0.random_resized_crop.size": 16,
             "views.local.count": 2}


@needs_cpu_backends
def test_views_of_webdataset_shards_are_the_same_on_both_cpu_backends(local_shards):  # noqa: F811
    from dali_bridge.tools.compare import compare

    source = {"type": "webdataset", "shards": str(local_shards / "train-{000000..000003}.tar")}
    result = compare("dino_train", ("dali-cpu", "torchvision"), batches=None,
                     overrides={**OVERRIDES, "source": source, "loader.last_batch": "partial"})
    assert result.passed and result.samples == 37, result.format()
    assert [o.name for o in result.outputs if not o.exact] == [f"views[{n}]" for n in range(4)]


@pytest.mark.slow
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_views_of_shards_at_a_url_are_those_of_the_same_shards_on_disk(backend, local_shards,  # noqa: F811
                                                                        http_folder):
    from dali_bridge import build_loader

    root, base = http_folder
    for path in local_shards.iterdir():
        shutil.copy2(path, root / path.name)

    def epoch(shards: str) -> list[list[torch.Tensor]]:
        loader = build_loader("dino_train", backend, overrides={
            **OVERRIDES, "source": {"type": "webdataset", "shards": shards}, "loader.last_batch": "partial"})
        out = [[view.clone() for view in views] + [labels, index] for views, labels, index in loader]
        loader.close()
        return out

    on_disk, at_url = epoch(str(local_shards / SHARDS)), epoch(f"{base}/{SHARDS}")
    assert sum(len(batch[-1]) for batch in at_url) == 37
    assert len(on_disk) == len(at_url)
    for mine, theirs in zip(at_url, on_disk):
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs))


def test_a_lightning_fit_takes_the_views_of_a_shipped_recipe(sample_root, tmp_path, monkeypatch):
    lightning = pytest.importorskip("lightning", reason="needs the [lightning] extra")
    from dali_bridge.lightning import DataModule

    class TwoViews(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(3, 3)
            self.shapes: list = []

        def training_step(self, batch, batch_idx):
            views, labels = batch
            self.shapes.append([tuple(view.shape) for view in views])
            return sum(torch.nn.functional.cross_entropy(self.layer(view.mean(dim=(2, 3))), labels)
                       for view in views)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    monkeypatch.chdir(tmp_path)
    module = DataModule(train="byol_train", overrides={"source.root": str(sample_root), "batch_size": 8,
                                                       "loader.workers": 0,
                                                       "views.view.ops.0.random_resized_crop.size": 32})
    model = TwoViews()
    lightning.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False,
                      default_root_dir=str(Path(tmp_path))).fit(model, datamodule=module)
    assert model.shapes == [[(8, 3, 32, 32), (8, 3, 32, 32)]] * 4   # 37 samples, batches of 8, the last dropped
