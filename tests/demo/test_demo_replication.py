"""How reproducible the demo's findings are: the predictive probability that an independent replication reaches the
same verdict, against hand computations with the normal CDF written out (math.erf, not scipy)."""
from __future__ import annotations

import math

import pytest

from pacs.captioner.orchestration.findings import (
    CLAIM_REWARD_RISES,
    FRAGILE,
    SEED_DEPENDENT,
    finding_records,
    gamed_claim,
    render_finding,
    replication_probabilities,
    replication_summary,
    seed_inflation,
)

Z95 = 1.959963984540054  # the 97.5th percentile of the standard normal


def phi(x: float) -> float:
    """The standard normal CDF."""
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def test_replication_probabilities_equal_the_hand_computation() -> None:
    # point 2 with a symmetric 95% interval of se 1: a replication's estimate ~ N(2, 2), judged against ±1.96 se
    ways = replication_probabilities(2.0, [2.0 - Z95, 2.0 + Z95])
    assert ways[1] == pytest.approx(phi((2.0 - Z95) / math.sqrt(2)), abs=1e-12)  # 0.511: a coin flip
    assert ways[-1] == pytest.approx(phi((-2.0 - Z95) / math.sqrt(2)), abs=1e-12)
    assert sum(ways.values()) == pytest.approx(1.0)
    # an asymmetric percentile interval: se is read from the side facing 0 (point 3, lower bound 1: se 2 / 1.96)
    asymmetric = replication_probabilities(3.0, [1.0, 3.5])
    z = 3.0 / (2.0 / Z95)
    assert asymmetric[1] == pytest.approx(phi((z - Z95) / math.sqrt(2)), abs=1e-12)
    # a negative point reads the upper side
    below = replication_probabilities(-1.0, [-9.0, 0.5])
    assert below[-1] == pytest.approx(phi((1.0 / (1.5 / Z95) - Z95) / math.sqrt(2)), abs=1e-12)
    # a design 4 times as large (scale 2), the true difference taken as the point: N(2, 0.25) against ±1.96 · 0.5
    larger = replication_probabilities(2.0, [2.0 - Z95, 2.0 + Z95], scale=2.0)
    assert larger[1] == pytest.approx(phi(4.0 - Z95), abs=1e-12)
    # a degenerate interval (identical captions: se 0) repeats its direction with certainty
    assert replication_probabilities(0.0, [0.0, 0.0]) == {1: 0.0, -1: 0.0, 0: 1.0}
    assert replication_probabilities(0.5, [0.5, 0.5]) == {1: 1.0, -1: 0.0, 0: 0.0}


def _view(reward_ci: list[float], rep2_ci: list[float]) -> dict:
    row = {"delta": {"Judge-acc": -5.0, "Rep-2": 0.2}, "ci": {"Judge-acc": [-9.0, -1.0], "Rep-2": rep2_ci},
           "delta_per_seed": {"Judge-acc": [-5.0], "Rep-2": [0.2]}, "value": {}}
    return {"rows": {"xe": {"value": {}}, "scst cider": row},
            "gains": [{"reward": "cider", "model": "scst cider", "delta": 0.3, "ci": reward_ci, "per_seed": [0.3]}],
            "share_of_oracle": {}, "oracle": None, "human": None}


def _up(point: float, low: float) -> float:
    return phi((point / ((point - low) / Z95) - Z95) / math.sqrt(2))


