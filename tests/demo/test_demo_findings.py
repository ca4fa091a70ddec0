"""The demo's findings: intervals from eval's bootstrap, sentences from fixed rules on hand-made numbers."""
from __future__ import annotations

import numpy as np
import pytest

from captioner.demo.findings import (
    add_row_intervals,
    direction,
    findings,
    reward_gains,
    reward_values,
    scst_model_name,
)
from metric.common.errors import InputError


def test_demo_reward_values_of_a_mix_are_the_weighted_sum_of_its_terms() -> None:
    values = {"C": np.array([200.0, 100.0]), "PAC-S++": np.array([2.0, 1.0]), "CLIP-S": np.array([1.5, 0.5])}
    assert reward_values("cider:1,pac-s++:0.5", values).tolist() == [2.0 + 1.0, 1.0 + 0.5]  # C/100 + 0.5 PAC-S++
    assert reward_values("clip-s", values).tolist() == [1.5, 0.5]
    with pytest.raises(InputError, match="bleu"):
        reward_values("bleu", values)


def test_demo_intervals_of_a_constant_shift_are_that_shift() -> None:
    # SCST = XE + 3 on every image: every resample's difference is exactly 3
    xe = {"C": np.arange(20, dtype=float)}
    rows = [{"model": "xe", "C": float(xe["C"].mean())}, {"model": "scst cider", "C": float(xe["C"].mean() + 3)}]
    add_row_intervals(rows, {"xe": xe, "scst cider": {"C": xe["C"] + 3}}, [str(i) for i in range(20)], 200, 0)
    assert rows[1]["ci"]["C"] == pytest.approx([3.0, 3.0]) and rows[1]["delta"]["C"] == pytest.approx(3.0)
    assert "ci" not in rows[0]
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
