"""dali_bridge.lightning.DataModule with a real lightning.Trainer on the CPU.

A fit records the sample indices of every training step; a second fit resumed from a mid-epoch
checkpoint of the first must see exactly the indices the first saw after that step.
"""
from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.helpers.paths import TRAIN, VAL
from tests.helpers.processes import torchrun

lightning = pytest.importorskip("lightning", reason="needs the [lightning] extra (pip install dali-bridge[lightning])")

from dali_bridge.lightning import DataModule, EpochLoader  # noqa: E402

BATCH = 5          # 37 samples, drop: 7 batches an epoch
STEPS_PER_EPOCH = 7


def overrides(root: Path) -> dict:
    return {"source": {"type": "folder", "root": str(root)}, "batch_size": BATCH, "loader.workers": 0,
            "loader.last_batch": "drop", "outputs": ["image", "label", "index"]}


def small(root: Path) -> dict:
    return {**overrides(root), "ops.0.random_resized_crop.size": 16}


class Recorder(lightning.LightningModule):
    """A model just big enough to train: records the indices and the epoch of every step."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 3)
        self.seen: list[tuple[int, list[int]]] = []
        self.val_batches = 0

    def training_step(self, batch, batch_idx):
        image, label, index = batch
        self.seen.append((self.current_epoch, index.tolist()))
        return torch.nn.functional.cross_entropy(self.layer(image.float().mean(dim=(2, 3))), label)

    def validation_step(self, batch, batch_idx):
        self.val_batches += 1

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(tmp_path: Path, **extra) -> "lightning.Trainer":
    settings = {"accelerator": "cpu", "devices": 1, "max_epochs": 2, "logger": False, "enable_progress_bar": False,
                "enable_model_summary": False, "default_root_dir": str(tmp_path), **extra}
    return lightning.Trainer(**settings)


@pytest.mark.slow
def test_fit_iterates_each_epoch_in_the_bridges_order_without_sampler_replacement(sample_root, tmp_path, caplog):
    from dali_bridge import build_loader

    module = DataModule(train=TRAIN, overrides={**small(sample_root), "loader.report_starvation": True})
    model = Recorder()
    fit = trainer(tmp_path, enable_checkpointing=False, use_distributed_sampler=True)
    with caplog.at_level(logging.INFO, logger="dali_bridge"):
        fit.fit(model, datamodule=module)
    verdicts = [r.getMessage() for r in caplog.records if "-bound: " in r.getMessage()]
    assert [line.split(": ")[1] for line in verdicts] == ["epoch 0", "epoch 1"]   # the starvation line, each epoch
    assert module.train_loader.stats()["batches"] == 2 * STEPS_PER_EPOCH   # still readable after the fit
    assert isinstance(fit.train_dataloader, EpochLoader)   # not wrapped in a DataLoader with a sampler
    reference = build_loader(TRAIN, "torchvision", overrides=small(sample_root))
    expected = [(epoch, task.indices.tolist()) for epoch in range(2) for task in reference.tasks(epoch)]
    reference.close()
    assert model.seen == expected
    assert model.seen[0][1] != model.seen[STEPS_PER_EPOCH][1]   # set_epoch: epoch 1 has its own order


@pytest.mark.parametrize("step, position", [(9, (1, 2)), (7, (1, 0))], ids=["mid-epoch", "epoch-end"])
@pytest.mark.slow
def test_resume_from_a_checkpoint_sees_the_remaining_indices(sample_root, tmp_path, step, position):
    saver = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=step,
                                                        save_top_k=-1, filename="{step}")
    first = Recorder()
    trainer(tmp_path, callbacks=[saver]).fit(first, datamodule=DataModule(train=TRAIN, overrides=small(sample_root)))
    assert len(first.seen) == 2 * STEPS_PER_EPOCH
    checkpoint = tmp_path / "ckpt" / f"step={step}.ckpt"
    state = torch.load(checkpoint, weights_only=False)["DataModule"]["train"]
    assert (state["epoch"], state["batch"]) == position   # step 9: epoch 1 after its second batch

    resumed = Recorder()
    trainer(tmp_path, enable_checkpointing=False).fit(
        resumed, datamodule=DataModule(train=TRAIN, overrides=small(sample_root)), ckpt_path=str(checkpoint))
    assert resumed.seen == first.seen[step:]


@pytest.mark.slow
def test_a_datamodule_serves_a_second_fit_with_new_loaders(sample_root, tmp_path):
    module = DataModule(train=TRAIN, overrides=small(sample_root))
    runs = []
    for _ in range(2):
        model = Recorder()
        trainer(tmp_path, enable_checkpointing=False, max_epochs=1).fit(model, datamodule=module)
        runs.append(model.seen)
    assert runs[0] == runs[1] and len(runs[0]) == STEPS_PER_EPOCH


def test_the_val_pipeline_runs_at_each_epochs_end_on_the_trainers_device(sample_root, tmp_path):
    from dali_bridge.spec.pipeline import load_spec

    train = load_spec(TRAIN, {"ops.0.random_resized_crop.size": 16})
    val = load_spec(VAL, {"ops.0.resize.size": 20, "ops.1.center_crop.size": 16})
    module = DataModule(train=train, val=val, overrides=overrides(sample_root))
    model = Recorder()
    fit = trainer(tmp_path, enable_checkpointing=False, num_sanity_val_steps=0, max_epochs=1)
    fit.fit(model, datamodule=module)
    assert model.val_batches == STEPS_PER_EPOCH
    assert str(fit.strategy.root_device) == "cpu"


def ddp_rank_main(root: str, out: str, phase: str) -> None:
    """What each torchrun rank runs: a 2-epoch fit with a checkpoint at step 4 (epoch 1, batch 1),
    or the fit resumed from it; the rank's steps go to ``<phase>-rank<N>.json``."""
    import torch.distributed as dist

    saver = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=Path(out) / "ckpt", every_n_train_steps=4,
                                                        save_top_k=-1, filename="{step}")
    model = Recorder()
    fit = lightning.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                            enable_progress_bar=False, enable_model_summary=False, default_root_dir=out,
                            callbacks=[saver] if phase == "fit" else [], enable_checkpointing=phase == "fit")
    checkpoint = str(Path(out) / "ckpt" / "step=4.ckpt") if phase == "resume" else None
    fit.fit(model, datamodule=DataModule(train=TRAIN, overrides=small(Path(root))), ckpt_path=checkpoint)
    assert dist.get_world_size() == 2
    Path(out, f"{phase}-rank{fit.global_rank}.json").write_text(json.dumps(model.seen))
    # Lightning leaves the process group up: gloo's threads torn down at the interpreter's exit abort
    # the rank now and then ("terminate called without an active exception").
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_ddp_ranks_share_each_epoch_and_resume_mid_epoch(sample_root, tmp_path):
    from dali_bridge.pipeline.sampling import rank_batches

    for phase in ("fit", "resume"):
        torchrun(Path(__file__).resolve(), str(sample_root), str(tmp_path), phase, nproc=2, timeout=600)
    seen = {(phase, rank): [tuple(step[:1]) + (step[1],) for step in
                            json.loads((tmp_path / f"{phase}-rank{rank}.json").read_text())]
            for phase in ("fit", "resume") for rank in range(2)}
    for rank in range(2):
        expected = [(epoch, task.indices.tolist()) for epoch in range(2)
                    for task in rank_batches(37, BATCH, 0, epoch, rank, 2, "drop")]
        assert seen["fit", rank] == expected   # 18 samples a rank, 3 full batches an epoch
        assert seen["resume", rank] == expected[4:]
    first_epoch = [i for rank in range(2) for _, indices in seen["fit", rank][:3] for i in indices]
    assert len(set(first_epoch)) == len(first_epoch) == 30   # no sample on both ranks


