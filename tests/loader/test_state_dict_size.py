"""A loader's state dict says where the job stands, not which samples it has seen: its size is the
same for a dataset of a thousand samples and one of ten thousand, mid-epoch."""
from __future__ import annotations

import io
import os
import pickle
from pathlib import Path

import torch

from tests.helpers.paths import TRAIN
from dali_bridge import build_loader


def _folder_of_links(root: Path, image: Path, count: int) -> Path:
    """An ImageFolder of ``count`` hard links to one JPEG in 10 classes."""
    for number in range(count):
        folder = root / f"class_{number % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        os.link(image, folder / f"img_{number:05d}.jpg")
    return root


def _state_after_a_batch(root: Path) -> dict:
    with build_loader(TRAIN, "torchvision", device="cpu", overrides={
            "source.root": str(root), "loader.workers": 0, "batch_size": 8}) as loader:
        batches = iter(loader)
        next(batches)
        return loader.state_dict()


def test_the_state_dict_is_the_same_size_at_a_thousand_and_ten_thousand_samples(sample_root, tmp_path):
    image = sorted(sample_root.rglob("*.jpg"))[0]
    small = _state_after_a_batch(_folder_of_links(tmp_path / "small", image, 1_000))
    large = _state_after_a_batch(_folder_of_links(tmp_path / "large", image, 10_000))
    assert (small["num_samples"], large["num_samples"]) == (1_000, 10_000)
    assert small["position"] == large["position"] == 8
    assert len(pickle.dumps(small)) == len(pickle.dumps(large))
    saved = [io.BytesIO(), io.BytesIO()]
    torch.save(small, saved[0])
    torch.save(large, saved[1])
    assert len(saved[0].getvalue()) == len(saved[1].getvalue())
    # nothing in it is a collection that could grow with the samples
    assert all(isinstance(value, (int, str, bool, type(None))) for value in large.values()), large
