"""The `cider` reward: fast CIDEr-D (`pacs.eval.cider`) with document frequencies from the training references.

Candidates and references are normalised by the same tokenizer (`pacs.rewards.text`: PTB-style, lower-cased,
punctuation removed; `cider_tokenizer="fast"` in Python by default, `"ptb"` for pycocoevalcap's Java one).
Tokenized references are cached for the whole run; the document frequencies are computed once per training
set as compact arrays, the references tokenized and encoded into word ids block by block (no Python list of the
whole corpus) (and kept on disk with `cider_df_cache=PATH`), their lookup structure built once and
shared with any evaluation given the same table (`reward.fn.document_frequency`). A reward call costs the same
whatever the size of the training set: it prepares only the batch's references and looks n-grams up in the table.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from pacs.eval.cider import CiderD, DocumentFrequency
from pacs.eval.cider_tables import cider_df_blocks
from pacs.metric.common.errors import InputError
from pacs.rewards.registry import register_reward
from pacs.rewards.text import TOKENIZERS, CaptionTokenizer

logger = logging.getLogger(__name__)


class CiderDReward:
    """CIDEr-D of each sampled caption against its image's references (pycocoevalcap scale, ×10)."""

    def __init__(self, document_frequency: DocumentFrequency, tokenizer: CaptionTokenizer) -> None:
        self.scorer = CiderD(document_frequency=document_frequency)
        self.tokenizer = tokenizer
        self.tokenized_references: dict[tuple[str, ...], list[str]] = {}

    @property
    def document_frequency(self) -> DocumentFrequency:
        """The training-set document frequencies (pass them to `pacs.eval.cider_d` to evaluate with the same table)."""
        return self.scorer.document_frequency

    def _references(self, references: list[list[str]], image_ids: list[str]) -> list[list[str]]:
        """Tokenized references per image, cached by their text; new ones are tokenized in one call."""
        new = list(dict.fromkeys(tuple(refs) for refs in references if tuple(refs) not in self.tokenized_references))
        for image_id, refs in zip(image_ids, references):
            if not refs:
                raise InputError(f"cider reward: image {image_id!r} has no references")
        if new:
            flat = self.tokenizer([ref for refs in new for ref in refs])
            start = 0
            for refs in new:
                self.tokenized_references[refs] = flat[start:start + len(refs)]
                start += len(refs)
        return [self.tokenized_references[tuple(refs)] for refs in references]

    def __call__(self, image_ids: list[str], captions: list[list[str]], references: list[list[str]]) -> torch.Tensor:
        """`[B, k]` CIDEr-D values."""
        k = len(captions[0]) if captions else 0
        refs = self._references(references, image_ids)
        candidates = self.tokenizer([caption for row in captions for caption in row])
        values = self.scorer(candidates, [r for r in refs for _ in range(k)])
        return torch.from_numpy(np.asarray(values, dtype=np.float32)).reshape(len(image_ids), k)


def training_corpus(train_references: Mapping[str, Sequence[str]] | Iterable[Sequence[str]]) -> list[list[str]]:
    """The reference sets of the training corpus (one document per image), as lists of raw strings."""
    return [refs for block in _reference_blocks(train_references, 1 << 62) for refs in block]


#: training images whose references are tokenized per tokenizer call while the table is built (the strings of
#: one block are held at a time; the Java tokenizer starts a process per call, so its blocks are larger)
BLOCK_IMAGES = {"fast": 4096, "ptb": 100_000}


def _reference_blocks(train_references: Mapping[str, Sequence[str]] | Iterable[Sequence[str]],
                      block_images: int) -> Iterator[list[list[str]]]:
    """The training reference sets (raw strings, one list per image), `block_images` images at a time."""
    sets = train_references.values() if isinstance(train_references, Mapping) else train_references
    block: list[list[str]] = []
    for index, refs in enumerate(sets):
        if isinstance(refs, str) or not refs:
            raise InputError(f"cider reward: train_references[{index}] must be a non-empty list of captions")
        block.append(list(refs))
        if len(block) == block_images:
            yield block
            block = []
    if block:
        yield block


def tokenized_blocks(train_references: Mapping[str, Sequence[str]] | Iterable[Sequence[str]],
                     tokenizer: CaptionTokenizer, block_images: int = BLOCK_IMAGES["fast"]
                     ) -> Iterator[list[list[str]]]:
    """The training reference sets tokenized by `tokenizer`, one call per block of `block_images` images."""
    for block in _reference_blocks(train_references, block_images):
        flat = tokenizer([ref for refs in block for ref in refs])
        tokenized, start = [], 0
        for refs in block:
            tokenized.append(flat[start:start + len(refs)])
            start += len(refs)
        yield tokenized


@register_reward("cider")
def cider_reward(train_references: Mapping[str, Sequence[str]] | Iterable[Sequence[str]] | None = None,
                 document_frequency: DocumentFrequency | str | None = None, cider_tokenizer: str = "fast",
                 cider_df_cache: str | None = None, **_: Any) -> CiderDReward:
    """CIDEr-D reward; context: `train_references` (or a saved `document_frequency`), `cider_tokenizer`."""
    if cider_tokenizer not in TOKENIZERS:
        raise InputError(f"cider_tokenizer={cider_tokenizer!r}: choose one of {', '.join(TOKENIZERS)}")
    tokenizer = TOKENIZERS[cider_tokenizer]
    if document_frequency is None:
        if train_references is None:
            raise InputError("the cider reward needs the training references (context train_references=...) "
                             "or a saved document_frequency file for its document frequencies")
        blocks = tokenized_blocks(train_references, tokenizer, BLOCK_IMAGES.get(cider_tokenizer, 4096))
        document_frequency = cider_df_blocks(blocks, cache_path=cider_df_cache, what="train_references")
        logger.info("cider reward: document frequencies over %d training images",
                    int(document_frequency.num_documents))
    elif isinstance(document_frequency, str):
        document_frequency = DocumentFrequency.load(document_frequency)
    return CiderDReward(document_frequency, tokenizer)
