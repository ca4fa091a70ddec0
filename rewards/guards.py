"""Guard rewards against reward hacking: `rep-penalty` (repeated n-grams) and `length-penalty` (over-long captions).

Both are ordinary registry rewards, so they mix with any other one (`"clip-s:1,rep-penalty:0.5"`) in SCST, in
`pacs.rewards.trl.reward_function` and in any loop following the reward protocol. Their values are <= 0 (a penalty):
a positive weight in a mix subtracts them. Words are `pacs.eval.fluency.words` (lower-cased, punctuation dropped),
the tokenisation of Rep-n and %Incorrect.

- `rep-penalty`: `−Rep-n(caption)` = −Σ over the caption's distinct n-grams of (count − 1), the per-caption
  Rep-n of PAC-S++ §5.8 (`pacs.eval.fluency.repetitions`); `n` is the context key `rep_n` (default 2: repeated word
  pairs, the signature of CLIP-S / PAC-S++ hacking such as "a dog dog dog area area area").
- `length-penalty`: `−max(0, words(caption) − limit)`, the number of words beyond `limit`. The context key
  `length_limit` chooses the limit: `"refs"` (default) the longest reference caption of that image (so a caption
  as long as some human one is free), `"train"` the `length_percentile` (default 95) percentile of the word
  counts of every training reference (context `train_references`), or an int (a fixed number of words).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from pacs.eval.fluency import repetitions, words
from pacs.metric.common.errors import InputError
from pacs.rewards.registry import register_reward

LENGTH_LIMITS = ("refs", "train")


class RepetitionPenalty:
    """`−Rep-n` of each caption: minus the number of its n-gram occurrences beyond the first."""

    def __init__(self, n: int = 2) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise InputError(f"rep-penalty: rep_n={n!r}: expected an int >= 1")
        self.n = n

    def __call__(self, image_ids: list[str], captions: list[list[str]], references: list[list[str]]) -> torch.Tensor:
        """`[B, k]` values `−repetitions(caption, n)`."""
        return torch.tensor([[float(-repetitions(caption, self.n)) for caption in row] for row in captions],
                            dtype=torch.float32).reshape(len(captions), len(captions[0]) if captions else 0)


class LengthPenalty:
    """`−max(0, words − limit)` of each caption, the limit per image (`"refs"`) or fixed (a number)."""

    def __init__(self, limit: float | None) -> None:
        self.limit = limit  # None: the image's longest reference

    def _limit(self, image_id: str, refs: Sequence[str]) -> float:
        if self.limit is not None:
            return self.limit
        if not refs:
            raise InputError(f"length-penalty: image {image_id!r} has no reference captions (length_limit='refs' "
                             "uses its longest one); pass references, or length_limit='train' or a number")
        return float(max(len(words(ref)) for ref in refs))

    def __call__(self, image_ids: list[str], captions: list[list[str]], references: list[list[str]]) -> torch.Tensor:
        """`[B, k]` values `−max(0, len(words(caption)) − limit)`."""
        rows = []
        for image_id, row, refs in zip(image_ids, captions, references):
            limit = self._limit(image_id, refs)
            rows.append([min(0.0, limit - len(words(caption))) for caption in row])
        return torch.tensor(rows, dtype=torch.float32).reshape(len(captions), len(captions[0]) if captions else 0)


def reference_length_percentile(train_references: Mapping[str, Sequence[str]] | Iterable[Sequence[str]],
                                percentile: float) -> float:
    """The `percentile` (numpy's linear interpolation) of the word counts of every training reference."""
    sets = train_references.values() if isinstance(train_references, Mapping) else train_references
    lengths = []
    for index, refs in enumerate(sets):
        if isinstance(refs, str):
            raise InputError(f"length-penalty: train_references[{index}] must be a list of captions, not a string")
        lengths.extend(len(words(ref)) for ref in refs)
    if not lengths:
        raise InputError("length-penalty: length_limit='train' needs train_references with at least one caption")
    return float(np.percentile(np.asarray(lengths, dtype=float), percentile))


def length_limit_from_context(length_limit: Any = "refs", length_percentile: float = 95.0,
                              train_references: Any = None) -> float | None:
    """The fixed limit in words that `length_limit` names (None: each image's longest reference)."""
    if isinstance(length_limit, bool):
        raise InputError(f"length-penalty: length_limit={length_limit!r}: expected 'refs', 'train' or a number")
    if isinstance(length_limit, str) and length_limit.strip().isdigit():
        length_limit = int(length_limit)
    if isinstance(length_limit, (int, float)):
        if not np.isfinite(length_limit) or length_limit < 1:
            raise InputError(f"length-penalty: length_limit={length_limit!r}: expected a number of words >= 1")
        return float(length_limit)
    if length_limit not in LENGTH_LIMITS:
        raise InputError(f"length-penalty: length_limit={length_limit!r}: expected 'refs', 'train' or a number")
    if length_limit == "refs":
        return None
    if isinstance(length_percentile, bool) or not isinstance(length_percentile, (int, float)) \
            or not 0 < length_percentile <= 100:
        raise InputError(f"length-penalty: length_percentile={length_percentile!r}: expected a number in (0, 100]")
    if train_references is None:
        raise InputError("length-penalty: length_limit='train' needs the training references "
                         "(context train_references=...)")
    return reference_length_percentile(train_references, float(length_percentile))


@register_reward("rep-penalty")
def rep_penalty_reward(rep_n: int = 2, **_: Any) -> RepetitionPenalty:
    """`−Rep-n` of each caption; context: `rep_n` (default 2)."""
    return RepetitionPenalty(rep_n)


@register_reward("length-penalty")
def length_penalty_reward(length_limit: Any = "refs", length_percentile: float = 95.0,
                          train_references: Any = None, **_: Any) -> LengthPenalty:
    """Words beyond the limit, negated; context: `length_limit` ('refs', 'train' or a number), `length_percentile`."""
    return LengthPenalty(length_limit_from_context(length_limit, length_percentile, train_references))
