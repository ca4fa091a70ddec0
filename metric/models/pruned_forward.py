"""Exact inference shortcuts for open_clip's standard ViT CLIP towers (same weights, same math, less work).

- Text (causal, pooled at the first EOT): positions after a text's EOT are never computed - the residual
  stream packs only the real positions of every text, so projections and MLPs see no padding (attention runs
  on the padded grid, where causality hides the padding); the token prefix shared by every text of a batch
  (SOT + the prompt "A photo depicts") is run once and its per-layer keys/values are reused; the last block
  computes its query, MLP and output only for the pooled EOT position.
- Image (pooled at the class token): the last block computes its query, MLP and output only for the class token.

Each shortcut is a re-ordering of the same float operations over fewer rows, so outputs agree with open_clip's
full forward to float rounding (tests check <= 1e-5). Anything non-standard (custom blocks, attentional pooling,
layer-scale-free variants are fine) falls back to open_clip's own forward.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from open_clip.model import CLIP
from open_clip.transformer import ResidualAttentionBlock, VisionTransformer


def _standard_block(block: torch.nn.Module) -> bool:
    attn = getattr(block, "attn", None)
    return (type(block) is ResidualAttentionBlock and not hasattr(block, "ln_1_kv")
            and isinstance(attn, torch.nn.MultiheadAttention) and attn.batch_first and attn._qkv_same_embed_dim
            and attn.in_proj_bias is not None and attn.bias_k is None and not attn.add_zero_attn)


def supports_pruned_text(model: torch.nn.Module) -> bool:
    """True for open_clip's CLIP with a standard causal text transformer pooled at argmax."""
    return (type(model) is CLIP and getattr(model, "attn_mask", None) is not None
            and getattr(model, "text_pool_type", None) == "argmax" and model.transformer.batch_first
            and all(_standard_block(block) for block in model.transformer.resblocks))


def supports_pruned_image(model: torch.nn.Module) -> bool:
    """True for open_clip's standard ViT image tower pooled at the class token."""
    visual = getattr(model, "visual", None)
    return (type(visual) is VisionTransformer and visual.attn_pool is None and not visual.final_ln_after_pool
            and visual.pool_type == "tok" and not visual.output_tokens and visual.transformer.batch_first
            and all(_standard_block(block) for block in visual.transformer.resblocks))


def _project(block: ResidualAttentionBlock, h: torch.Tensor, part: slice) -> torch.Tensor:
    weight, bias = block.attn.in_proj_weight[part], block.attn.in_proj_bias[part]
    return F.linear(h, weight, bias)


