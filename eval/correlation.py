"""Correlation statistics: Kendall τb/τc (scipy), pairwise accuracy (ties = half), AUROC (their bootstrap
intervals and paired p-values: `pacs.eval.intervals`)."""
from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

log = logging.getLogger(__name__)


def kendall(scores: Sequence[float], human: Sequence[float], variant: str = "b") -> float:
    """100 × Kendall τ (`variant` 'b' or 'c') between metric scores and human ratings, as in the papers."""
    from scipy import stats  # imported on use: scipy.stats takes seconds to import

    return float(100.0 * stats.kendalltau(np.asarray(scores), np.asarray(human), variant=variant).statistic)


def pairwise_accuracy(score_a: Sequence[float], score_b: Sequence[float], a_preferred: Sequence[bool]) -> float:
    """100 × share of pairs where the metric prefers the caption humans prefer; a metric tie counts half."""
    a, b = np.asarray(score_a, dtype=np.float64), np.asarray(score_b, dtype=np.float64)
    pick_a = np.asarray(a_preferred, dtype=bool)
    if len(a) == 0:
        return float("nan")
    success = np.where(a == b, 0.5, np.where(pick_a, a > b, b > a).astype(np.float64))
    return float(100.0 * success.mean())


def auroc(scores: Sequence[float], positive: Sequence[bool]) -> float:
    """Area under the ROC curve of `scores` for the `positive` class (ties count half); NaN if one class is empty."""
    from scipy import stats

    s = np.asarray(scores, dtype=np.float64)
    pos = np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = stats.rankdata(s)  # average ranks handle ties as half
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
