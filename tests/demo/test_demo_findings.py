"""The demo's findings: intervals from eval's bootstrap, sentences from fixed rules on hand-made numbers."""
from __future__ import annotations

import numpy as np
import pytest

from captioner.demo.findings import (
    add_row_intervals,
    direction,
    findings,
    human_finding,
    paired_intervals,
    reward_gains,
    reward_values,
    scst_model_name,
)
from eval.system_scoring import RowScores
from metric.common.errors import InputError


def test_demo_reward_values_of_a_mix_are_the_weighted_sum_of_its_terms() -> None:
    values = {"C": np.array([200.0, 100.0]), "PAC-S++": np.array([2.0, 1.0]), "CLIP-S": np.array([1.5, 0.5])}
    assert reward_values("cider:1,pac-s++:0.5", values).tolist() == [2.0 + 1.0, 1.0 + 0.5]  # C/100 + 0.5 PAC-S++
    assert reward_values("clip-s", values).tolist() == [1.5, 0.5]
    with pytest.raises(InputError, match="bleu"):
        reward_values("bleu", values)


def _scores(per_image: dict[str, np.ndarray]) -> RowScores:
    """A row's scores as `eval.system_table` gives them: each metric's mean and per-caption values."""
    n = len(next(iter(per_image.values())))
    return RowScores(values={m: float(v.mean()) for m, v in per_image.items()}, per_row=dict(per_image), n_rows=n)


def test_demo_intervals_of_a_constant_shift_are_that_shift() -> None:
    # SCST = XE + 0.03 CIDEr-D on every image: every resample's difference is exactly 3 on the C column (x100)
    xe = {"C": np.arange(20, dtype=float)}
    cider = np.arange(20, dtype=float) / 100
    scores = {"xe": _scores({"cider": cider}), "scst cider": _scores({"cider": cider + 0.03}),
              "human": _scores({"cider": cider + 1.0})}
    rows = [{"model": "xe", "C": float(xe["C"].mean())}, {"model": "scst cider", "C": float(xe["C"].mean() + 3)},
            {"model": "human", "C": float(xe["C"].mean() + 100)}]
    add_row_intervals(rows, scores, {"C": ("cider", 100.0)}, 200, 0)
    assert rows[1]["ci"]["C"] == pytest.approx([3.0, 3.0]) and rows[1]["delta"]["C"] == pytest.approx(3.0)
    assert "ci" not in rows[0] and "ci" not in rows[2]  # neither XE nor the human row is compared with XE
    # against the human row: the same bootstrap, every row's own interval and its paired difference
    versus = paired_intervals(scores, ["xe", "scst cider", "human"], "human", {"C": ("cider", 100.0)}, 200, 0)
    assert versus["xe"]["delta"]["C"] == pytest.approx(-100.0) and versus["xe"]["ci"]["C"] == pytest.approx([-100, -100])
    assert versus["scst cider"]["ci"]["C"] == pytest.approx([-97.0, -97.0]) and "delta" not in versus["human"]
    low, high = versus["human"]["value_ci"]["C"]  # the human row's own interval of its mean, 100 + mean of 0..19
    assert 100 + 0 < low < 100 + 9.5 < high < 100 + 19
    gains = reward_gains(["cider"], {"xe": xe, "scst cider": {"C": xe["C"] + 3}}, 200, 0)
    assert gains[0]["delta"] == pytest.approx(0.03) and gains[0]["ci"] == pytest.approx([0.03, 0.03])


