"""Correlation statistics and the grammar-error rate on hand-checked captions."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from pacs.eval import correlation, intervals
from pacs.eval.grammar import build_grammar_checker, grammar_error_rate
from pacs.metric.common.errors import InputError, MissingResourceError


def test_kendall_is_scipy_times_100():
    x, y = [1, 2, 3, 4, 5], [1, 3, 2, 4, 4]
    assert correlation.kendall(x, y, "b") == pytest.approx(100 * stats.kendalltau(x, y, variant="b").statistic)
    assert correlation.kendall(x, y, "c") == pytest.approx(100 * stats.kendalltau(x, y, variant="c").statistic)


def test_pairwise_accuracy_ties_count_half():
    # pair 1 correct, pair 2 wrong, pair 3 metric tie, pair 4 correct (B preferred and B higher)
    assert correlation.pairwise_accuracy([2, 1, 3, 0], [1, 2, 3, 1], [True, True, True, False]) == pytest.approx(62.5)


def test_auroc_hand_checked():
    assert correlation.auroc([0.9, 0.8, 0.1, 0.2], [True, True, False, False]) == 1.0
    assert correlation.auroc([0.5, 0.5], [True, False]) == 0.5  # a tie counts half
    assert correlation.auroc([0.1, 0.9, 0.4], [True, False, False]) == 0.0
    assert np.isnan(correlation.auroc([1.0], [True]))


def test_bootstrap_interval_and_p_value():
    rng = np.random.default_rng(0)
    human = rng.normal(size=300)
    good, bad = human + rng.normal(scale=0.3, size=300), human + rng.normal(scale=3, size=300)
    samples = intervals.bootstrap(lambda i: {"good": correlation.kendall(good[i], human[i]),
                                             "bad": correlation.kendall(bad[i], human[i])}, 300, 200, seed=1)
    low, high = intervals.confidence_interval(samples["good"])
    assert low < correlation.kendall(good, human) < high
    assert intervals.paired_p_value(samples["good"], samples["bad"]) < 0.01


def test_grammar_error_rate_harper_hand_checked():
    captions = ["a man riding a elephant",  # a/an error
                "the the dog runs on the grass",  # repeated word
                "a black dog running through the grass",  # fine (no capital, no period: rules disabled)
                "two children playing in a park"]
    result = grammar_error_rate(captions)
    assert result.backend.startswith("harper")
    assert [bool(e) for e in result.errors] == [True, True, False, False]
    assert result.rate == pytest.approx(50.0)


def test_grammar_backends_errors(monkeypatch):
    with pytest.raises(InputError, match="unknown grammar backend 'nope'"):
        build_grammar_checker("nope")
    monkeypatch.delenv("PACS_LANGUAGETOOL_DIR", raising=False)
    monkeypatch.delenv("PACS_LANGUAGETOOL_URL", raising=False)
    with pytest.raises(MissingResourceError, match="local LanguageTool folder"):
        build_grammar_checker("languagetool")
