"""What the scorer returns: per-instance scores with their conventions (`ScoreResult`) and text embeddings."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class ScoreResult:
    """Per-instance scores (float32 arrays in input order) and counts.

    `clip_scores` is the reference-free score (`w·max(cos, 0)`, or `sigmoid(scale·cos + bias)` when `score_kind`
    is "sigmoid"), `ref_terms` the reference term (max cosine, or its sigmoid), `truncated[i]` whether caption i
    was cut to the text context (with `long_captions="chunk"`: whether one of its sentences was), `n_chunked`
    how many captions were split into several pieces.
    """

    scores: np.ndarray
    clip_scores: np.ndarray
    ref_terms: np.ndarray | None
    cosines: np.ndarray
    n_truncated: int
    n_empty: int
    w: float
    n_truncated_references: int = 0
    truncated: list[bool] = field(default_factory=list)
    score_kind: str = "cosine"
    long_captions: str = "truncate"
    n_chunked: int = 0

    @property
    def mean(self) -> float:
        """Mean of `scores` (NaN for an empty result)."""
        return float(np.mean(self.scores)) if len(self.scores) else float("nan")


@dataclass
class TextEmbeddings:
    """L2-normalised text embeddings with tokenization facts."""

    embeddings: torch.Tensor
    truncated: list[bool]
    pieces: list[int] = field(default_factory=list)

    @property
    def n_truncated(self) -> int:
        """How many of the texts were longer than the context and truncated."""
        return sum(self.truncated)

    @property
    def n_chunked(self) -> int:
        """How many of the texts were embedded as several pieces (`long_captions="chunk"`)."""
        return sum(count > 1 for count in self.pieces)