def test_demo_findings_follow_the_rules() -> None:
    assert (direction([0.1, 0.5]), direction([-0.5, -0.1]), direction([-0.1, 0.2])) == (1, -1, 0)
    columns = ("Judge-acc", "Length", "Rep-2", "%Incorrect", "Halluc.")
    rows = [{"model": "xe"},
            {"model": scst_model_name("cider"), "delta": dict.fromkeys(columns, 5.0),
             "ci": {"Judge-acc": [2.0, 8.0], "Length": [-1.0, 1.0], "Rep-2": [-1.0, 1.0], "%Incorrect": [-1.0, 1.0],
                    "Halluc.": [-9.0, -1.0]}},
            {"model": scst_model_name("clip-s"), "delta": {"Judge-acc": -6.0, "Length": -2.0, "Rep-2": 0.1,
                                                          "%Incorrect": 0.0, "Halluc.": 1.0},
             "ci": {"Judge-acc": [-10.0, -2.0], "Length": [-3.0, -1.0], "Rep-2": [-0.1, 0.3],
                    "%Incorrect": [0.0, 0.0], "Halluc.": [-1.0, 3.0]}}]
    gains = [{"reward": "cider", "delta": 0.2, "ci": [0.1, 0.3]}, {"reward": "clip-s", "delta": 0.1, "ci": [0.05, 0.2]}]
    text = findings(rows, gains)
    assert text[0] == "SCST raised its own reward on the test split (95% interval above 0) for cider and clip-s."
    assert text[1] == "Judge accuracy rose beyond noise under cider (+5.00 pts [+2.00, +8.00])."
    assert text[2] == "Judge accuracy fell beyond noise under clip-s (-6.00 pts [-10.0, -2.00])."
    # clip-s raised its reward, lost judge accuracy and shortened the captions: gamed; cider is not
    assert text[3] == ("clip-s was gamed: its reward rose (+0.100 [+0.050, +0.200]) while judge accuracy did not, "
                       "with shorter captions (-2.00 [-3.00, -1.00] Length).")
    assert text[4] == "scst cider: within noise against XE: Length, Rep-2, %Incorrect."
    assert text[5] == "scst clip-s: within noise against XE: Rep-2, %Incorrect, Halluc."  # one full stop
    assert len(text) == 6


def test_demo_human_line_follows_its_rule_and_the_human_row_stays_out_of_the_xe_rules() -> None:
    rows = [{"model": "xe", "Judge-acc": 80.0}, {"model": "scst cider", "Judge-acc": 70.0},
            {"model": "scst pac-s++", "Judge-acc": 60.0},
            {"model": "human", "Judge-acc": 95.0, "ci": {"Length": [-1.0, 1.0]}, "delta": {"Length": 0.0}}]
    versus = {"xe": {"delta": {"Judge-acc": -15.0}, "ci": {"Judge-acc": [-20.0, -10.0]}},
              "scst cider": {"delta": {"Judge-acc": -25.0, "C": -40.0, "CLIP-S": 0.01, "PAC-S++": 0.05},
                             "ci": {"Judge-acc": [-30.0, -20.0], "C": [-50.0, -30.0], "CLIP-S": [-0.01, 0.03],
                                    "PAC-S++": [0.02, 0.08]}},
              "scst pac-s++": {"delta": {"Judge-acc": -35.0, "PAC-S++": 0.2}, "ci": {"Judge-acc": [-40.0, -30.0],
                                                                                     "PAC-S++": [0.1, 0.3]}}}
    line = human_finding(rows, versus)  # the best SCST model by judge accuracy: scst cider (70 > 60)
    assert line == ("The learned metrics and the judge disagree on humans: scst cider (the best SCST model by judge "
                    "accuracy) against the human row (a held-out reference per image; paired 95% intervals of scst "
                    "cider − human): the judge ranks humans above scst cider (Judge-acc -25.0 pts [-30.0, -20.0]); "
                    "PAC-S++ (+0.050 [+0.020, +0.080]) rank scst cider above humans; C (-40.0 [-50.0, -30.0]) rank "
                    "humans above scst cider; CLIP-S (+0.010 [-0.010, +0.030]) within noise.")
    text = findings(rows, [], versus)
    assert text == [line]  # no gains, no SCST-vs-XE intervals: only the human line; the human row's ci is ignored
    level = {"scst cider": {"delta": {"Judge-acc": 1.0, "C": 2.0}, "ci": {"Judge-acc": [-1.0, 3.0], "C": [1.0, 3.0]}}}
    assert human_finding(rows, level).startswith("Humans against the best SCST model: scst cider")
    assert "the judge ranks them level within noise (Judge-acc +1.00 pts [-1.00, +3.00]); C (+2.00 [+1.00, +3.00]) " \
           "rank scst cider above humans." in human_finding(rows, level)
    assert human_finding(rows[:1], versus) is None
