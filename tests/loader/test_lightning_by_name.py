"""The Lightning DataModule takes shipped pipelines by name, as build_loader does."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

lightning = pytest.importorskip("lightning", reason="needs the [lightning] extra (pip install dali-bridge[lightning])")

from dali_bridge.lightning import DataModule  # noqa: E402
from dali_bridge.spec.shipped import shipped_folder  # noqa: E402


class Counter(lightning.LightningModule):
    """Just enough of a model to fit: counts the batches each loop sees."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 3)
        self.train_batches = self.val_batches = 0

    def training_step(self, batch, batch_idx):
        self.train_batches += 1
        image, label = batch
        return torch.nn.functional.cross_entropy(self.layer(image.mean(dim=(2, 3))), label)

    def validation_step(self, batch, batch_idx):
        self.val_batches += 1

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_datamodule_fits_on_shipped_pipelines_named_from_an_empty_folder(sample_root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    overrides = {"source.root": str(sample_root), "batch_size": 8, "loader.workers": 0, "loader.last_batch": "drop"}
    module = DataModule(train="imagenet_train", val="imagenet_val", overrides=overrides)
    model = Counter()
    lightning.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                      default_root_dir=str(tmp_path)).fit(model, datamodule=module)
    assert (model.train_batches, model.val_batches) == (4, 4)  # 37 samples, batches of 8, the last dropped
    assert Path(module.train_loader.spec.origin) == shipped_folder() / "imagenet_train.yaml"
    assert Path(module.val_loader.spec.origin) == shipped_folder() / "imagenet_val.yaml"
