"""Contrastive scores as pure functions on embeddings (numpy arrays or torch tensors).

- `clip_score`: w * max(cos(image, text), 0) — CLIP-S / PAC-S / PAC-S++ (the text carries the prompt).
- `reference_term`: max over the references of cos(candidate, reference). As in the official PAC-S code it is
  NOT clipped at 0 and not multiplied by w.
- `ref_score`: the harmonic mean 2ab / (a + b) of the two; 0 where a + b == 0 (the official code divides by
  zero there and gets NaN, written `null`; both terms being 0 is the only case a clipped score meets). A
  negative reference term therefore gives a negative or undefined-looking value exactly as the official code.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np
import torch

Array = TypeVar("Array", np.ndarray, torch.Tensor)
ArrayLike = np.ndarray | torch.Tensor


def _normalize(x: ArrayLike) -> ArrayLike:
    if isinstance(x, torch.Tensor):
        return torch.nn.functional.normalize(x.float(), dim=-1)
    x = np.asarray(x, dtype=np.float32)
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


def cosine(a: ArrayLike, b: ArrayLike) -> ArrayLike:
    """Row-wise cosine similarity of two `[N, E]` arrays (inputs need not be normalised)."""
    a, b = _normalize(a), _normalize(b)
    return (a * b).sum(-1)


def clip_score(image_emb: ArrayLike, text_emb: ArrayLike, w: float) -> ArrayLike:
    """w * max(cos(image, text), 0) per row (CLIP-S with w = 2.5, PAC-S with w = 2.0).

    >>> import numpy as np
    >>> from pacs.metric import clip_score
    >>> image = np.array([[1.0, 0.0], [1.0, 0.0]])
    >>> text = np.array([[3.0, 4.0], [-1.0, 0.0]])       # cosines 0.6 and -1 (inputs need not be unit length)
    >>> clip_score(image, text, w=2.5).astype(float).round(4).tolist()  # 2.5 * 0.6; a negative cosine gives 0
    [1.5, 0.0]
    """
    cos = cosine(image_emb, text_emb)
    if isinstance(cos, torch.Tensor):
        return w * torch.clamp(cos, min=0)
    return (w * np.maximum(cos, 0)).astype(np.float32)


def reference_term(candidate_emb: ArrayLike, reference_embs: ArrayLike | Sequence[ArrayLike]) -> ArrayLike:
    """Max over references of cos(candidate, reference), not clipped.

    `candidate_emb` is `[E]` with `reference_embs` `[R, E]` (returns a scalar), or `[N, E]` with a list of N
    `[R_i, E]` arrays (returns `[N]`).

    >>> import numpy as np
    >>> from pacs.metric import reference_term
    >>> candidate = np.array([1.0, 0.0])
    >>> references = np.array([[0.0, 1.0], [3.0, 4.0], [-1.0, 0.0]])  # cosines 0, 0.6, -1
    >>> round(float(reference_term(candidate, references)), 4)
    0.6
    >>> reference_term(np.array([[1.0, 0.0], [0.0, 1.0]]), [references, references[2:]]).astype(float).round(4).tolist()
    [0.6, 0.0]
    """
    if isinstance(reference_embs, (list, tuple)):
        values = [reference_term(candidate_emb[i], refs) for i, refs in enumerate(reference_embs)]
        if isinstance(candidate_emb, torch.Tensor):
            return torch.stack([torch.as_tensor(v) for v in values])
        return np.asarray(values, dtype=np.float32)
    if reference_embs.shape[0] == 0:
        raise ValueError("reference_term needs at least one reference")
    cand = _normalize(candidate_emb)
    refs = _normalize(reference_embs)
    sims = refs @ cand
    return sims.max() if isinstance(sims, torch.Tensor) else np.float32(sims.max())


def ref_score(score: ArrayLike, ref_term: ArrayLike) -> ArrayLike:
    """Harmonic mean 2ab / (a + b) of the reference-free score and the reference term; 0 where a + b == 0.

    >>> from pacs.metric import ref_score
    >>> ref_score([1.5, 0.0, 0.5], [0.6, 0.0, -0.5]).astype(float).round(4).tolist()  # 2*1.5*0.6/2.1; 0 if a+b=0
    [0.8571, 0.0, 0.0]
    """
    if isinstance(score, torch.Tensor) or isinstance(ref_term, torch.Tensor):
        a, b = torch.as_tensor(score, dtype=torch.float32), torch.as_tensor(ref_term, dtype=torch.float32)
        total = a + b
        safe = torch.where(total == 0, torch.ones_like(total), total)
        return torch.where(total == 0, torch.zeros_like(total), 2 * a * b / safe)
    a, b = np.asarray(score, dtype=np.float32), np.asarray(ref_term, dtype=np.float32)
    total = a + b
    safe = np.where(total == 0, np.float32(1), total)
    return np.where(total == 0, np.float32(0), 2 * a * b / safe).astype(np.float32)
