"""Visual grid features for the captioner: the ViT tokens before the final norm and pooling/projection (PAC-S++ Eq. 15).

PAC-S++ feeds its captioner `{e^1..e^R}` where the image embedding is `W · LN(e^1..e^R)`: the output of the
last transformer block of the visual tower. Per family:

- open_clip `VisionTransformer` (CLIP, and SigLIP-style with attention pooling): every token after the last
  block, before `ln_post` / the attention pooler; the class token first when the tower has one.
- open_clip `TimmModel` (the released SigLIP / SigLIP2 towers): the timm ViT's tokens after its last block,
  before its final `norm` and the MAP head (prefix tokens, if any, first).
- transformers CLIP / SigLIP / Siglip2: the encoder's last hidden state (`hidden_states[-1]`), before
  `post_layernorm` and pooling (CLIP: class token first; Siglip2: every patch slot, padding slots included).
"""
from __future__ import annotations

from typing import Any

import torch

from pacs.metric.common.errors import InputError


def _model(backbone: Any) -> Any:
    return getattr(backbone, "model", backbone)


def _kind(backbone: Any) -> str:
    """Which grid path applies: ``open_clip-vit``, ``timm``, ``transformers``; InputError otherwise."""
    model = _model(backbone)
    if hasattr(model, "hf") and hasattr(model.hf, "vision_model"):
        return "transformers"
    visual = getattr(model, "visual", None)
    if visual is not None and all(hasattr(visual, name) for name in ("conv1", "transformer", "ln_post")):
        return "open_clip-vit"
    trunk = getattr(visual, "trunk", None)
    if trunk is not None and all(hasattr(trunk, name) for name in ("patch_embed", "blocks", "_pos_embed")):
        return "timm"
    kind = type(visual).__name__ if visual is not None else type(model).__name__
    raise InputError(f"grid features need a ViT visual tower (open_clip, timm ViT or transformers), got {kind} "
                     "(ResNet towers are not supported)")


@torch.no_grad()
def visual_grid_features(backbone: Any, pixels: torch.Tensor) -> torch.Tensor:
    """Return the visual tokens `[B, tokens, width]` after the last block, before the final norm, for `pixels`."""
    kind = _kind(backbone)
    model = _model(backbone)
    if kind == "transformers":
        inputs = model.image_inputs(pixels.to(next(model.parameters()).device))
        out = model.hf.vision_model(**inputs, output_hidden_states=True)
        return out.hidden_states[-1].float()
    if pixels.dim() != 4:
        raise InputError(f"expected pixels [B, 3, H, W], got {tuple(pixels.shape)}")
    if kind == "timm":
        trunk = model.visual.trunk
        weight = trunk.patch_embed.proj.weight
        x = trunk.patch_embed(pixels.to(device=weight.device, dtype=weight.dtype))
        x = trunk.norm_pre(trunk.patch_drop(trunk._pos_embed(x)))
        return trunk.blocks(x).float()
    visual = model.visual
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
    kind = _kind(backbone)
    model = _model(backbone)
    if kind == "transformers":
        return int(model.hf.config.vision_config.hidden_size)
    if kind == "timm":
        return int(model.visual.trunk.embed_dim)
    return int(model.visual.conv1.out_channels)
