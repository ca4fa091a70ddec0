"""Visual grid features for the captioner: the ViT tokens before `ln_post` and the projection (PAC-S++ Eq. 15).

PAC-S++ feeds its captioner `{e^1..e^R}` where the image embedding is `W · LN(e^1..e^R)`: the output of the
last transformer block of the visual tower. We return every token, the class token first, so
`R = 1 + (H/patch)·(W/patch)`.
"""
from __future__ import annotations

from typing import Any

import torch

from metric.common.errors import InputError


def _visual_tower(backbone: Any) -> Any:
    model = getattr(backbone, "model", backbone)
    visual = getattr(model, "visual", None)
    if visual is None or not all(hasattr(visual, name) for name in ("conv1", "transformer", "ln_post")):
        kind = type(visual).__name__ if visual is not None else type(model).__name__
        raise InputError(f"grid features need an open_clip VisionTransformer visual tower, got {kind} "
                         "(ResNet and timm towers are not supported)")
    return visual


@torch.no_grad()
def visual_grid_features(backbone: Any, pixels: torch.Tensor) -> torch.Tensor:
    """Return the pre-`ln_post` visual tokens `[B, 1 + patches, width]` of an open_clip ViT for `pixels [B,3,H,W]`."""
    visual = _visual_tower(backbone)
    if pixels.dim() != 4:
        raise InputError(f"expected pixels [B, 3, H, W], got {tuple(pixels.shape)}")
    dtype = visual.conv1.weight.dtype
    x = visual._embeds(pixels.to(device=visual.conv1.weight.device, dtype=dtype))
    batch_first = getattr(visual.transformer, "batch_first", True)
    if not batch_first:
        x = x.permute(1, 0, 2)
    x = visual.transformer(x)
    if not batch_first:
        x = x.permute(1, 0, 2)
    return x.float()


def grid_feature_dim(backbone: Any) -> int:
    """Width of the grid tokens (the captioner's `feature_dim`)."""
    return int(_visual_tower(backbone).conv1.out_channels)
