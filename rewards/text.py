"""Caption text normalisation for CIDEr rewards: PTB tokens, lower-cased, punctuation removed.

The default tokenizer (`cider_tokenizer="fast"`) is `pacs.eval.ptb`'s pure-Python PTB tokenizer, equal to what
pycocoevalcap's `PTBTokenizer` (Stanford PTBTokenizer 3.4.1 with `-preserveLines -lowerCase`, then removal of the
punctuation tokens) makes of every caption of the shared data sets, without a Java process on every SCST step;
`"ptb"` runs the Java tokenizer itself. Candidates and references always go through the same function.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from pacs.eval.ptb import PTB_PUNCTUATIONS, python_ptb_tokenize
from pacs.eval.tokenize import java_ptb_tokenize

__all__ = ["PTB_PUNCTUATIONS", "TOKENIZERS", "CaptionTokenizer", "fast_tokenizer", "java_ptb_tokenizer",
           "ptb_tokenize_fast"]


def ptb_tokenize_fast(caption: str) -> str:
    """Lower-cased PTB tokens of one caption without punctuation, space-joined (pycocoevalcap's output)."""
    return python_ptb_tokenize([caption])[0]


CaptionTokenizer = Callable[[Sequence[str]], list[str]]


def fast_tokenizer(captions: Sequence[str]) -> list[str]:
    """Tokenize a batch with the Python PTB tokenizer (`pacs.eval.ptb`, no subprocess)."""
    return python_ptb_tokenize(list(captions))


def java_ptb_tokenizer(captions: Sequence[str]) -> list[str]:
    """Tokenize a batch with pycocoevalcap's Java PTB tokenizer (one Java process per call)."""
    return java_ptb_tokenize(list(captions))


TOKENIZERS: dict[str, CaptionTokenizer] = {"fast": fast_tokenizer, "ptb": java_ptb_tokenizer}
