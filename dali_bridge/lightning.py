"""A Lightning ``DataModule`` over pipeline files: ``trainer.fit(model, datamodule=DataModule(train=..., val=...))``.

The loaders are built in :meth:`DataModule.setup`, once per process, from the Trainer's global
rank, world size and root device, so each rank reads its own share of every epoch as the bridge
deals it. Lightning hands them to the fit loop as they are: its distributed-sampler replacement
applies to ``torch.utils.data.DataLoader`` objects only, and these are not (the bridge owns the
order; a ``DistributedSampler`` would deal the samples a second time). Each epoch's iteration
starts with ``set_epoch(trainer.current_epoch)``, which Lightning itself cannot call here (there
is no sampler to call it on). The training loader's position is the DataModule's
``state_dict``, which Lightning writes into every checkpoint; resuming from a mid-epoch
checkpoint continues with the next batch, on every rank. A training pipeline whose ranks would
run different numbers of steps (``last_batch: partial`` over an uneven split) is refused: DDP
ranks must step together.

Needs the ``[lightning]`` extra (``lightning`` 2.x, or the ``pytorch_lightning`` package).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

try:
    from lightning.pytorch import LightningDataModule
except ImportError:   # the older package name, the same classes
    try:
        from pytorch_lightning import LightningDataModule
    except ImportError:
        raise ImportError("dali_bridge.lightning needs PyTorch Lightning, which is not installed: "
                          "pip install dali-bridge[lightning] (or pip install lightning)") from None

from .loader.loader import Loader, build_loader
from .pipeline.sampling import batch_count
from .spec.pipeline import PipelineSpec
from .util.messages import package_log

log = package_log()

PathLike = str | Path | PipelineSpec | Mapping


class EpochLoader:
    """What the Trainer iterates: a :class:`~dali_bridge.loader.loader.Loader` that starts each iteration
    at the Trainer's current epoch.

    ``len()`` is the whole epoch's batch count, also after a resume: Lightning counts the batches
    a resumed epoch already ran, and the loader yields only the rest.
    """

    def __init__(self, loader: Loader, trainer: Any):
        self.loader = loader
        self._trainer = trainer

    def __iter__(self) -> Iterator:
        # A generator: nothing runs until the first batch is asked for. Lightning calls iter() once
        # just to check that the object is iterable; an eager iter() would start the epoch there
        # and use up a resumed loader's position.
        self.loader.set_epoch(self._trainer.current_epoch)
        yield from self.loader

    def __len__(self) -> int:
        return len(self.loader.tasks(self.loader.epoch))

    def __repr__(self) -> str:
        return f"EpochLoader({self.loader!r})"


def _uneven_steps(loader: Loader, *, role: str) -> str | None:
    """Why the ranks of ``loader``'s world would run different numbers of batches an epoch, or None:
    under DDP the rank with one more step waits forever for the others' collectives."""
    settings = loader.spec.loader
    counts = sorted({batch_count(loader.num_samples, loader.batch_size, loader.world_size, rank, settings.last_batch,
                                 repeats=settings.repeated_augmentations) for rank in range(loader.world_size)})
    if len(counts) == 1:
        return None
    return (f"DataModule: the {role} pipeline {loader.spec.origin} gives ranks {counts[0]} or {counts[-1]} batches "
            f"an epoch (loader.last_batch: {settings.last_batch} over {loader.world_size} ranks); set "
            f"loader.last_batch: drop or pad (overrides={{\"loader.last_batch\": \"drop\"}}) so that every rank "
            f"steps together")


