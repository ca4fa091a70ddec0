"""The OpenAI CLIP tokenizer rules on top of open_clip's BPE: OpenAI special-token spelling, truncation, trimming.

open_clip's `SimpleTokenizer` is the same byte-level BPE as OpenAI's CLIP tokenizer, but it spells its special
tokens `<start_of_text>` / `<end_of_text>`. OpenAI (and therefore the official PAC-S code) spells them
`<|startoftext|>` / `<|endoftext|>`, so a caption containing the literal text `<|endoftext|>` becomes the EOT id
49407 there, and `<end_of_text>` is ordinary text. `ClipTokenizer` restores the OpenAI spelling.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import regex
import torch
from open_clip.tokenizer import SimpleTokenizer

OPENAI_SOT = "<|startoftext|>"
OPENAI_EOT = "<|endoftext|>"
SOT_ID = 49406
EOT_ID = 49407
DEFAULT_CONTEXT_LENGTH = 77
ENCODED_CACHE_SIZE = 1 << 17
"""Texts whose ids a `ClipTokenizer` keeps (emptied when full): ~10 MB of short captions."""

# OpenAI CLIP's pre-tokenisation pattern (simple_tokenizer.py), with its special-token spelling.
_OPENAI_PATTERN = (
    r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
)


@dataclass
class TokenizedBatch:
    """Token ids of a batch of texts: one list per text (SOT ... EOT, truncated), and how many were truncated."""

    ids: list[list[int]]
    n_truncated: int
    truncated: list[bool]

    def lengths(self) -> list[int]:
        """Return the number of ids of every text."""
        return [len(ids) for ids in self.ids]


class ClipTokenizer:
    """OpenAI CLIP tokenization (ftfy, double html-unescape, whitespace collapse, lower case, BPE)."""

    def __init__(self, context_length: int = DEFAULT_CONTEXT_LENGTH) -> None:
        bpe = SimpleTokenizer(context_length=context_length)
        for open_clip_name, openai_name in (("<start_of_text>", OPENAI_SOT), ("<end_of_text>", OPENAI_EOT)):
            token_id = bpe.encoder.pop(open_clip_name)
            bpe.encoder[openai_name] = token_id
            bpe.decoder[token_id] = openai_name
        bpe.cache = {OPENAI_SOT: OPENAI_SOT, OPENAI_EOT: OPENAI_EOT}
        bpe.pat = regex.compile(_OPENAI_PATTERN, regex.IGNORECASE)
        self._bpe = bpe
        # ftfy, html unescaping and the pre-tokenisation regex run per text and dominate on short captions; a
        # scorer sees the same texts again and again (references per system row, SCST's k samples, monitors)
        self._encoded: dict[str, tuple[int, ...]] = {}
        self.context_length = context_length
        self.sot_id = bpe.encoder[OPENAI_SOT]
        self.eot_id = bpe.encoder[OPENAI_EOT]
        if (self.sot_id, self.eot_id) != (SOT_ID, EOT_ID):  # pragma: no cover - guards a changed vocabulary
            raise RuntimeError(f"unexpected special token ids {self.sot_id}, {self.eot_id}")

    def encode_text(self, text: str) -> list[int]:
        """Return the BPE ids of one text, without SOT/EOT and without truncation."""
        ids = self._encoded.get(text)
        if ids is None:
            if len(self._encoded) >= ENCODED_CACHE_SIZE:
                self._encoded.clear()
            ids = self._encoded[text] = tuple(self._bpe.encode(text))
        return list(ids)

    def encode(self, texts: Sequence[str]) -> TokenizedBatch:
        """Tokenize texts as SOT + BPE + EOT; longer than the context: keep the first ids, last one set to EOT."""
        all_ids: list[list[int]] = []
        truncated: list[bool] = []
        for text in texts:
            ids = [self.sot_id] + self.encode_text(text) + [self.eot_id]
            cut = len(ids) > self.context_length
            if cut:
                ids = ids[: self.context_length]
                ids[-1] = self.eot_id
            all_ids.append(ids)
            truncated.append(cut)
        return TokenizedBatch(ids=all_ids, n_truncated=sum(truncated), truncated=truncated)

    def pad(self, ids: Sequence[Sequence[int]], length: int | None = None) -> torch.LongTensor:
        """Stack id lists into a LongTensor padded with 0 to `length` (default: the context length)."""
        length = self.context_length if length is None else length
        result = torch.zeros(len(ids), length, dtype=torch.long)
        for row, sequence in enumerate(ids):
            if len(sequence) > length:
                raise ValueError(f"sequence of {len(sequence)} ids does not fit in length {length}")
            result[row, : len(sequence)] = torch.tensor(list(sequence), dtype=torch.long)
        return result

    def __call__(self, texts: str | Sequence[str], context_length: int | None = None) -> torch.LongTensor:
        """Return `LongTensor[N, context_length]` of ids, padded with 0 (the official `clip.tokenize` output)."""
        if isinstance(texts, str):
            texts = [texts]
        return self.pad(self.encode(texts).ids, context_length)

    def decode(self, ids: Sequence[int]) -> str:
        """Turn ids back into text (for debugging)."""
        return self._bpe.decode(list(ids))
