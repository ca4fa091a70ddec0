"""The captioner: an encoder-decoder Transformer over CLIP grid features (PAC-S++ §4.2, §5.1).

The encoder projects the visual tokens `[B, R, Dv]` to `d_model` and runs `encoder_layers` self-attention
layers; the decoder is causal, with learned positions, and supports incremental decoding through a
key/value cache (`start_cache` / `step`) so that beam search costs one token per step.
Dropout (including attention dropout) draws its masks from per-example generators while
`Captioner.example_rng(rng)` is active (training: see `pacs.captioner.modeling.example_rng`), from torch's global generator
otherwise.
Token ids follow `pacs.captioner.modeling.vocab`: 0 pad, 1 bos, 2 eos, 3 unk.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from annotated_types import Le
from torch import nn

from pacs.captioner.modeling.example_rng import ExampleRNG
from pacs.captioner.modeling.vocab import BOS_ID, EOS_ID, PAD_ID
from pacs.metric.common.config import MAX_LENGTH, Fraction, NonNegativeInt, PositiveInt
from pacs.metric.common.errors import InputError


@dataclass
class CaptionerConfig:
    """Architecture of the captioner (defaults: PAC-S++'s 3+3 layers, d_model 512, 8 heads)."""

    vocab_size: Annotated[NonNegativeInt, Le(1_000_000)] = 0
    feature_dim: Annotated[NonNegativeInt, Le(16_384)] = 768
    d_model: Annotated[PositiveInt, Le(4096)] = 512
    n_heads: Annotated[PositiveInt, Le(64)] = 8
    encoder_layers: Annotated[PositiveInt, Le(48)] = 3
    decoder_layers: Annotated[PositiveInt, Le(48)] = 3
    ffn_dim: Annotated[PositiveInt, Le(16_384)] = 2048
    dropout: Fraction = 0.1
    max_length: Annotated[PositiveInt, Le(MAX_LENGTH)] = 20

    def validate(self) -> None:
        """Cross-field checks run when the config is loaded (pacs.metric.common.config.from_dict)."""
        if self.d_model % self.n_heads:
            raise InputError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")


class ExampleDropout(nn.Module):
    """Dropout whose mask comes from `self.rng` (an `ExampleRNG`, set by `Captioner.example_rng`) when set."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = float(p)
        self.rng: ExampleRNG | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Zero each element with probability `p` and scale the rest by `1/(1-p)` (identity in eval mode)."""
        if not self.training or self.p <= 0.0:
            return x
        if self.rng is None:
            return F.dropout(x, self.p, training=True)
        keep = self.rng.rand(x.shape, x.device) >= self.p
        return x * keep.to(x.dtype) * (1.0 / (1.0 - self.p))

    def extra_repr(self) -> str:
        """Shown by `print(module)`."""
        return f"p={self.p}"


class _Attention(nn.Module):
    """Multi-head attention with separate query and key/value inputs (for caching)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        if d_model % n_heads:
            raise InputError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.query = nn.Linear(d_model, d_model)
        self.key_value = nn.Linear(d_model, 2 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.dropout = dropout
        self.attention_drop = ExampleDropout(dropout)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, D] -> [B, H, T, D/H]."""
        b, t, d = x.shape
        return x.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)

    def keys_values(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Project `x` to per-head keys and values."""
        k, v = self.key_value(x).chunk(2, dim=-1)
        return self.split_heads(k), self.split_heads(v)

    def attend(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
        """Attend from queries `x` [B, T, D] to per-head keys/values."""
        q = self.split_heads(self.query(x))
        if self.training and self.dropout > 0 and self.attention_drop.rng is not None:
            # Explicit attention so that the dropout mask on the weights comes from the per-example generators.
            scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
            if causal:  # top-left aligned, as scaled_dot_product_attention's is_causal
                allowed = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
                scores = scores.masked_fill(~allowed, float("-inf"))
            out = self.attention_drop(scores.softmax(-1)) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                 dropout_p=self.dropout if self.training else 0.0)
        b, h, t, dh = out.shape
        return self.out(out.transpose(1, 2).reshape(b, t, h * dh))


class _FeedForward(nn.Sequential):
    def __init__(self, d_model: int, ffn_dim: int, dropout: float) -> None:
        super().__init__(nn.Linear(d_model, ffn_dim), nn.GELU(), ExampleDropout(dropout), nn.Linear(ffn_dim, d_model))


class _EncoderLayer(nn.Module):
    def __init__(self, c: CaptionerConfig) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(c.d_model), nn.LayerNorm(c.d_model)
        self.attention = _Attention(c.d_model, c.n_heads, c.dropout)
        self.ffn = _FeedForward(c.d_model, c.ffn_dim, c.dropout)
        self.drop = ExampleDropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-LN self-attention + feed-forward block."""
        h = self.norm1(x)
        x = x + self.drop(self.attention.attend(h, *self.attention.keys_values(h)))
        return x + self.drop(self.ffn(self.norm2(x)))


class _DecoderLayer(nn.Module):
    def __init__(self, c: CaptionerConfig) -> None:
        super().__init__()
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(c.d_model) for _ in range(3))
        self.self_attention = _Attention(c.d_model, c.n_heads, c.dropout)
        self.cross_attention = _Attention(c.d_model, c.n_heads, c.dropout)
        self.ffn = _FeedForward(c.d_model, c.ffn_dim, c.dropout)
        self.drop = ExampleDropout(c.dropout)

    def forward(self, x: torch.Tensor, memory_kv: tuple[torch.Tensor, torch.Tensor],
                cache: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """Causal self-attention (extending `cache` when given), cross-attention, feed-forward."""
        h = self.norm1(x)
        k, v = self.self_attention.keys_values(h)
        causal = True
        if cache is not None:
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
            causal = x.shape[1] > 1
        x = x + self.drop(self.self_attention.attend(h, k, v, causal=causal))
        x = x + self.drop(self.cross_attention.attend(self.norm2(x), *memory_kv))
        return x + self.drop(self.ffn(self.norm3(x)))


class DecoderState:
    """What incremental decoding carries between steps: cross-attention keys/values and self-attention caches."""

    def __init__(self, memory_kv: list[tuple[torch.Tensor, torch.Tensor]], caches: list[dict[str, torch.Tensor]],
                 position: int = 0) -> None:
        self.memory_kv = memory_kv
        self.caches = caches
        self.position = position

    def select(self, index: torch.Tensor) -> DecoderState:
        """Keep (and reorder/repeat) the rows `index` of every cached tensor (e.g. k rows per image)."""
        memory_kv = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.memory_kv]
        return DecoderState(memory_kv, self._caches(index), self.position)

    def reorder_within_images(self, index: torch.Tensor) -> DecoderState:
        """`select(index)` for an `index` that sends every row to a row of the same image (a beam search step).

        The rows of one image hold the same cross-attention keys/values, so those are kept as they are
        (the same values `select` would gather); only the self-attention caches are gathered.
        """
        return DecoderState(self.memory_kv, self._caches(index), self.position)

    def _caches(self, index: torch.Tensor) -> list[dict[str, torch.Tensor]]:
        return [{name: t.index_select(0, index) for name, t in cache.items()} for cache in self.caches]


