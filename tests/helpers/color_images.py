"""Images with mixed colours, and the colour-jitter settings several equivalence tests use."""
from __future__ import annotations
from pathlib import Path
import numpy as np


JITTER = {"brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1}


def write_mixed_images(root: Path) -> Path:
    """8 JPEGs smaller and larger than a 64 x 64 output, colour and grey-origin (mode L), in 2 classes."""
    from PIL import Image

    rng = np.random.default_rng(5)
    for n, (height, width, grey) in enumerate([(40, 30, False), (300, 200, False), (48, 90, True), (180, 140, True),
                                               (64, 64, False), (120, 50, False), (33, 200, True), (90, 90, False)]):
        y, x = np.mgrid[0:height, 0:width]
        base = np.stack([128 + 100 * np.sin(x / 7.0 + c) * np.cos(y / 11.0 - c) for c in range(3)], axis=2)
        pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels).convert("L") if grey else Image.fromarray(pixels)
        folder = root / f"class_{n % 2}"
        folder.mkdir(exist_ok=True)
        image.save(folder / f"img_{n}.jpg", quality=90)
    return root
