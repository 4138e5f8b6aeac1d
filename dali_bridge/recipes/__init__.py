"""Meeting users where their code is: a ``transforms.v2`` Compose or timm's training arguments as a
pipeline (:func:`from_torchvision`, :func:`from_timm`), and a pipeline as the ``transforms.v2`` code
a user writes (:func:`to_torchvision`, :func:`batch_transform`). docs/from-your-code.md has the tables."""
from __future__ import annotations
