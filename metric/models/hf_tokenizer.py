"""Hugging Face tokenizers (SigLIP, SigLIP2, transformers CLIP) with pacs' `TokenizedBatch`: ids + truncation flags.

The ids are the library's own: open_clip's `HFTokenizer` call (its text cleaning, `padding="max_length"`,
`truncation=True`) for open_clip models, the folder's tokenizer with the same arguments for transformers
models. Every row is padded to the full context with the tokenizer's pad id (and on its padding side), since
these text towers are not causal (SigLIP pools the last position). A text is *truncated* when its untruncated
ids (special tokens included) do not fit in the context.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from pacs.metric.models.tokenizer import TokenizedBatch


def _identity(text: str) -> str:
    return text


class HFTextTokenizer:
    """A Hugging Face tokenizer at a fixed context length; `encode` reports which texts were truncated."""

    def __init__(self, tokenizer: Any, context_length: int, clean: Callable[[str], str] | None = None,
                 strip_sep_token: bool = False, description: str = "") -> None:
        self.tokenizer = tokenizer
        self.context_length = int(context_length)
        self.clean = clean or _identity
        self.strip_sep_token = bool(strip_sep_token)
        self.description = description or type(tokenizer).__name__
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else 0

    @classmethod
    def from_open_clip(cls, open_clip_tokenizer: Any) -> HFTextTokenizer:
        """Wrap open_clip's `HFTokenizer` (same cleaning, same separator handling, same context)."""
        return cls(open_clip_tokenizer.tokenizer, open_clip_tokenizer.context_length,
                   clean=open_clip_tokenizer.clean_fn, strip_sep_token=open_clip_tokenizer.strip_sep_token,
                   description=f"open_clip HFTokenizer ({type(open_clip_tokenizer.tokenizer).__name__})")

    def _ids(self, texts: list[str]) -> torch.Tensor:
        ids = self.tokenizer(texts, return_tensors="pt", max_length=self.context_length, padding="max_length",
                             truncation=True).input_ids
        if self.strip_sep_token:  # open_clip's HFTokenizer: separator ids become 0
            ids = torch.where(ids == self.tokenizer.sep_token_id, torch.zeros_like(ids), ids)
        return ids.long()

    def encode(self, texts: Sequence[str]) -> TokenizedBatch:
        """Ids padded to the context (one list per text) and which texts did not fit."""
        cleaned = [self.clean(text) for text in texts]
        if not cleaned:
            return TokenizedBatch(ids=[], n_truncated=0, truncated=[])
        full = self.tokenizer(cleaned, truncation=False, padding=False, verbose=False).input_ids
        truncated = [len(ids) > self.context_length for ids in full]
        rows = self._ids(cleaned)
        return TokenizedBatch(ids=[row.tolist() for row in rows], n_truncated=sum(truncated), truncated=truncated)

    def __call__(self, texts: str | Sequence[str], context_length: int | None = None) -> torch.LongTensor:
        """`LongTensor[N, context_length]` of ids (the context length is fixed for these models)."""
        if isinstance(texts, str):
            texts = [texts]
        if context_length is not None and int(context_length) != self.context_length:
            raise ValueError(f"this tokenizer pads to its model's context {self.context_length}, not {context_length}")
        return self._ids([self.clean(text) for text in texts])
