"""The captioner SCST trains, as a policy: what the shared loop of `pacs.captioner.modeling.train_scst` asks of a model.

Two implementations: `PacsPolicy` (pacs' own captioner over cached grid features, below) and
`pacs.captioner.modeling.hf_policy.HFPolicy` (a transformers image-to-text folder: BLIP, GIT, LLaVA-style). The loop
owns batching, rewards, baselines, the KL guard, the hacking monitor, checkpoints and selection; a policy owns
how images become model inputs, how captions are drawn (`sample`, `greedy`: token ids `[B, k, T]` whose rows
end with the end token, padded after it) and scored (`token_log_probs`: `[N, T]`, the end token's log-probability
included, zero after it), how token ids become text, the frozen reference of the KL guard and how a trained
model is saved.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from pacs.captioner.modeling.checkpoints import load_captioner, save_captioner
from pacs.captioner.modeling.decoding import beam_search, decode_texts, greedy, sample
from pacs.captioner.modeling.example_rng import ExampleRNG
from pacs.captioner.modeling.model import shift_right, token_log_probs
from pacs.captioner.modeling.reference_policy import ReferencePolicy


class PolicyReference(Protocol):
    """The KL guard's frozen reference: `KL(y)` of sampled captions (policy in eval mode, no gradients)."""

    folder: str

    def sequence_kl(self, policy: Any, batch: Any, tokens: torch.Tensor, repeats: int = 1) -> torch.Tensor:
        """`Σ_t log π(y_t) − log π_ref(y_t)` `[N]` of `tokens` `[N = B·repeats, T]` (`policy`: the unwrapped module)."""


class CaptionPolicy(Protocol):
    """A trainable captioner as the SCST loop sees it (module docstring)."""

    kind: str  # "pacs" or "transformers"
    module: torch.nn.Module  # what the optimizer trains (accelerate wraps it)
    max_length: int  # the longest caption (tokens, end token included) it can produce

    def missing_images(self, image_ids: Iterable[str]) -> list[str]:
        """The ids among `image_ids` it has no input for (cached features, image paths)."""

    def batch(self, image_ids: Sequence[str], device: torch.device | str) -> Any:
        """The model inputs of `image_ids` on `device`."""

    def sample(self, module: Any, batch: Any, config: Any, rng: ExampleRNG) -> torch.Tensor:
        """`config.k` captions per image `[B, k, T]` (`config.samples`: beam or multinomial), no gradients."""

    def greedy(self, module: Any, batch: Any, max_length: int) -> torch.Tensor:
        """The greedy caption of each image `[B, 1, T]`, no gradients."""

    def token_log_probs(self, model: Any, module: Any, batch: Any, tokens: torch.Tensor, repeats: int,
                        dropout: ExampleRNG | None) -> torch.Tensor:
        """Teacher-forced `log π(y_t)` `[N, T]` through `model` (the wrapped module), zero after the end token."""

    def decode(self, tokens: torch.Tensor) -> list[list[str]]:
        """Caption strings `[B][k]` of `tokens` `[B, k, T]`."""

    def reference(self, folder: str | os.PathLike, device: torch.device | str) -> PolicyReference:
        """The frozen reference policy loaded from `folder` (the SCST init checkpoint by default)."""

    def save(self, folder: str | os.PathLike, module: Any, extra: dict[str, Any]) -> Path:
        """Write the trained model `module` (unwrapped) to `folder` as a loadable captioner folder."""


class PacsPolicy:
    """pacs' own captioner (`pacs.captioner.modeling.model.Captioner`) over a feature cache."""

    kind = "pacs"

    def __init__(self, model: Any, vocab: Any, info: dict[str, Any], features: Any) -> None:
        self.module, self.vocab, self.info, self.features = model, vocab, info, features
        self.max_length = int(model.config.max_length)

    @classmethod
    def load(cls, folder: str | os.PathLike, features: Any) -> PacsPolicy:
        """The captioner folder `folder` (model.safetensors + captioner.json) over `features`."""

        model, vocab, info = load_captioner(folder)
        return cls(model, vocab, info, features)

    def missing_images(self, image_ids: Iterable[str]) -> list[str]:
        """Ids without cached features."""
        return list(self.features.missing(image_ids))

    def batch(self, image_ids: Sequence[str], device: torch.device | str) -> torch.Tensor:
        """The cached grid features `[B, ...]` of `image_ids`."""
        return self.features.get(list(image_ids)).to(device)

    def sample(self, module: Any, batch: torch.Tensor, config: Any, rng: ExampleRNG) -> torch.Tensor:
        """k beams or k multinomial samples (`pacs.captioner.modeling.decoding`)."""

        if config.samples == "beam":
            return beam_search(module, batch, beam_size=config.k, max_length=config.max_length,
                               length_penalty=config.length_penalty).tokens
        return sample(module, batch, k=config.k, temperature=config.temperature, top_k=config.top_k,
                      max_length=config.max_length, rng=rng).tokens

    def greedy(self, module: Any, batch: torch.Tensor, max_length: int) -> torch.Tensor:
        """Argmax decoding."""

        return greedy(module, batch, max_length).tokens

    def token_log_probs(self, model: Any, module: Any, batch: torch.Tensor, tokens: torch.Tensor, repeats: int,
                        dropout: ExampleRNG | None) -> torch.Tensor:
        """Teacher forcing (`shift_right`), dropout masks from `dropout` (per example)."""
        import contextlib


        with module.example_rng(dropout) if dropout is not None else contextlib.nullcontext():
            logits = model(batch, shift_right(tokens), repeats=repeats)
        return token_log_probs(logits, tokens)

    def decode(self, tokens: torch.Tensor) -> list[list[str]]:
        """`vocab.decode` of every row."""

        return decode_texts(self.vocab, tokens)

    def reference(self, folder: str | os.PathLike, device: torch.device | str) -> PolicyReference:
        """`pacs.captioner.modeling.reference_policy.ReferencePolicy` (same vocabulary required)."""

        return ReferencePolicy(folder, self.vocab, device)

    def save(self, folder: str | os.PathLike, module: Any, extra: dict[str, Any]) -> Path:
        """A pacs captioner folder (`save_captioner`)."""

        return save_captioner(folder, module, self.vocab, self.info.get("features", {}), extra)
