"""Where the repository and its shipped pipelines are."""
from __future__ import annotations
from pathlib import Path


REPO = Path(__file__).resolve().parents[2]


PIPELINES = REPO / "pipelines"


TRAIN = PIPELINES / "imagenet_train.yaml"


VAL = PIPELINES / "imagenet_val.yaml"
