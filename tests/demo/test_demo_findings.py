"""The demo's findings: the stratified bootstrap over seeds and images against hand computations, and the records
generated from hand-made views by fixed rules (printed lines equal to the records, seed-dependent claims)."""
from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from pacs.captioner.orchestration.findings import (
    CLAIM_FLAT_REWARD,
    CLAIM_GUARD,
    CLAIM_INERT,
    CLAIM_REWARD_RISES,
    HUMAN_SUBJECT,
    SEED_DEPENDENT,
    direction,
    finding_records,
    gamed_claim,
    reward_values,
    signed,
)
from pacs.captioner.orchestration.seed_evidence import SeedEvidence
from pacs.eval.intervals import StratifiedBootstrap, aggregate
from pacs.metric.common.errors import InputError

# a tiny table: 2 seeds x 3 images of one column, for a model and the XE baseline
MODEL = np.array([[3.0, 5.0, 10.0], [1.0, 2.0, 4.0]])
XE = np.array([[1.0, 1.0, 1.0], [2.0, 0.0, 1.0]])


def test_demo_reward_values_of_a_mix_are_the_weighted_sum_of_its_terms() -> None:
    values = {"C": np.array([200.0, 100.0]), "PAC-S++": np.array([2.0, 1.0]), "CLIP-S": np.array([1.5, 0.5]),
              "Judge": np.array([100.0, 50.0])}
    assert reward_values("cider:1,pac-s++:0.5", values).tolist() == [2.0 + 1.0, 1.0 + 0.5]  # C/100 + 0.5 PAC-S++
    assert reward_values("clip-s", values).tolist() == [1.5, 0.5]
    assert reward_values("judge", values).tolist() == [1.0, 0.5]  # the oracle: the judge's score, Judge / 100
    with pytest.raises(InputError, match="bleu"):
        reward_values("bleu", values)


def test_stratified_bootstrap_equals_the_hand_computation_with_the_same_resample_indices() -> None:
    boot = StratifiedBootstrap(2, 3, 50, seed=7)
    estimate = boot.mean_difference(MODEL, XE)
    # by hand: per-seed differences of the means (6 - 1 = 5, 7/3 - 1 = 4/3), their mean over the two seeds
    assert estimate.per_seed == pytest.approx([5.0, 4.0 / 3.0])
    assert estimate.point == pytest.approx((5.0 + 4.0 / 3.0) / 2)
    # the documented draws, one resample at a time: 2 seeds, then 3 images for each drawn seed
    rng = np.random.default_rng(7)
    statistics = []
    for _ in range(50):
        drawn_seeds = rng.integers(0, 2, size=2)
        drawn_images = rng.integers(0, 3, size=(2, 3))
        slots = []
        for seed, images in zip(drawn_seeds, drawn_images):
            model = sum(MODEL[seed][i] for i in images) / 3
            xe = sum(XE[seed][i] for i in images) / 3  # paired: the same images of the same seed
            slots.append(model - xe)
        statistics.append(sum(slots) / 2)
    statistics.sort()
    # numpy's default percentile: linear interpolation between the order statistics at (n - 1) q
    def percentile(q: float) -> float:
        position = (len(statistics) - 1) * q
        low = int(position)
        return statistics[low] + (statistics[min(low + 1, len(statistics) - 1)] - statistics[low]) * (position - low)

    assert estimate.interval == pytest.approx([percentile(0.025), percentile(0.975)])


def test_stratified_bootstrap_draws_only_what_exhaustive_enumeration_allows() -> None:
    # a second, simple implementation: every possible resample of 2 seeds x 3 images (4 x 27 x 27 of them)
    possible = set()
    for seeds in itertools.product(range(2), repeat=2):
        for first in itertools.product(range(3), repeat=3):
            for second in itertools.product(range(3), repeat=3):
                slots = [np.mean([MODEL[s][i] - XE[s][i] for i in images]) for s, images in zip(seeds, (first, second))]
                possible.add(round(float(np.mean(slots)), 9))
    boot = StratifiedBootstrap(2, 3, 400, seed=1)
    samples = np.asarray(aggregate(boot.per_seed_means(MODEL) - boot.per_seed_means(XE), axis=1))
    assert {round(float(v), 9) for v in samples} <= possible
    low, high = boot.mean_difference(MODEL, XE).interval
    assert min(possible) <= low <= high <= max(possible)


def test_five_or_more_seeds_use_the_interquartile_mean() -> None:
    per_seed = np.array([[1.0], [2.0], [3.0], [4.0], [100.0]])  # one image per seed: its value is the seed's mean
    boot = StratifiedBootstrap(5, 1, 10, seed=0)
    assert boot.mean_difference(per_seed).point == pytest.approx((2.0 + 3.0 + 4.0) / 3)  # 25% cut at each end
    assert StratifiedBootstrap(4, 1, 10).mean_difference(per_seed[:4]).point == pytest.approx(2.5)  # the mean
    assert boot.describe()["point"] == "interquartile mean over seeds" and boot.describe()["seeds"] == 5


