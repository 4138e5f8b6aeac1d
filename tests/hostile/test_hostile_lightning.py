"""The Lightning DataModule's resume state, handed over by hand: the loader's own state is accepted
and continues the epoch; a state holding no training position is refused, never ignored."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.paths import TRAIN, VAL

lightning = pytest.importorskip("lightning", reason="needs the [lightning] extra (pip install dali-bridge[lightning])")

from dali_bridge import build_loader  # noqa: E402
from dali_bridge.lightning import DataModule  # noqa: E402


def _overrides(root: Path) -> dict:
    return {"source": {"type": "folder", "root": str(root)}, "batch_size": 5, "loader.workers": 0,
            "loader.last_batch": "drop", "outputs": ["image", "label", "index"], "ops.0.random_resized_crop.size": 16}


class _Recorder(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 3)
        self.seen: list[list[int]] = []

    def training_step(self, batch, batch_idx):
        image, label, index = batch
        self.seen.append(index.tolist())
        return torch.nn.functional.cross_entropy(self.layer(image.float().mean(dim=(2, 3))), label)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _bare_state(root: Path, batches: int) -> tuple[dict, list[list[int]]]:
    """A loader's own state after ``batches`` batches of epoch 0, and the indices of the rest of the epoch."""
    loader = build_loader(TRAIN, overrides=_overrides(root))
    seen = [batch[2].tolist() for batch in loader]
    loader = build_loader(TRAIN, overrides=_overrides(root))
    for number, _ in enumerate(loader):
        if number + 1 == batches:
            state = loader.state_dict()   # while iterating: the place in this epoch
            break
    loader.close()
    return state, seen[batches:]


@pytest.mark.slow
def test_a_bare_loader_state_resumes_the_epoch_where_it_stood(sample_root, tmp_path):
    state, rest = _bare_state(sample_root, 3)
    assert (state["epoch"], state["batch"]) == (0, 3)
    module = DataModule(train=TRAIN, overrides=_overrides(sample_root))
    module.load_state_dict(state)
    assert module.state_dict() == {"train": state}   # kept until setup, saved as its own
    model = _Recorder()
    lightning.Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False,
                      default_root_dir=str(tmp_path)).fit(model, datamodule=module)
    assert model.seen == rest


def test_a_bare_loader_state_is_kept_as_the_modules_own(sample_root):
    state = {"format": 2, "epoch": 1, "batch": 2, "position": 10, "world_size": 1}
    module = DataModule(train=TRAIN, overrides=_overrides(sample_root))
    module.load_state_dict(state)
    assert module.state_dict() == {"train": state}
    module.load_state_dict([state, state])   # every rank's, as the loader takes them
    assert module.state_dict() == {"train": [state, state]}


@pytest.mark.parametrize("state, found", [
    ({}, "no keys"),
    ({"epoch": 1, "batch": 2}, "'epoch', 'batch'"),
    ({"train": {"format": 2}, "extra": 1}, "'train', 'extra'"),
    ({"val": {}}, "'val'"),
])
def test_a_state_without_a_training_position_is_refused(sample_root, state, found):
    module = DataModule(train=TRAIN, overrides=_overrides(sample_root))
    with pytest.raises(ValueError, match=f"the state holds {found}, not a training position"):
        module.load_state_dict(state)


def test_a_state_that_is_not_a_mapping_is_refused(sample_root):
    module = DataModule(train=TRAIN, overrides=_overrides(sample_root))
    with pytest.raises(ValueError, match="got str"):
        module.load_state_dict("epoch 1")


def test_the_empty_state_of_a_module_without_train_loads_as_nothing(sample_root):
    module = DataModule(val=VAL, overrides=_overrides(sample_root))
    module.load_state_dict(module.state_dict())
    assert module.state_dict() == {}
