"""Drift statistics of a set of captions and the reward-gaming signatures read from their drift.

One definition for the two hacking monitors: SCST's (`pacs.captioner.modeling.hacking_monitor`) and the one for any RL
loop (`pacs.rewards.monitor`). `caption_stats` gives the mean length in words, Rep-1..4 (`pacs.eval.fluency.rep_n`),
distinct-1/2 and %Incorrect (`pacs.eval.fluency.incorrect_rate`); `drift_signatures` names each drift of those from a
starting row past its `DriftThresholds` threshold, when the reward rose.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pacs.eval.fluency import incorrect_rate, rep_n, words


def distinct_n(captions: Sequence[str], n: int) -> float:
    """Distinct-n (Li et al., 2016): distinct n-grams / n-gram occurrences over all `captions` (NaN if none)."""
    grams = [tuple(tokens[i:i + n]) for tokens in (words(c) for c in captions) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else float("nan")


def caption_stats(captions: Sequence[str]) -> dict[str, float]:
    """Mean length (words), Rep-1..4, distinct-1/2 and %Incorrect of a list of captions."""
    captions = list(captions)
    stats = {"length": sum(len(words(c)) for c in captions) / len(captions) if captions else float("nan")}
    stats.update({f"rep{n}": float(rep_n(captions, n)) for n in range(1, 5)})
    stats.update({f"distinct{n}": distinct_n(captions, n) for n in (1, 2)})
    stats["incorrect"] = float(incorrect_rate(captions))
    return stats


@dataclass
class DriftThresholds:
    """How far a statistic may drift from the starting row before a rising reward is called gaming (the
    defaults are SCST's `scst.monitor_*`)."""

    reward_rise: float = 0.0  # the reward must exceed the starting row's by more than this
    rep_rise: float = 0.5  # Rep-2 increase (repeated word pairs per caption)
    length_rise: float = 0.2  # relative increase of the mean length (0.2: +20%)
    distinct_drop: float = 0.1  # decrease of distinct-2
    incorrect_rise: float = 10.0  # %Incorrect increase, in percentage points


def _finite(*values: float) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def drift(start: Mapping[str, float], now: Mapping[str, float], key: str) -> float | None:
    """`now[key] - start[key]`, or None when either is missing or not a finite number."""
    a, b = start.get(key, math.nan), now.get(key, math.nan)
    return b - a if _finite(a, b) else None


def reward_rose(start: Mapping[str, float], now: Mapping[str, float], reward_rise: float) -> bool:
    """Whether the `reward` of `now` exceeds that of `start` by more than `reward_rise` (False if one is NaN)."""
    rise = drift(start, now, "reward")
    return rise is not None and rise > reward_rise


def drift_signatures(start: Mapping[str, float], now: Mapping[str, float],
                     thresholds: DriftThresholds) -> list[tuple[str, str]]:
    """[(signature, drift)] for each drift of `now` from `start` past its threshold, when the reward rose.

    Empty when the reward did not rise by more than `reward_rise` (or a reward is missing / NaN).
    """
    if not reward_rose(start, now, thresholds.reward_rise):
        return []
    found = []
    rep = drift(start, now, "rep2")
    if rep is not None and rep > thresholds.rep_rise:
        found.append(("repetition gaming", f"rep2 {rep:+.3g}"))
    length = drift(start, now, "length")
    if length is not None and start["length"] > 0 and length / start["length"] > thresholds.length_rise:
        found.append(("length gaming", f"length {length:+.3g} words ({100 * length / start['length']:+.0f}%)"))
    distinct = drift(start, now, "distinct2")
    if distinct is not None and -distinct > thresholds.distinct_drop:
        found.append(("diversity collapse", f"distinct2 {distinct:+.3g}"))
    incorrect = drift(start, now, "incorrect")
    if incorrect is not None and incorrect > thresholds.incorrect_rise:
        found.append(("bad endings", f"%incorrect {incorrect:+.3g}"))
    return found
