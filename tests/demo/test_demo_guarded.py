"""The demo's guarded SCST runs: configuration checks, the choice of the KL coefficient, the generated finding."""
from __future__ import annotations

import pytest

from pacs.captioner.demo.captioning import choose_guarded, guarded_label
from pacs.captioner.demo.config import GuardedScstConfig
from pacs.captioner.demo.pipeline import load_demo_config
from pacs.captioner.orchestration.findings import CLAIM_GUARD, finding_records, guarded_model_name
from pacs.metric.common.errors import InputError


def test_guarded_runs_need_the_validation_signal_they_are_selected_by():
    with pytest.raises(InputError, match="set scst.monitor_every and scst.monitor_images > 0"):
        load_demo_config(None, ["scst.monitor_every=0"])
    assert load_demo_config(None, ["scst.monitor_every=0", "guarded.rewards=[]"]).guarded.rewards == []
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


def _view(guarded_judge: list[float], guarded_gain: list[float]) -> dict:
    guarded = guarded_model_name("clip-s")
    return {"rows": {"xe": {}, guarded: {"delta": {"Judge-acc": -2.0}, "ci": {"Judge-acc": guarded_judge},
                                         "delta_per_seed": {"Judge-acc": [-2.0]}}},
            "gains": [{"reward": "clip-s", "model": guarded, "delta": 0.01, "ci": guarded_gain, "per_seed": [0.01]}],
            "share_of_oracle": {}, "oracle": None, "human": None}


def test_the_guarded_finding_says_whether_the_reward_rose_and_the_judge_held():
    def guard(view: dict) -> dict:
        records = finding_records(view, {"0": view}, {"clip-s": guarded_model_name("clip-s")})
        return next(r for r in records if r["claim"] == CLAIM_GUARD)

    worked = guard(_view([-4.5, 0.0], [0.003, 0.02]))  # the reward rose, the judge stayed within noise
    assert worked["holds"] is True and worked["subject"] == "scst clip-s +KL"
    assert worked["text"] == ("scst clip-s +KL: the KL guard keeps judge accuracy while its reward rises "
                              "(Judge-acc -2.00 pts [-4.50, +0.000]; fragile: an independent replication agrees with "
                              "probability 0.36).")  # reward rises: Φ((2.8 − 1.96)/√2) = 0.72; judge not falling (its
    # upper bound at 0: z = −1.96): Φ(0) = 0.5; 0.72 · 0.5 = 0.36
    assert guard(_view([-10.0, -2.0], [0.024, 0.051]))["holds"] is False  # the judge fell beyond noise
    assert guard(_view([-1.0, 3.0], [-0.002, 0.004]))["holds"] is False  # the reward no longer rose