class Captioner(nn.Module):
    """Encoder-decoder Transformer captioner over grid features `[B, R, feature_dim]`."""

    #: opt-in sharing of an image's encoder work between its rows (`forward`): faster, not bit-identical
    share_image_work: bool = False

    def __init__(self, config: CaptionerConfig) -> None:
        super().__init__()
        if config.vocab_size <= 4:
            raise InputError(f"captioner vocab_size must exceed the 4 special tokens, got {config.vocab_size}")
        self.config = config
        c = config
        self.visual_projection = nn.Sequential(nn.Linear(c.feature_dim, c.d_model), nn.GELU(),
                                               ExampleDropout(c.dropout), nn.LayerNorm(c.d_model))
        self.encoder = nn.ModuleList(_EncoderLayer(c) for _ in range(c.encoder_layers))
        self.encoder_norm = nn.LayerNorm(c.d_model)
        self.embedding = nn.Embedding(c.vocab_size, c.d_model, padding_idx=PAD_ID)
        self.positions = nn.Embedding(c.max_length + 2, c.d_model)
        self.embedding_drop = ExampleDropout(c.dropout)
        self.decoder = nn.ModuleList(_DecoderLayer(c) for _ in range(c.decoder_layers))
        self.decoder_norm = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=module.embedding_dim ** -0.5)

    @contextlib.contextmanager
    def example_rng(self, rng: ExampleRNG | None) -> Iterator[None]:
        """Within the block, every dropout of the model draws example `e`'s rows from `rng`'s generator `e`."""
        modules = [m for m in self.modules() if isinstance(m, ExampleDropout)]
        for module in modules:
            module.rng = rng
        try:
            yield
        finally:
            for module in modules:
                module.rng = None

    # -- encoder ---------------------------------------------------------------------------------------
    def encode(self, features: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """Encode grid features `[B, R, Dv]` into memory `[B, R, d_model]` (`[N, R, d_model]`: image `rows[n]`).

        With `rows` the projection before the first dropout runs once per image; every later layer runs
        per row, so each row draws its own dropout masks exactly as an encode of `features[rows]` would.
        """
        if features.dim() != 3 or features.shape[-1] != self.config.feature_dim:
            raise InputError(f"expected features [B, R, {self.config.feature_dim}], got {tuple(features.shape)}")
        linear, activation, dropout, norm = self.visual_projection
        x = activation(linear(features.to(self.embedding.weight.dtype)))
        if rows is not None:
            x = x.index_select(0, rows)
        x = norm(dropout(x))
        for layer in self.encoder:
            x = layer(x)
        return self.encoder_norm(x)

    def draws_dropout(self) -> bool:
        """Whether a forward pass draws dropout masks (training mode with `dropout > 0`)."""
        return self.training and self.config.dropout > 0

    def _memory_kv(self, memory: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [layer.cross_attention.keys_values(memory) for layer in self.decoder]

    # -- decoder ---------------------------------------------------------------------------------------
    def _decode(self, tokens: torch.Tensor, memory_kv: list, caches: list | None, start: int) -> torch.Tensor:
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        if positions[-1] >= self.positions.num_embeddings:
            raise InputError(f"sequence longer than max_length+2={self.positions.num_embeddings} positions")
        x = self.embedding_drop(self.embedding(tokens) * math.sqrt(self.config.d_model) + self.positions(positions))
        for index, layer in enumerate(self.decoder):
            x = layer(x, memory_kv[index], None if caches is None else caches[index])
        return self.head(self.decoder_norm(x))

    def forward(self, features: torch.Tensor, input_tokens: torch.Tensor, repeats: int = 1,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """Teacher forcing: logits `[N, T, V]` for `input_tokens` `[N, T]` (starting with <bos>).

        With `repeats > 1` (N = B·repeats) each image is encoded once and its memory, projected to the
        cross-attention keys/values, shared by its `repeats` consecutive sequences (SCST scores k captions
        per image); the dropout masks of the encoder are then the image's. With `rows` (`[N]`, image row of
        each sequence; XE's captions of one image) the result is that of `features[rows]`, dropout masks
        included: the image is encoded once when no dropout is drawn, else only the projection is shared.

        That sharing is opt-in (`share_image_work = True`): the shared matmuls run on fewer rows and their
        gradients are summed in another order, so the losses differ in the last bits, and over a long run (the
        main command's 2,000 XE steps) the checkpoint validation picks moves. By default the memory is that of
        `features[rows]` (or repeated before the key/value projections), computed as 0.6 did.
        """
        if rows is not None and repeats != 1:
            raise InputError("forward: give either repeats or rows, not both")
        if not self.share_image_work:  # the exact default: what 0.6 computed, bit for bit
            memory = self.encode(features if rows is None else features.index_select(0, rows))
            if repeats > 1:
                memory = memory.repeat_interleave(repeats, dim=0)
            return self._decode(input_tokens, self._memory_kv(memory), None, 0)
        if rows is None:
            memory_kv = self._memory_kv(self.encode(features))
            if repeats > 1:  # project first, then repeat: the key/value projections run on B rows, not B·repeats
                memory_kv = [(k.repeat_interleave(repeats, dim=0), v.repeat_interleave(repeats, dim=0))
                             for k, v in memory_kv]
        elif self.draws_dropout():  # every row draws its own encoder masks (its example's stream)
            memory_kv = self._memory_kv(self.encode(features, rows))
        else:
            memory_kv = [(k.index_select(0, rows), v.index_select(0, rows))
                         for k, v in self._memory_kv(self.encode(features))]
        return self._decode(input_tokens, memory_kv, None, 0)

    def log_probs(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Per-token log-probabilities `[B, T]` of `tokens` `[B, T]` (no <bos>; <bos> is prepended here).

        Positions after the first <eos> are zeroed (see `sequence_mask`).
        """
        return token_log_probs(self.forward(features, shift_right(tokens)), tokens)

    def start(self, features: torch.Tensor) -> DecoderState:
        """Encode features and return an empty decoder state for incremental decoding."""
        return DecoderState(self._memory_kv(self.encode(features)), [{} for _ in self.decoder])

    def step(self, tokens: torch.Tensor, state: DecoderState) -> torch.Tensor:
        """Feed one token per row `[N]` and return next-token log-probabilities `[N, V]` (state updated)."""
        logits = self._decode(tokens.view(-1, 1), state.memory_kv, state.caches, state.position)
        state.position += 1
        return logits[:, -1].float().log_softmax(-1)


def shift_right(tokens: torch.Tensor) -> torch.Tensor:
    """Decoder inputs for target `tokens [B, T]`: <bos> followed by all but the last token."""
    bos = torch.full((tokens.shape[0], 1), BOS_ID, dtype=tokens.dtype, device=tokens.device)
    return torch.cat([bos, tokens[:, :-1]], dim=1)


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Log-probabilities `[B, T]` of `tokens` under `logits [B, T, V]`, zeroed after the first <eos>."""
    gathered = logits.float().log_softmax(-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return gathered * sequence_mask(tokens)


def sequence_mask(tokens: torch.Tensor) -> torch.Tensor:
    """1.0 for tokens up to and including the first <eos> of each row, 0.0 after it (and on padding)."""
    is_eos = tokens == EOS_ID
    after_eos = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    return (~after_eos & (tokens != PAD_ID)).float()


def captioner_config_dict(config: CaptionerConfig) -> dict[str, Any]:
    """Plain-dict form of a captioner config (stored in checkpoints)."""
    return dataclasses.asdict(config)
