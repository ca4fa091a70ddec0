"""The demo's guarded SCST runs: configuration checks, the choice of the KL coefficient, the generated finding."""
from __future__ import annotations

import pytest

from captioner.demo.captioning import choose_guarded, guarded_label
from captioner.demo.config import GuardedScstConfig
from captioner.demo.findings import guarded_findings, guarded_model_name
from captioner.demo.pipeline import load_demo_config
from metric.common.errors import InputError


def test_guarded_runs_need_the_validation_signal_they_are_selected_by():
    with pytest.raises(InputError, match="scst.hacking_monitor_every"):
        load_demo_config(None, ["scst.hacking_monitor_every=0"])
    assert load_demo_config(None, ["scst.hacking_monitor_every=0", "guarded.rewards=[]"]).guarded.rewards == []
    with pytest.raises(InputError, match="listed twice"):
        load_demo_config(None, ["guarded.kl_coefs=[0.1,0.1]"])
    with pytest.raises(InputError, match="needs a pac-s model"):
        load_demo_config(None, ["guarded.rewards=[pac-s]"])


def test_the_reward_spec_and_stage_label_of_a_guarded_run():
    assert GuardedScstConfig().reward_spec("clip-s") == "clip-s"
    both = GuardedScstConfig(rep_penalty=0.5, length_penalty=0.25)
    assert both.reward_spec("pac-s++") == "pac-s++:1,rep-penalty:0.5,length-penalty:0.25"
    assert guarded_label("clip-s", 0.05) == "clip-s-kl0.05" and guarded_label("pac-s++", 0.2) == "pac-s++-kl0.2"


def test_the_coefficient_with_the_best_validation_cider_is_chosen_ties_to_the_smaller_and_none_never():
    summaries = {0.02: {"best_val_cider": 3.1}, 0.05: {"best_val_cider": 3.4}, 0.1: {"best_val_cider": 3.4},
                 0.2: {"best_val_cider": None}}
    assert choose_guarded(summaries) == 0.05
    assert choose_guarded({0.1: {"best_val_cider": None}, 0.2: {"best_val_cider": 1.0}}) == 0.2
    with pytest.raises(ValueError, match="no guarded run"):
        choose_guarded({0.1: {"best_val_cider": None}})


def _row(model, judge, rep2=(0.0, [-0.1, 0.1]), length=(0.0, [-0.1, 0.1])):
    return {"model": model, "delta": {"Judge-acc": judge[0], "Rep-2": rep2[0], "Length": length[0]},
            "ci": {"Judge-acc": judge[1], "Rep-2": rep2[1], "Length": length[1]}}


def test_the_guarded_finding_says_whether_the_reward_rose_and_the_judge_held():
    choices = {"clip-s": {"chosen_kl_coef": 0.2, "val_cider": {"0.1": 3.0, "0.2": 3.1}}}
    rows = [_row("scst clip-s", (-7.0, [-12.5, -1.0])), _row(guarded_model_name("clip-s"), (-2.0, [-4.5, 0.0]))]
    worked = guarded_findings(rows, [{"reward": "clip-s", "delta": 0.011, "ci": [0.003, 0.02]}], choices)
    assert worked == [("clip-s with the KL guard (β = 0.2, chosen among 0.1, 0.2 by validation CIDEr-D): its reward "
                      "rose (+0.011 [+0.003, +0.020]) and judge accuracy stayed within noise of XE (-2.00 pts "
                      "[-4.50, +0.000]); against -7.00 pts [-12.5, -1.00] without the guard; Rep-2 +0.000 "
                      "[-0.100, +0.100], Length +0.000 [-0.100, +0.100] against XE: the guard worked: the reward "
                       "was optimised without being gamed.")]
    rows[1] = _row(guarded_model_name("clip-s"), (-6.0, [-10.0, -2.0]))
    failed = guarded_findings(rows, [{"reward": "clip-s", "delta": 0.037, "ci": [0.024, 0.051]}], choices)
    assert failed[0].endswith("the guard did not keep the judge's accuracy.") and "fell beyond noise" in failed[0]
    flat = guarded_findings(rows[:1] + [_row(guarded_model_name("clip-s"), (1.0, [-1.0, 3.0]))],
                            [{"reward": "clip-s", "delta": 0.001, "ci": [-0.002, 0.004]}], choices)
    assert flat[0].endswith("the guard kept the judge but the reward no longer rose beyond noise.")
