"""The pipelines whose outputs are pinned bit for bit (tests/backends/test_pinned_outputs.py): the shipped
pipelines and variants covering every resize method of the DALI backend, a mid-pipeline flip,
crop_mirror_normalize and float16 HWC. Shared by the test and its worker process."""
from __future__ import annotations

from pathlib import Path

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"
TRAIN = PIPELINES / "imagenet_train.yaml"
VAL = PIPELINES / "imagenet_val.yaml"
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
UINT8 = {"normalize": {"dtype": "uint8"}}
BACKENDS = ["dali-cpu", "torchvision"]

# name → (shipped pipeline, overrides)
VARIANTS: dict[str, tuple[Path, dict]] = {
    "train": (TRAIN, {}),
    "val": (VAL, {}),
    "train-nearest-uint8": (TRAIN, {"ops": [{"random_resized_crop": {"size": 96, "interpolation": "nearest"}},
                                            {"horizontal_flip": 0.5}, UINT8]}),
    "train-bicubic": (TRAIN, {"ops.0.random_resized_crop.interpolation": "bicubic"}),
    "train-no-antialias": (TRAIN, {"ops.0.random_resized_crop.antialias": False}),
    "val-bicubic": (VAL, {"ops.0.resize.interpolation": "bicubic"}),
    "resize-to-fixed-size": (VAL, {"ops": [{"resize": [180, 200]}, UINT8]}),
    "resize-fixed-then-crop": (VAL, {"ops": [{"resize": [240, 250]}, {"center_crop": 200}, UINT8]}),
    "crop-mirror-normalize": (VAL, {"ops": [{"resize": 256}, {"crop_mirror_normalize": {
        "crop": 224, "mirror": 0.5, "mean": MEAN, "std": STD}}]}),
    "flip-in-the-middle": (VAL, {"ops": [{"resize": 128}, {"horizontal_flip": 0.5}, {"center_crop": 112}, UINT8]}),
    "rrc-after-resize": (VAL, {"ops": [{"resize": 300}, {"random_resized_crop": [200, 160]}, UINT8]}),
    "train-float16-hwc": (TRAIN, {"ops.2.normalize.dtype": "float16", "ops.2.normalize.layout": "HWC"}),
    "train-parity-fast": (TRAIN, {"parity": "fast"}),
}