def test_the_oracle_share_of_the_seed_evidence() -> None:
    def rows(judge: list[list[float]]) -> list[dict[str, np.ndarray]]:
        return [{"Judge-acc": np.asarray(seed), "Judge": np.asarray(seed)} for seed in judge]

    per_image = {"xe": rows([[0.0, 0.0], [0.0, 50.0]]), "scst cider": rows([[100.0, 0.0], [0.0, 100.0]]),
                 "scst judge": rows([[100.0, 100.0], [100.0, 100.0]])}
    evidence = SeedEvidence(per_image, {name: [None, None] for name in per_image}, ["Judge-acc", "Judge"], 200, 0)
    share = evidence.share("scst cider", "scst judge")
    # by hand: cider +50 and +25 against XE, the oracle +100 and +75: 37.5 / 87.5 pooled, 50% and 33% per seed
    assert share.point == pytest.approx(37.5 / 87.5) and share.per_seed == pytest.approx([0.5, 25.0 / 75.0])
    view = evidence.view([("judge", "scst judge")], None)  # the oracle's gain is above 0 in every resample
    assert view["oracle"] == "scst judge" and view["share_of_oracle"]["scst cider"]["point"] == pytest.approx(3 / 7)
    # an oracle whose own gain is within noise gives no shares (seed 0 +100, seed 1 -50: the interval spans 0)
    per_image["scst judge"] = rows([[100.0, 100.0], [0.0, 0.0]])
    flat = SeedEvidence(per_image, {name: [None, None] for name in per_image}, ["Judge-acc", "Judge"], 200, 0)
    assert flat.view([("judge", "scst judge")], None)["share_of_oracle"] == {}


# --- the findings' rules on hand-made views -------------------------------------------------------------------

def _row(judge: tuple[float, list[float]], **others: tuple[float, list[float]]) -> dict:
    columns = {"Judge-acc": judge, **others}
    return {"delta": {c: v[0] for c, v in columns.items()}, "ci": {c: v[1] for c, v in columns.items()},
            "delta_per_seed": {c: [v[0], v[0]] for c, v in columns.items()}, "value": {}}


def _view(cider_judge: list[float], cider_gain: list[float], rep2: list[float] | None = None) -> dict:
    cider = _row((-5.0, cider_judge), **({"Rep-2": (0.2, rep2)} if rep2 else {}))
    return {"rows": {"xe": {"value": {}}, "scst cider": cider,
                     "scst clip-s +KL": _row((-1.0, [-3.0, 1.0]))},
            "gains": [{"reward": "cider", "model": "scst cider", "delta": 0.3, "ci": cider_gain, "per_seed": [0.3, 0.3]},
                      {"reward": "clip-s", "model": "scst clip-s +KL", "delta": 0.01, "ci": [0.002, 0.02],
                       "per_seed": [0.01, 0.01]}],
            "share_of_oracle": {}, "oracle": None, "human": None}


LINE = re.compile(r"^(?P<subject>.+?): (?P<claim>.+?)(?: — (?P<status>does not hold|seed-dependent): .*?| — "
                  r"(?P<status2>does not hold))? \((?P<column>\S+(?: \S+)*?) (?P<point>[+-][\d.]+)(?P<unit> pts)? "
                  r"\[(?P<low>[+-][\d.]+), (?P<high>[+-][\d.]+)\]")


def _parse(line: str) -> dict:
    """The printed line's parts, read back with a regular expression (not with the code that wrote it)."""
    match = LINE.match(line)
    assert match, line
    status = match["status"] or match["status2"]
    return {"subject": match["subject"], "claim": match["claim"],
            "holds": {None: True, "does not hold": False, SEED_DEPENDENT: SEED_DEPENDENT}[status],
            "column": match["column"], "point": float(match["point"]), "low": float(match["low"]),
            "high": float(match["high"])}


