"""Real photographs for measuring equivalence bounds: the photos scikit-image ships, saved as JPEG.

The generated sample set is smooth and photo-like; real photos have sensor noise, fine texture
and hard edges up to the border, where resampling differences are largest. ``write_real_photos``
writes 13 of scikit-image's photos (7 colour, 6 greyscale) as JPEG at two settings each — quality
75 with 4:2:0 chroma subsampling (what most cameras and web images use) and quality 95 with
4:4:4 — into an ImageFolder layout with one class per kind (``colour``, ``grey``): 26 files,
from 172×448 to 1411×1411 pixels.
"""
from __future__ import annotations

from pathlib import Path

COLOUR = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry", "retina")
GREY = ("camera", "coins", "moon", "brick", "grass", "text")
SETTINGS = ((75, 2), (95, 0))  # (JPEG quality, PIL subsampling: 2 = 4:2:0, 0 = 4:4:4)


def write_real_photos(folder: Path) -> Path:
    """Write the photos into ``folder/colour`` and ``folder/grey``; returns ``folder``. Needs scikit-image
    (the ``test`` extra)."""
    from PIL import Image
    from skimage import data

    for kind, names in (("colour", COLOUR), ("grey", GREY)):
        (folder / kind).mkdir(parents=True, exist_ok=True)
        for name in names:
            image = Image.fromarray(getattr(data, name)())
            for quality, subsampling in SETTINGS:
                image.save(folder / kind / f"{name}_q{quality}.jpg", quality=quality, subsampling=subsampling)
    return folder
