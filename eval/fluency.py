"""Fluency measures of PAC-S++ §5.8: Rep-n (repeated n-grams) and %Incorrect (bad last word).

Captions are lower-cased and split into words (letters, digits, apostrophes; punctuation is dropped), so
"On the side of a." ends with "a". The closed-class word lists below decide %Incorrect; the paper names no
list or tagger, so these fixed lists are the definition pacs uses (documented in docs/eval.md).
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from pacs.metric.common.errors import InputError

_WORD = re.compile(r"[\w']+")

#: English prepositions that cannot close a caption. Words that also work as adverb particles at the end of a
#: well-formed caption ("jumping up", "standing outside", "looking down", "walking by") are left out.
PREPOSITIONS = frozenset(["against", "amid", "amidst", "among", "amongst", "as", "at", "atop", "beside", "between", "despite", "during", "except", "for", "from", "in", "into", "like", "near", "of", "on", "onto", "per", "than", "to", "toward", "towards", "under", "upon", "via", "with", "within", "without"])

#: Coordinating and subordinating conjunctions.
CONJUNCTIONS = frozenset(["and", "but", "or", "nor", "yet", "because", "although", "though", "while", "whereas", "if", "unless", "whether", "that"])

#: Articles, demonstratives, possessive and distributive determiners (quantifiers that double as pronouns,
#: such as "all" or "many", are left out).
DETERMINERS = frozenset(["a", "an", "the", "this", "that", "these", "those", "my", "your", "his", "her", "its", "our", "their", "every", "either", "neither", "another", "no"])

#: Every word that makes a caption "end incorrectly".
INCORRECT_END_WORDS = PREPOSITIONS | CONJUNCTIONS | DETERMINERS


def words(caption: str) -> list[str]:
    """Lower-cased words of a caption, punctuation removed."""
    return _WORD.findall(caption.lower())


def _check(captions: Sequence[str]) -> None:
    """Raise InputError for a bare string or a non-string caption (named by index)."""
    if isinstance(captions, str):
        raise InputError("captions must be a list of strings, not a single string")
    for index, caption in enumerate(captions):
        if not isinstance(caption, str):
            raise InputError(f"caption {index} is {type(caption).__name__}, expected a string")


def repetitions(caption: str, n: int) -> int:
    """Number of n-gram occurrences beyond the first in one caption (Σ over distinct n-grams of count − 1)."""
    if n < 1:
        raise InputError(f"n must be >= 1, got {n}")
    tokens = words(caption)
    grams = Counter(zip(*(tokens[i:] for i in range(n))))
    return sum(count - 1 for count in grams.values())


def rep_n(captions: Sequence[str], n: int) -> float:
    """Rep-n: mean over captions of `repetitions(caption, n)` (NaN for no captions)."""
    _check(captions)
    if not captions:
        return float("nan")
    return sum(repetitions(caption, n) for caption in captions) / len(captions)


def ends_incorrectly(caption: str) -> bool:
    """True when the caption's last word is a preposition, conjunction or determiner."""
    tokens = words(caption)
    return bool(tokens) and tokens[-1] in INCORRECT_END_WORDS


def incorrect_rate(captions: Sequence[str]) -> float:
    """%Incorrect: percentage of captions whose last word is a preposition, conjunction or determiner."""
    _check(captions)
    if not captions:
        return float("nan")
    return 100.0 * sum(ends_incorrectly(caption) for caption in captions) / len(captions)