def _heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    batch, length, width = x.shape
    return x.view(batch, length, n_heads, width // n_heads).transpose(1, 2)


def _keys_values(block: ResidualAttentionBlock, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    width = h.shape[-1]
    n_heads = block.attn.num_heads
    k = _heads(_project(block, h, slice(width, 2 * width)), n_heads)
    v = _heads(_project(block, h, slice(2 * width, 3 * width)), n_heads)
    return k, v


def _block_rows(block: ResidualAttentionBlock, x_rows: torch.Tensor, h_rows: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Output of one block for the query rows `x_rows` (layer input) attending to keys/values `k`, `v`."""
    width = x_rows.shape[-1]
    n_heads = block.attn.num_heads
    q = _heads(_project(block, h_rows, slice(0, width)), n_heads)
    attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    attended = attended.transpose(1, 2).reshape(x_rows.shape[0], x_rows.shape[1], width)
    return _residual_tail(block, x_rows, attended)


def _residual_tail(block: ResidualAttentionBlock, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
    """The rest of a block after attention: output projection + residual, then MLP + residual (any row layout)."""
    x = x + block.ls_1(block.attn.out_proj(attended))
    return x + block.ls_2(block.mlp(block.ln_2(x)))


def _causal_mask(n_query: int, offset: int, n_key: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Additive mask: query i (absolute position offset + i) sees keys 0 .. offset + i."""
    rows = torch.arange(n_query, device=device)[:, None] + offset
    cols = torch.arange(n_key, device=device)[None, :]
    mask = torch.zeros(n_query, n_key, dtype=dtype, device=device)
    return mask.masked_fill_(cols > rows, float("-inf"))


@torch.no_grad()
def prefix_states(model: CLIP, prefix: Sequence[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer keys/values `[1, heads, P, head_dim]` of a token prefix (causal: independent of what follows)."""
    device = model.token_embedding.weight.device
    tokens = torch.tensor([list(prefix)], dtype=torch.long, device=device)
    length = tokens.shape[1]
    x = model.token_embedding(tokens) + model.positional_embedding[:length]
    mask = _causal_mask(length, 0, length, x.dtype, x.device)
    states = []
    for block in model.transformer.resblocks:
        h = block.ln_1(x)
        k, v = _keys_values(block, h)
        states.append((k, v))
        x = _block_rows(block, x, h, k, v, mask)
    return states


def _packed_attention(block: ResidualAttentionBlock, h: torch.Tensor, valid: torch.Tensor, batch: int,
                      n_query: int, prefix_kv: tuple[torch.Tensor, torch.Tensor] | None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v `[B, heads, *, head_dim]` of the packed rows `h [T, width]` laid out in the padded `[B, Lq]` grid.

    One fused in-projection over the T real rows; rows past a text's EOT stay zero (causally invisible to it).
    """
    width = h.shape[-1]
    n_heads = block.attn.num_heads
    projected = F.linear(h, block.attn.in_proj_weight, block.attn.in_proj_bias)
    qkv = projected.new_zeros(batch, n_query, 3 * width)  # the projection's dtype (bf16/fp16 under autocast)
    qkv[valid] = projected
    q, k, v = (_heads(part, n_heads) for part in qkv.split(width, dim=-1))
    if prefix_kv is not None:
        pk, pv = prefix_kv
        k = torch.cat([pk.expand(batch, -1, -1, -1), k], dim=2)
        v = torch.cat([pv.expand(batch, -1, -1, -1), v], dim=2)
    return q, k, v


@torch.no_grad()
def encode_text_pruned(model: CLIP, tokens: torch.Tensor, prefix_length: int = 0,
                       prefix_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
    """Unnormalised text embeddings of `tokens [N, L]` whose first `prefix_length` ids are the cached prefix.

    The residual stream holds only the positions up to each text's EOT, packed as `[T, width]`: the projections
    and MLPs (most of the work) never see padding; attention runs on the padded grid.
    """
    batch, length = tokens.shape
    pooled_at = tokens.argmax(dim=-1)
    if prefix_length and (prefix_kv is None or int(pooled_at.min()) < prefix_length):
        raise ValueError("the pooled EOT position must come after the cached prefix")
    n_query = length - prefix_length
    local = pooled_at - prefix_length  # EOT position in the suffix
    positions = torch.arange(n_query, device=tokens.device)
    valid = positions[None, :] <= local[:, None]  # [B, Lq]
    x = (model.token_embedding(tokens[:, prefix_length:]) + model.positional_embedding[prefix_length:length])[valid]
    mask = _causal_mask(n_query, prefix_length, length, x.dtype, x.device)
    rows = torch.arange(batch, device=x.device)
    width = x.shape[-1]
    blocks = list(model.transformer.resblocks)
    for index, block in enumerate(blocks):
        h = block.ln_1(x)
        q, k, v = _packed_attention(block, h, valid, batch, n_query, prefix_kv[index] if prefix_length else None)
        if index < len(blocks) - 1:
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)[valid]
            x = _residual_tail(block, x, attended.reshape(-1, width))
        else:  # last block: only the pooled row of every text
            q_pooled = q[rows, :, local][:, :, None]  # [B, heads, 1, head_dim]
            attended = F.scaled_dot_product_attention(q_pooled, k, v, attn_mask=mask[local][:, None, None, :])
            pooled = x[_row_offsets(valid) + local]  # packed index of each text's EOT
            x = _residual_tail(block, pooled, attended.reshape(batch, width))
    x = model.ln_final(x)
    projection = model.text_projection
    if projection is None:
        return x
    return projection(x) if isinstance(projection, torch.nn.Linear) else x @ projection


def _row_offsets(valid: torch.Tensor) -> torch.Tensor:
    """Index of each row's first packed position in `tensor[valid]`."""
    counts = valid.sum(dim=1)
    return torch.cumsum(counts, dim=0) - counts


@torch.no_grad()
def encode_image_pruned(model: CLIP, pixels: torch.Tensor) -> torch.Tensor:
    """Unnormalised image embeddings; the last block only computes the class token."""
    visual = model.visual
    x = visual._embeds(pixels)
    blocks = list(visual.transformer.resblocks)
    for block in blocks[:-1]:
        x = block(x)
    last = blocks[-1]
    h = last.ln_1(x)
    k, v = _keys_values(last, h)
    x = _block_rows(last, x[:, :1], h[:, :1], k, v, None)[:, 0]
    x = visual.ln_post(x)
    return x @ visual.proj if visual.proj is not None else x


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the id prefix shared by all sequences, ending before the earliest EOT (argmax) of any of them."""
    if not sequences:
        return 0
    limit = min(max(range(len(s)), key=s.__getitem__) for s in sequences)  # first argmax = pooled position
    first = sequences[0]
    length = 0
    while length < limit and all(s[length] == first[length] for s in sequences):
        length += 1
    return length
