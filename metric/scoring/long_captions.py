"""Captions longer than the text context: `long_captions="chunk"` splits them at sentence boundaries.

A caption whose prompted text fits the context is embedded as it is (chunking changes nothing there). A longer
one is split into sentences (a sentence ends at `.`, `!` or `?` followed by whitespace, or at a line break),
packed greedily in order into pieces whose prompted text (`prompt + piece`, the prompt "A photo depicts "
included when used) fits the context; a single sentence longer than the context is its own piece and is
truncated (the caption then counts as truncated). The caption's embedding is the mean of the L2-normalised
piece embeddings, L2-normalised again (`mean_of_normalised`).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import torch

_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+|\s*[\r\n]+\s*")


def split_sentences(text: str) -> list[str]:
    """The sentences of `text` (stripped, empty ones dropped), split after `.`/`!`/`?` + whitespace or at line breaks.

    >>> split_sentences("A dog runs. It is brown!  Grass\\nbehind it")
    ['A dog runs.', 'It is brown!', 'Grass', 'behind it']
    """
    return [part.strip() for part in _SENTENCE_BREAK.split(text) if part.strip()]


def pack_pieces(caption: str, fits: Callable[[str], bool], prompt: str = "") -> list[str]:
    """Consecutive sentences of `caption` joined (by one space) into pieces with `fits(prompt + piece)`.

    Greedy and in order: a sentence joins the current piece while the prompted piece still fits, else it starts
    a new piece; a sentence that does not fit on its own is a piece by itself (the caller truncates it). A caption
    without sentence breaks is one piece.
    """
    sentences = split_sentences(caption) or [caption]
    pieces: list[str] = []
    current: list[str] = []
    for sentence in sentences:
        trial = " ".join([*current, sentence])
        if current and not fits(prompt + trial):
            pieces.append(" ".join(current))
            current = [sentence]
        else:
            current.append(sentence)
    pieces.append(" ".join(current))
    return pieces


def mean_of_normalised(embeddings: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
    """`normalize(mean_i normalize(e_i))` of piece embeddings `[P, E]`: one caption's chunked embedding."""
    stacked = torch.stack(list(embeddings)) if not isinstance(embeddings, torch.Tensor) else embeddings
    unit = torch.nn.functional.normalize(stacked.float(), dim=-1)
    return torch.nn.functional.normalize(unit.mean(dim=0), dim=-1)