class DataModule(LightningDataModule):
    """Training and validation loaders from pipeline files, one per process of the Trainer.

    ``train``/``val``: a pipeline file or a shipped pipeline's name (or a ``PipelineSpec`` or its raw
    data); either may be None.
    ``backend``: as :func:`~dali_bridge.build_loader` (None: the file's ``backend`` key).
    ``overrides``: dotted keys applied to both pipelines (``{"batch_size": 64}``).
    After ``setup``: ``train_loader`` and ``val_loader`` are the bridge's loaders (``stats()``,
    ``listing.classes`` ...); after the fit they are closed but still there to read.
    """

    def __init__(self, train: PathLike | None = None, val: PathLike | None = None, *, backend: str | None = None,
                 overrides: Mapping[str, Any] | list[str] | None = None):
        super().__init__()
        if train is None and val is None:
            raise ValueError("DataModule: give a train pipeline, a val pipeline or both (train=PATH, val=PATH)")
        self.train_pipeline, self.val_pipeline = train, val
        self.backend = backend or "auto"
        self.overrides = overrides
        self.train_loader: Loader | None = None
        self.val_loader: Loader | None = None
        self._closed = False   # teardown closed the loaders: the next setup builds new ones
        self._pending_state: Mapping[str, Any] | None = None

    def _build(self, pipeline: PathLike, *, role: str) -> Loader:
        trainer = self.trainer
        loader = build_loader(pipeline, self.backend, overrides=self.overrides, rank=trainer.global_rank,
                              world_size=trainer.world_size, device=trainer.strategy.root_device)
        uneven = _uneven_steps(loader, role=role)
        if uneven and role == "train":
            loader.close()
            raise ValueError(uneven)
        if uneven:
            log.warning("%s, or keep collectives out of validation_step", uneven)
        return loader

    def setup(self, stage: str) -> None:
        """Build this process's loaders (once; a later stage reuses them)."""
        if self._closed:
            self.train_loader = self.val_loader = None
            self._closed = False
        if self.train_pipeline is not None and self.train_loader is None and stage == "fit":
            self.train_loader = self._build(self.train_pipeline, role="train")
            log.info("dali-bridge lightning: rank %d/%d trains on %r", self.trainer.global_rank,
                     self.trainer.world_size, self.train_loader)
        if self.val_pipeline is not None and self.val_loader is None and stage in ("fit", "validate"):
            self.val_loader = self._build(self.val_pipeline, role="val")
        if self._pending_state is not None and self.train_loader is not None:
            self._restore(self._pending_state)

    def train_dataloader(self) -> EpochLoader:
        if self.train_loader is None:
            raise RuntimeError("DataModule: no train pipeline was given (DataModule(train=PATH, ...)), or the "
                               "Trainer did not call setup('fit')")
        return EpochLoader(self.train_loader, self.trainer)

    def val_dataloader(self) -> EpochLoader | list:
        return [] if self.val_loader is None else EpochLoader(self.val_loader, self.trainer)

    def state_dict(self) -> dict[str, Any]:
        """The training loader's position (Lightning saves it in each checkpoint)."""
        if self.train_loader is None or self._closed:
            if not self._pending_state:
                return {}
            pending = self._pending_state["train"]
            return {"train": dict(pending) if isinstance(pending, Mapping) else [dict(s) for s in pending]}
        return {"train": self.train_loader.state_dict()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Continue from a checkpoint's position (now, or in ``setup`` if the loaders are not built yet):
        this DataModule's own ``state_dict()`` (``{"train": ...}``), or a bare ``loader.state_dict()``
        (or the list every rank saved). Anything else is refused, never ignored."""
        state = self._train_state(state_dict)
        if state is None:
            return
        if self.train_loader is None or self._closed:
            self._pending_state = state
        else:
            self._restore(state)

    def _train_state(self, state_dict: Any) -> dict[str, Any] | None:
        """``{"train": loader state}`` from what ``load_state_dict`` was given; None for the empty state of
        a DataModule without a train pipeline; ValueError naming what it holds otherwise."""
        if isinstance(state_dict, (list, tuple)) or (isinstance(state_dict, Mapping) and "format" in state_dict):
            state_dict = {"train": state_dict}   # the loader's own state, passed by hand
        if not isinstance(state_dict, Mapping):
            raise ValueError(f"DataModule.load_state_dict: expected a DataModule state ({{'train': loader state}}) or "
                             f"a loader's state_dict(), got {type(state_dict).__name__}")
        if not state_dict and self.train_pipeline is None:
            return None   # what state_dict() gives without a train pipeline: no position to restore
        if set(state_dict) != {"train"}:
            found = ", ".join(repr(key) for key in list(state_dict)[:10]) or "no keys"
            raise ValueError(f"DataModule.load_state_dict: the state holds {found}, not a training position: expected "
                             f"this DataModule's state_dict() ({{'train': ...}}) or the train loader's state_dict(); "
                             f"without one, training would restart its epoch and repeat samples")
        return dict(state_dict)

    def _restore(self, state_dict: Mapping[str, Any]) -> None:
        # The checkpoint holds rank 0's state: the job's place in the epoch, the same on every rank
        # (ranks step in lockstep), which a loader of any rank and world size continues from.
        assert self.train_loader is not None
        self.train_loader.load_state_dict(state_dict["train"])
        self._pending_state = None

    def teardown(self, stage: str) -> None:
        """Stop the loaders' workers when the Trainer is done fitting (their ``stats()`` stay readable)."""
        if stage == "fit":
            for loader in (self.train_loader, self.val_loader):
                if loader is not None:
                    loader.close()
            self._closed = True
