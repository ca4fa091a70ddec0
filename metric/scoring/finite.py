"""Refusing non-finite embeddings and scores: a NaN/inf is never scored, cached or written, and the error names
the first offending image or caption and the model whose weights produced it."""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from pacs.metric.common.errors import NonFiniteError


def model_label(backbone: Any) -> str:
    """The model as a user knows it: its checkpoint file when known, else its name."""
    source = getattr(backbone, "source", None) or {}
    path = source.get("path") or source.get("checkpoint") or source.get("pretrained")
    name = getattr(backbone, "name", "the model")
    return f"checkpoint {path}" if path and str(path) != str(name) else f"model {name}"


def image_label(key: str, image: Any, labels: dict[str, str]) -> str:
    """How an error names an image: its ids (the scorer's `names`), else its path."""
    if key in labels:
        return f"image {labels[key]}"
    return f"image {image}" if isinstance(image, (str, os.PathLike)) else "a PIL image"


def first_nonfinite_row(values: torch.Tensor | np.ndarray) -> int | None:
    """The index of the first row (or element, for 1-D values) holding a NaN or an infinity; None if none does."""
    array = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    if array.size == 0:
        return None
    finite = np.isfinite(array.reshape(array.shape[0], -1)).all(axis=1)
    bad = np.flatnonzero(~finite)
    return int(bad[0]) if len(bad) else None


def check_embeddings(embeddings: torch.Tensor, label: Callable[[int], str], backbone: Any) -> None:
    """NonFiniteError naming ``label(i)`` of the first non-finite embedding row and the model that computed it."""
    index = first_nonfinite_row(embeddings)
    if index is not None:
        raise NonFiniteError(f"{label(index)}: its embedding is not finite (NaN/inf): the weights of "
                             f"{model_label(backbone)} are not finite (a diverged training?); nothing was scored")


def check_scores(scores: np.ndarray, candidates: Sequence[str], w: float, backbone: Any) -> None:
    """NonFiniteError naming the first candidate whose score is NaN/inf (finite embeddings: a non-finite `w`)."""
    index = first_nonfinite_row(scores)
    if index is not None:
        raise NonFiniteError(f"candidate #{index} {candidates[index]!r}: its score is {scores[index]} (w={w:g}, "
                             f"{model_label(backbone)}): scores must be finite", parameter="w")