def _dali_gpu_reason() -> str | None:
    from dali_bridge.loader.select import unavailable_reason

    if not torch.cuda.is_available():
        return "no CUDA device here"
    reason = unavailable_reason("dali")
    return f"dali cannot run here: {reason}" if reason else None


class DeviceRecorder(Recorder):
    """Also records where each batch's images are and where the model is."""

    def __init__(self) -> None:
        super().__init__()
        self.devices: list[tuple[str, str]] = []

    def training_step(self, batch, batch_idx):
        self.devices.append((str(batch[0].device), str(self.device)))
        return super().training_step(batch, batch_idx)


@pytest.mark.gpu
@pytest.mark.skipif(_dali_gpu_reason() is not None,
                    reason=f"GPU-only: checks that a GPU Trainer's batches come from dali on its device "
                           f"({_dali_gpu_reason()})")
def test_a_gpu_trainer_gets_dali_batches_on_its_own_device(sample_root, tmp_path):
    module = DataModule(train=TRAIN, backend="dali", overrides=small(sample_root))
    model = DeviceRecorder()
    fit = trainer(tmp_path, accelerator="gpu", devices=1, max_epochs=1, enable_checkpointing=False)
    fit.fit(model, datamodule=module)
    assert set(model.devices) == {("cuda:0", "cuda:0")}


class StubTrainer:
    """The three things setup reads from a Trainer, for rank 0 of a world of two."""
    global_rank, world_size = 0, 2
    strategy = type("Strategy", (), {"root_device": torch.device("cpu")})()


def test_a_train_pipeline_whose_ranks_would_step_apart_is_refused(sample_root, caplog):
    partial = {**small(sample_root), "loader.last_batch": "partial", "batch_size": 6}   # 19 or 18 samples a rank
    module = DataModule(train=TRAIN, overrides=partial)
    module.trainer = StubTrainer()
    with pytest.raises(ValueError, match=r"gives ranks 3 or 4 batches an epoch .* set loader.last_batch: drop or pad"):
        module.setup("fit")
    module = DataModule(val=TRAIN, overrides=partial)
    module.trainer = StubTrainer()
    with caplog.at_level(logging.WARNING, logger="dali_bridge"):
        module.setup("fit")
    assert "keep collectives out of validation_step" in caplog.text and module.val_loader is not None
    module.teardown("fit")


@pytest.mark.slow
def test_without_lightning_the_import_names_the_extra():
    code = textwrap.dedent("""
        import sys
        sys.modules["lightning"] = None
        sys.modules["lightning.pytorch"] = None
        sys.modules["pytorch_lightning"] = None
        try:
            import dali_bridge.lightning
        except ImportError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "pip install dali-bridge[lightning]" in out


def test_a_datamodule_without_pipelines_is_refused():
    with pytest.raises(ValueError, match="train=PATH, val=PATH"):
        DataModule()


if __name__ == "__main__":
    ddp_rank_main(*sys.argv[1:4])