def test_findings_records_equal_the_printed_findings() -> None:
    from pacs.captioner.demo.pipeline import results_markdown

    pooled = _view([-9.0, -1.0], [0.1, 0.5], rep2=[0.1, 0.3])
    records = finding_records(pooled, {"0": pooled, "1": pooled}, {"clip-s": "scst clip-s +KL"})
    claims = [(r["subject"], r["claim"], r["holds"]) for r in records]
    assert claims == [("scst cider", CLAIM_REWARD_RISES, True), ("scst clip-s +KL", CLAIM_REWARD_RISES, True),
                      ("scst cider", "judge accuracy falls beyond noise", True),
                      ("scst clip-s +KL", "judge accuracy stays within noise", True),
                      ("scst cider", gamed_claim("Rep-2"), True), ("scst clip-s +KL", CLAIM_GUARD, True)]
    assert all(not re.search(r"\d", r["claim"]) for r in records)  # a fixed phrase: the numbers are in `interval`
    printed = results_markdown({"rows": [], "findings": records}).split("What the run found:\n\n")[1]
    lines = [line[2:] for line in printed.splitlines() if line.startswith("* ")]
    assert len(lines) == len(records)
    for line, record in zip(lines, records):
        parsed, interval = _parse(line), record["interval"]
        assert (parsed["subject"], parsed["claim"], parsed["holds"], parsed["column"]) == \
            (record["subject"], record["claim"], record["holds"], interval["column"])
        for key in ("point", "low", "high"):  # printed with 3 significant digits
            assert parsed[key] == pytest.approx(interval[key], rel=5e-3, abs=5e-4), (line, key)


def test_a_seed_that_disagrees_turns_a_claim_into_seed_dependent() -> None:
    pooled = _view([-9.0, -1.0], [0.1, 0.5])
    agreeing = finding_records(pooled, {"0": _view([-9.0, -2.0], [0.1, 0.5]), "1": _view([-8.0, -0.5], [0.2, 0.4])})
    judge = next(r for r in agreeing if r["claim"] == "judge accuracy falls beyond noise")
    assert judge["holds"] is True and judge["seeds"] == {"0": True, "1": True} and "opposed" not in judge
    # seed 1's own interval lies above 0 where seed 0's lies below: the seeds disagree beyond noise
    split = finding_records(pooled, {"0": _view([-9.0, -2.0], [0.1, 0.5]), "1": _view([1.0, 6.0], [0.2, 0.4])})
    judge = next(r for r in split if r["subject"] == "scst cider" and r["claim"] == "judge accuracy falls beyond noise")
    assert judge["holds"] == SEED_DEPENDENT and judge["seeds"] == {"0": True, "1": False}
    assert judge["opposed"] == {"Judge-acc": {"up": ["1"], "down": ["0"]}}
    assert " — seed-dependent: Judge-acc rises beyond noise for seed 1 and falls for seed 0 (" in judge["text"]
    # a claim the pooled interval rejects while the seeds go opposite ways: seed-dependent, never "does not hold"
    gain = finding_records(_view([-9.0, -1.0], [-0.1, 0.5]),
                           {"0": _view([-9.0, -1.0], [0.1, 0.5]), "1": _view([-9.0, -1.0], [-0.4, -0.2])})[0]
    assert (gain["claim"], gain["holds"]) == (CLAIM_REWARD_RISES, SEED_DEPENDENT)
    assert gain["opposed"] == {"reward": {"up": ["0"], "down": ["1"]}}


def test_a_seed_within_noise_leaves_the_pooled_verdict() -> None:
    # three seeds, the fall beyond noise in seeds 0 and 2 and within noise in seed 1 (its interval contains 0): no
    # seed goes the other way, so the pooled verdict stands; seed 1's own verdict is kept in `seeds`
    pooled = _view([-9.0, -1.0], [0.1, 0.5])
    seeds = {"0": _view([-9.0, -2.0], [0.1, 0.5]), "1": _view([-6.0, 1.0], [0.2, 0.4]),
             "2": _view([-7.0, -1.5], [0.1, 0.3])}
    judge = next(r for r in finding_records(pooled, seeds)
                 if r["subject"] == "scst cider" and r["claim"] == "judge accuracy falls beyond noise")
    assert judge["holds"] is True and judge["seeds"] == {"0": True, "1": False, "2": True}
    assert judge["text"].startswith("scst cider: judge accuracy falls beyond noise (Judge-acc -5.00 pts [-9.00, ")
    # a pooled rejection with one seed beyond noise and none against it: "does not hold", not seed-dependent
    gain = finding_records(_view([-9.0, -1.0], [-0.1, 0.5]),
                           {"0": _view([-9.0, -1.0], [0.1, 0.5]), "1": _view([-9.0, -1.0], [-0.2, 0.4])})[0]
    assert (gain["claim"], gain["holds"]) == (CLAIM_REWARD_RISES, False)