def test_a_claim_replicates_with_the_product_of_its_differences() -> None:
    view = _view([0.1, 0.5], [0.1, 0.3])
    records = {r["claim"]: r for r in finding_records(view, {"0": view})}
    reward_up = _up(0.3, 0.1)
    judge_up = phi((-5.0 / (4.0 / Z95) - Z95) / math.sqrt(2))  # the judge rising in a replication: ~0
    rep2_up = _up(0.2, 0.1)
    assert records[CLAIM_REWARD_RISES]["replication"]["agrees"] == pytest.approx(reward_up, abs=1e-12)
    falls = records["judge accuracy falls beyond noise"]["replication"]["agrees"]
    assert falls == pytest.approx(phi((5.0 / (4.0 / Z95) - Z95) / math.sqrt(2)), abs=1e-12)
    # gamed: the reward up, the judge not up, Rep-2 up, taken as independent
    gamed = records[gamed_claim("Rep-2")]["replication"]["agrees"]
    assert gamed == pytest.approx(reward_up * (1.0 - judge_up) * rep2_up, abs=1e-12)
    # a claim that does not hold: a replication agrees when it does not find it either
    rejected = _view([-0.1, 0.5], [0.1, 0.3])
    record = next(r for r in finding_records(rejected, {"0": rejected}) if r["claim"] == CLAIM_REWARD_RISES)
    assert record["holds"] is False
    assert record["replication"]["agrees"] == pytest.approx(1.0 - phi((0.3 / (0.4 / Z95) - Z95) / math.sqrt(2)))
    # projected: two replications of a design with n seeds agree with q² + (1 − q)², q their chance of the claim
    projected = records[CLAIM_REWARD_RISES]["replication"]["two_replications_with_seeds"]
    q = phi(0.3 / (0.2 / Z95) * math.sqrt(4) - Z95)  # 4 seeds where the run had 1: se halved
    assert projected["4"] == pytest.approx(q ** 2 + (1 - q) ** 2, abs=1e-12)


def test_three_seeds_widen_the_replication_estimate_by_the_bootstraps_bias() -> None:
    # resampling 3 seeds, the bootstrap's variance of their mean is 2/3 of the unbiased one: se times √(3/2)
    assert seed_inflation(3) == pytest.approx(math.sqrt(1.5)) and seed_inflation(1) == 1.0
    view = _view([0.1, 0.5], [0.1, 0.3])
    record = next(r for r in finding_records(view, {"0": view, "1": view, "2": view}) if r["claim"] == CLAIM_REWARD_RISES)
    z = 0.3 / (0.2 / Z95 * math.sqrt(1.5))
    assert record["replication"]["agrees"] == pytest.approx(phi((z - Z95) / math.sqrt(2)), abs=1e-12)
    # projected to 6 seeds: se / √2, the same inflation; two replications agree with q² + (1 − q)²
    q = phi(z * math.sqrt(2) - Z95)
    assert record["replication"]["two_replications_with_seeds"]["6"] == pytest.approx(q ** 2 + (1 - q) ** 2)


def test_a_seed_dependent_claim_has_no_replication_and_fragile_claims_say_so() -> None:
    pooled = _view([0.1, 0.5], [0.1, 0.3])
    split = finding_records(pooled, {"0": _view([0.1, 0.5], [0.1, 0.3]), "1": _view([-0.5, -0.1], [0.1, 0.3])})
    rises = next(r for r in split if r["claim"] == CLAIM_REWARD_RISES)
    assert rises["holds"] == SEED_DEPENDENT and "replication" not in rises
    records = finding_records(pooled, {"0": pooled})
    for record in records:
        agrees = record["replication"]["agrees"]
        assert ("fragile: an independent replication agrees with probability" in render_finding(record)) == \
            (agrees < FRAGILE), record["text"]
    assert any(r["replication"]["agrees"] < FRAGILE for r in records)  # the gamed claim (0.76 · ~1 · 0.92)


def test_the_summary_counts_the_expected_disagreements() -> None:
    records = [{"subject": "a", "claim": "x", "holds": True,
                "replication": {"agrees": 0.9, "two_replications_with_seeds": {"3": 0.8, "6": 0.9}}},
               {"subject": "b", "claim": "y", "holds": False,
                "replication": {"agrees": 0.5, "two_replications_with_seeds": {"3": 0.5, "6": 0.7}}},
               {"subject": "c", "claim": "z", "holds": SEED_DEPENDENT}]
    summary = replication_summary(records)
    assert summary["expected_disagreements"] == pytest.approx(0.1 + 0.5)
    assert summary["all_agree"] == pytest.approx(0.45)
    assert summary["two_replications_with_seeds"]["6"] == {"expected_disagreements": pytest.approx(0.4),
                                                           "all_agree": pytest.approx(0.63)}
    assert summary["fragile"] == ["b: y"] and summary["seed_dependent"] == 1 and summary["claims"] == 3
