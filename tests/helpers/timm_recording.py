"""Recording what timm's own transforms draw, for tests that compare timm's draws with the bridge's."""
from __future__ import annotations

from typing import Any


def record_augmix_weights(transform: Any, monkeypatch: Any) -> list[tuple[float, float]]:
    """Patch timm's ``AugMixAugment`` ``transform`` so each call appends (the first chain's weight,
    the blend) to the returned list: timm draws both inside ``_apply_basic`` (Dirichlet and Beta)."""
    basic, weights = transform._apply_basic, []

    def recorded(img, mixing_weights, m):
        weights.append((float(mixing_weights[0]), float(m)))
        return basic(img, mixing_weights, m)

    monkeypatch.setattr(transform, "_apply_basic", recorded)
    return weights