def test_a_gamed_claim_is_stated_only_where_it_holds() -> None:
    # Rep-2 rises beyond noise in seed 0 and falls in seed 1, the pooled Rep-2 interval contains 0: the cider run is
    # not gamed by repetition in the pooled view, and the seeds' disagreement on Rep-2 is no claim of its own
    pooled = _view([-9.0, -1.0], [0.1, 0.5], rep2=[-0.1, 0.3])
    seeds = {"0": _view([-9.0, -1.0], [0.1, 0.5], rep2=[0.1, 0.3]), "1": _view([-9.0, -1.0], [0.1, 0.5], rep2=[-0.3, -0.1])}
    assert gamed_claim("Rep-2") not in [r["claim"] for r in finding_records(pooled, seeds)]
    held = finding_records(_view([-9.0, -1.0], [0.1, 0.5], rep2=[0.1, 0.3]), seeds)
    record = next(r for r in held if r["claim"] == gamed_claim("Rep-2"))
    assert record["holds"] == SEED_DEPENDENT and record["opposed"] == {"Rep-2": {"up": ["0"], "down": ["1"]}}


def test_a_guarded_reward_that_never_varied_gets_no_guard_claim() -> None:
    pooled = _view([-9.0, -1.0], [0.1, 0.5])
    flat = finding_records(pooled, {"0": pooled}, {"clip-s": "scst clip-s +KL"}, {"clip-s": {"0": 0.9}})
    claims = [r["claim"] for r in flat if r["subject"] == "scst clip-s +KL"]
    assert CLAIM_GUARD not in claims and CLAIM_FLAT_REWARD in claims
    varied = finding_records(pooled, {"0": pooled}, {"clip-s": "scst clip-s +KL"}, {"clip-s": {"0": 0.2}})
    assert CLAIM_GUARD in [r["claim"] for r in varied]


def test_a_guard_that_never_acted_gets_no_guard_claim_but_says_so() -> None:
    pooled = _view([-9.0, -1.0], [0.1, 0.5])
    idle = finding_records(pooled, {"0": pooled}, {"clip-s": "scst clip-s +KL"}, {"clip-s": {"0": 0.2}},
                           inert={"clip-s": "scst clip-s"})
    mine = [r for r in idle if r["subject"] == "scst clip-s +KL"]
    assert [r["claim"] for r in mine if "guard" in r["claim"]] == [CLAIM_INERT]
    assert mine[-1]["interval"]["column"] == "Judge-acc"  # the row's own Judge-acc change, as the unguarded row's


def test_the_human_rule_names_the_best_model_and_each_metric() -> None:
    pooled = _view([-9.0, -1.0], [0.1, 0.5])
    pooled["human"] = "human"
    pooled["rows"]["scst cider"]["value"] = {"Judge-acc": 70.0}
    pooled["rows"]["scst cider"]["versus_human"] = {
        "delta": {"Judge-acc": -25.0, "C": 40.0}, "ci": {"Judge-acc": [-30.0, -20.0], "C": [30.0, 50.0]},
        "delta_per_seed": {"Judge-acc": [-25.0, -25.0], "C": [40.0, 40.0]}}
    records = [r for r in finding_records(pooled, {"0": pooled}) if r["subject"] == HUMAN_SUBJECT]
    # a fixed subject (which row is best is a choice by point estimates), the row in `model` and in the sentence
    assert {r["model"] for r in records} == {"scst cider"}
    assert records[0]["text"].startswith("best SCST row vs human (scst cider): the judge ranks humans above it (")
    assert [(r["claim"], r["holds"]) for r in records] == [("the judge ranks humans above it", True),
                                                          ("C ranks it above humans", True)]
    assert direction([0.1, 0.5]) == 1 and direction([-0.5, -0.1]) == -1 and direction([-0.1, 0.2]) == 0
    # float noise of identical captions scored in other batches (~1e-7) is no difference, and prints as +0.000
    assert direction([3e-8, 0.2]) == 0 and direction([-0.2, -4e-8]) == 0
    assert (signed(-2e-7), signed(-0.0004), signed(-0.0006), signed(-0.004)) == ("+0.000", "+0.000", "-0.001", "-0.004")


def test_gains_table_tells_apart_two_runs_of_one_reward():
    """A mix trained summed and normalised has one reward spec but two rows: the model column names each."""
    from pacs.captioner.orchestration.findings import gains_table

    gains = [{"model": "scst cider:1,pac-s++:0.5", "reward": "cider:1,pac-s++:0.5", "xe": 4.5, "scst": 4.75,
              "delta": 0.25, "ci": [0.125, 0.5]},
             {"model": "scst cider:1,pac-s++:0.5 norm", "reward": "cider:1,pac-s++:0.5", "xe": 4.5, "scst": 4.25,
              "delta": -0.25, "ci": [-0.5, 0.0]}]
    lines = gains_table(gains).splitlines()
    assert lines[0] == "| model | reward | xe | scst | Δ [95% interval] |"
    assert lines[2].startswith("| scst cider:1,pac-s++:0.5 | cider:1,pac-s++:0.5 | 4.5000 | 4.7500 | +0.250")
    assert lines[3].startswith("| scst cider:1,pac-s++:0.5 norm | cider:1,pac-s++:0.5 | 4.5000 | 4.2500 | -0.250")
