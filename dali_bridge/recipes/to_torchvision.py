"""A pipeline as the ``transforms.v2`` code a user writes (:mod:`dali_bridge.compose`, defined below
the spec layer so that ``PipelineSpec.to_torchvision`` builds it without the recipes)."""
from __future__ import annotations

from ..compose import batch_transform, to_torchvision

__all__ = ["batch_transform", "to_torchvision"]
