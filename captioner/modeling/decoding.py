"""Decoding: greedy, batched beam search (top-k sequences + log-probabilities) and multinomial sampling.

Every function returns a `Decoded` with `tokens [B, k, L]` (padded with <pad> after <eos>) and
`log_probs [B, k]`, the model's summed log-probability of each sequence up to and including its first
<eos> — the same quantity `Captioner.log_probs(...).sum(-1)` computes by teacher forcing.
<pad> and <bos> are never generated (they are excluded after the softmax, not renormalised away).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pacs.captioner.modeling.example_rng import ExampleRNG
from pacs.captioner.modeling.model import Captioner
from pacs.captioner.modeling.vocab import BOS_ID, EOS_ID, PAD_ID
from pacs.metric.common.config import MIN_TEMPERATURE
from pacs.metric.common.errors import InputError


@dataclass
class Decoded:
    """Decoded sequences: `tokens [B, k, L]`, `log_probs [B, k]` (summed), `scores [B, k]` (ranking score)."""

    tokens: torch.Tensor
    log_probs: torch.Tensor
    scores: torch.Tensor

    def lengths(self) -> torch.Tensor:
        """Number of generated tokens per sequence, <eos> included: `[B, k]`."""
        return (self.tokens != PAD_ID).sum(-1)


def _forbid_specials(log_probs: torch.Tensor) -> torch.Tensor:
    log_probs = log_probs.clone()
    log_probs[:, PAD_ID] = float("-inf")
    log_probs[:, BOS_ID] = float("-inf")
    return log_probs


def _max_steps(model: Captioner, max_length: int | None) -> int:
    """Generated tokens per sequence: up to `max_length` words plus the <eos>."""
    length = model.config.max_length if max_length is None else int(max_length)
    if not 1 <= length <= model.config.max_length:
        raise InputError(f"max_length must be in 1..{model.config.max_length}, got {length}")
    return length + 1


@torch.no_grad()
def greedy(model: Captioner, features: torch.Tensor, max_length: int | None = None) -> Decoded:
    """Greedy (argmax) decoding: one sequence per image, `tokens [B, 1, L]`."""
    decoded = sample(model, features, k=1, max_length=max_length, greedy_choice=True)
    return decoded


@torch.no_grad()
def sample(model: Captioner, features: torch.Tensor, k: int = 5, temperature: float = 1.0, top_k: int = 0,
           max_length: int | None = None, generator: torch.Generator | None = None,
           greedy_choice: bool = False, rng: ExampleRNG | None = None) -> Decoded:
    """Draw `k` multinomial samples per image (temperature, optional top-k); log-probs are the model's own.

    With `rng` (one generator per image) the `k` samples of image `i` come from generator `i` alone, so they
    do not depend on the other images of the batch; otherwise from `generator` (default: torch's global one).
    """
    if rng is not None and len(rng.generators) != features.shape[0]:
        raise InputError(f"sample: {len(rng.generators)} generators for {features.shape[0]} images")
    if k < 1:
        raise InputError(f"number of samples k must be >= 1, got {k}")
    if not temperature >= MIN_TEMPERATURE and not greedy_choice:  # 1e-300 is 0 in float32: a division by zero
        raise InputError(f"temperature must be >= {MIN_TEMPERATURE:g}, got {temperature}")
    batch = features.shape[0]
    state = model.start(features)
    if k > 1:
        state = state.select(torch.arange(batch, device=features.device).repeat_interleave(k))
    rows = batch * k
    steps = _max_steps(model, max_length)
    tokens = torch.full((rows, steps), PAD_ID, dtype=torch.long, device=features.device)
    total = torch.zeros(rows, device=features.device)
    finished = torch.zeros(rows, dtype=torch.bool, device=features.device)
    previous = torch.full((rows,), BOS_ID, dtype=torch.long, device=features.device)
    for t in range(steps):
        log_probs = _forbid_specials(model.step(previous, state))
        if greedy_choice:
            choice = log_probs.argmax(-1)
        else:
            logits = log_probs / temperature
            if top_k and top_k < logits.shape[-1]:
                threshold = logits.topk(top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < threshold, float("-inf"))
            probs = logits.softmax(-1)
            if rng is not None:
                choice = rng.multinomial(probs)
            else:
                choice = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        choice = choice.masked_fill(finished, PAD_ID)
        total = total + torch.where(finished, torch.zeros_like(total),
                                    log_probs.gather(-1, choice.clamp(min=0).unsqueeze(-1)).squeeze(-1))
        tokens[:, t] = choice
        finished = finished | (choice == EOS_ID)
        previous = choice
        if bool(finished.all()):
            break
    total = total.view(batch, k)
    return Decoded(tokens.view(batch, k, steps), total, total.clone())


@torch.no_grad()
def beam_search(model: Captioner, features: torch.Tensor, beam_size: int = 5, max_length: int | None = None,
                length_penalty: float = 0.0, return_k: int | None = None, min_length: int = 0) -> Decoded:
    """Batched beam search; returns the top `return_k` (default: all) beams per image, best first.

    Beams are ranked by summed log-probability, divided by `length ** length_penalty` when
    `length_penalty > 0` (length normalisation; lengths count the <eos>). `log_probs` stays the raw sum.
    The most probable sequence may be the empty caption (<eos> first): an under-trained model often gives
    <eos> more probability than any whole caption, which greedy decoding (one beam) does not find.
    `min_length` = N forbids <eos> before N words (0: the model decides).
    """
    if beam_size < 1:
        raise InputError(f"beam_size must be >= 1, got {beam_size}")
    return_k = beam_size if return_k is None else return_k
    if not 1 <= return_k <= beam_size:
        raise InputError(f"return_k must be in 1..beam_size={beam_size}, got {return_k}")
    device = features.device
    batch, K = features.shape[0], beam_size
    steps = _max_steps(model, max_length)
    if not 0 <= min_length < steps:
        raise InputError(f"min_length must be in 0..{steps - 1} (max_length), got {min_length}")
    state = model.start(features).select(torch.arange(batch, device=device).repeat_interleave(K))
    tokens = torch.full((batch, K, steps), PAD_ID, dtype=torch.long, device=device)
    sums = torch.zeros(batch, K, device=device)
    sums[:, 1:] = float("-inf")  # all beams start identical: keep one alive at the first step
    lengths = torch.zeros(batch, K, device=device)
    finished = torch.zeros(batch, K, dtype=torch.bool, device=device)
    previous = torch.full((batch * K,), BOS_ID, dtype=torch.long, device=device)
    row_offsets = (torch.arange(batch, device=device) * K).unsqueeze(1)
    for t in range(steps):
        log_probs = _forbid_specials(model.step(previous, state)).view(batch, K, -1)
        if t < min_length:
            log_probs[..., EOS_ID] = float("-inf")
        vocab = log_probs.shape[-1]
        # A finished beam continues only with <pad> at no cost.
        frozen = torch.full_like(log_probs, float("-inf"))
        frozen[..., PAD_ID] = 0.0
        log_probs = torch.where(finished.unsqueeze(-1), frozen, log_probs)
        candidate_sums = sums.unsqueeze(-1) + log_probs  # [B, K, V]
        candidate_lengths = (lengths + (~finished).float()).unsqueeze(-1).expand_as(candidate_sums)
        ranking = _rank(candidate_sums, candidate_lengths, length_penalty)
        top = ranking.view(batch, -1).topk(K, dim=-1)
        beam_index = torch.div(top.indices, vocab, rounding_mode="floor")
        token_index = top.indices % vocab
        sums = candidate_sums.view(batch, -1).gather(1, top.indices)
        lengths = candidate_lengths.reshape(batch, -1).gather(1, top.indices)
        was_finished = finished.gather(1, beam_index)
        tokens = tokens.gather(1, beam_index.unsqueeze(-1).expand_as(tokens))
        tokens[:, :, t] = token_index
        finished = was_finished | (token_index == EOS_ID)
        # beams stay in their image; a decoder state without that shortcut (another model's) gathers everything
        reorder = getattr(state, "reorder_within_images", state.select)
        state = reorder((row_offsets + beam_index).view(-1))
        previous = token_index.view(-1)
        if bool(finished.all()):
            break
    scores = _rank(sums, lengths, length_penalty)
    order = scores.argsort(dim=1, descending=True)[:, :return_k]
    return Decoded(tokens.gather(1, order.unsqueeze(-1).expand(-1, -1, steps)), sums.gather(1, order),
                   scores.gather(1, order))


def _rank(sums: torch.Tensor, lengths: torch.Tensor, length_penalty: float) -> torch.Tensor:
    if length_penalty <= 0:
        return sums
    return sums / lengths.clamp(min=1.0) ** length_penalty


def decode_texts(vocab, tokens: torch.Tensor) -> list[list[str]]:
    """Turn `tokens [B, k, L]` into caption strings `[B][k]` with `vocab.decode`."""
    return [[vocab.decode(row.tolist()) for row in image] for image in tokens]
