"""The demo's guard menu (issue 44 items 2-3): `guarded.grid` validation, each guard passed through to the recipe's
SCSTConfig keys, the stage names, and the choice on validation (candidates, tie-break, combination)."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from pacs.captioner.demo import captioning
from pacs.captioner.demo.pipeline import REPO_CONFIGS, guarded_stage_names, load_demo_config
from pacs.captioner.modeling.train_scst import SCSTConfig, gaming_thresholds
from pacs.captioner.orchestration import guard_choice
from pacs.captioner.orchestration.findings import CLAIM_GUARD, CLAIM_INERT, guard_claim, guard_verdicts
from pacs.metric.common.errors import InputError

SMOKE = REPO_CONFIGS / "demo_guards_smoke.yaml"


@pytest.mark.parametrize(("override", "message"), [
    ("guarded.grid={cider_ancor: [0.5]}", "guarded.grid.cider_ancor: unknown guard (did you mean 'cider_anchor'?"),
    ("guarded.grid={kl_coef: [0.1]}", "guarded.grid.kl_coef: the KL grid is guarded.kl_coefs"),
    ("guarded.grid={stop_on_gaming: [1.5]}", "guarded.grid.stop_on_gaming: 1.5 is not true or false"),
    ("guarded.grid={cider_anchor: [-1]}", "guarded.grid.cider_anchor: -1.0 is not a finite number >= 0"),
    ("guarded.grid={length_mask_slack: [1.5]}", "guarded.grid.length_mask_slack: 1.5 is not a whole number"),
    ("guarded.grid={cider_anchor: [0.5, 0.5]}", "guarded.grid.cider_anchor=[0.5, 0.5]: a setting is listed twice"),
    ("guarded.grid={cider_anchor: []}", "guarded.grid.cider_anchor=[]: expected a non-empty list"),
])
def test_a_bad_grid_is_refused_in_one_line_naming_the_key(override: str, message: str) -> None:
    with pytest.raises(InputError) as error:
        load_demo_config(SMOKE, [override])
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_penalty_in_the_grid_cannot_also_be_fixed() -> None:
    with pytest.raises(InputError, match=r"guarded.grid.rep_penalty: the penalty is also fixed by guarded.rep_penalty"):
        load_demo_config(SMOKE, ["guarded.rep_penalty=0.2"])


def test_the_kl_grid_alone_keeps_the_stage_names_of_demo_yaml() -> None:
    assert guarded_stage_names(load_demo_config(None, [])) == ["scst-clip-s-kl0.2", "scst-pac-s++-kl0.2"]
    assert not load_demo_config(None, []).guarded.combines()


def test_the_stage_names_of_every_guard_setting_and_the_combination() -> None:
    assert guarded_stage_names(load_demo_config(SMOKE, [])) == [
        "scst-pac-s++-kl0.1", "scst-pac-s++-mask0", "scst-pac-s++-mask2", "scst-pac-s++-anchor0.5",
        "scst-pac-s++-stop", "scst-pac-s++-rep0.5", "scst-pac-s++-guards"]


def test_the_reward_spec_of_each_guard() -> None:
    guarded = load_demo_config(SMOKE, []).guarded
    assert guarded.reward_spec("pac-s++", {"kl_coef": 0.1}) == "pac-s++"
    assert guarded.reward_spec("pac-s++", {"cider_anchor": 0.5}) == "pac-s++:1,cider:0.5"
    assert guarded.reward_spec("pac-s++", {"rep_penalty": 0.5}) == "pac-s++:1,rep-penalty:0.5"
    assert guarded.reward_spec("pac-s++", {"rep_penalty": 0.5, "cider_anchor": 1.0}) == \
        "pac-s++:1,rep-penalty:0.5,cider:1"
    fixed = load_demo_config(None, ["guarded.length_penalty=0.25"]).guarded
    assert fixed.reward_spec("clip-s", {"cider_anchor": 0.5}) == "clip-s:1,length-penalty:0.25,cider:0.5"


class _Captured(Exception):
    """Raised by the fake `train_scst`: the SCSTConfig the demo built."""


def _scst_of(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, guard: dict, spec: str) -> SCSTConfig:
    """The recipe SCSTConfig `captioning.run_scst` builds for a guarded run with `guard` (training stubbed out)."""
    def fake_train(scst: SCSTConfig, *args, **kwargs):
        raise _Captured(scst)

    monkeypatch.setattr(captioning, "train_scst", fake_train)
    config = load_demo_config(SMOKE, [])
    item = SimpleNamespace(image_id="a", references=["a red square"])
    data = SimpleNamespace(splits={"train": [item], "val": [item]})
    with pytest.raises(_Captured) as captured:
        captioning.run_scst(config, data, None, object(), spec, tmp_path / "xe", tmp_path / "run", tmp_path, 4,
                            guard=guard, label="x", seed=0)
    return captured.value.args[0]


@pytest.mark.parametrize(("guard", "spec", "expected"), [
    ({"kl_coef": 0.1}, "pac-s++", {"kl_coef": 0.1, "select_by": "cider", "length_mask": False, "cider_anchor": 0.0,
                                   "stop_on_gaming": False}),
    ({"length_mask_slack": 0.0}, "pac-s++", {"kl_coef": 0.0, "length_mask": True, "length_mask_slack": 0,
                                             "select_by": "cider"}),
    ({"length_mask_slack": 3.0}, "pac-s++", {"length_mask": True, "length_mask_slack": 3}),
    ({"cider_anchor": 0.5}, "pac-s++:1,cider:0.5", {"cider_anchor": 0.5, "reward": "pac-s++:1,cider:0.5",
                                                     "length_mask": False}),
    ({"stop_on_gaming": True}, "pac-s++", {"stop_on_gaming": True, "select_by": "last"}),
    ({"rep_penalty": 0.5}, "pac-s++:1,rep-penalty:0.5", {"reward": "pac-s++:1,rep-penalty:0.5", "kl_coef": 0.0}),
    ({"length_penalty": 0.25}, "pac-s++:1,length-penalty:0.25", {"reward": "pac-s++:1,length-penalty:0.25"}),
    ({"kl_coef": 0.2, "length_mask_slack": 2.0, "cider_anchor": 1.0, "stop_on_gaming": True}, "pac-s++:1,cider:1",
     {"kl_coef": 0.2, "length_mask": True, "length_mask_slack": 2, "cider_anchor": 1.0, "stop_on_gaming": True,
      "select_by": "last"}),
])
def test_each_guard_reaches_the_recipe_scst_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, guard: dict,
                                                   spec: str, expected: dict) -> None:
    scst = _scst_of(monkeypatch, tmp_path, guard, spec)
    assert {key: getattr(scst, key) for key in expected} == expected
    assert scst.monitor_every == 1 and scst.monitor_images == 8  # guarded.monitor_* of the smoke preset


def _row(step: int, reward: float, cider: float) -> dict:
    return {"step": step, "reward": reward, "cider": cider, "length": 8.0, "rep1": 0.1, "rep2": 0.0, "rep3": 0.0,
            "rep4": 0.0, "distinct1": 0.5, "distinct2": 0.6, "incorrect": 0.0, "grammar_errors": 0.0,
            "zero_spread": 0.0}


def test_the_evidence_of_a_run_is_its_monitor_row_at_the_selected_step() -> None:
    rows = [_row(0, 0.50, 1.00), _row(1, 0.60, 0.70), _row(2, 0.70, 0.50)]
    thresholds = gaming_thresholds(SCSTConfig())  # CIDEr-D may fall by 20% while the reward rises
    assert guard_choice.evidence(rows, 1, thresholds) == {"selected_step": 1, "val_cider": 0.70, "signatures": [
        "reward/CIDEr-D divergence"]}  # −30%
    assert guard_choice.evidence(rows, 0, thresholds) == {"selected_step": 0, "val_cider": 1.00, "signatures": []}
    calm = [_row(0, 0.50, 1.00), _row(1, 0.60, 0.90)]  # −10%: within the threshold
    assert guard_choice.evidence(calm, 1, thresholds)["signatures"] == []
    assert guard_choice.evidence(calm, 5, thresholds) == {"selected_step": 5, "val_cider": None, "signatures": None}


def _candidate(setting, cider, signatures=()):
    return {"setting": setting, "stage": f"s-{setting}", "val_cider": cider, "signatures": list(signatures)}


def test_the_choice_is_the_best_validation_cider_then_fewest_signatures_then_the_grid_order() -> None:
    assert guard_choice.choose([_candidate(0, 0.3), _candidate(2, 0.5), _candidate(4, 0.4)]) == 1
    tied = [_candidate(0, 0.5, ["repetition gaming"]), _candidate(2, 0.5), _candidate(4, 0.5)]
    assert guard_choice.choose(tied) == 1  # fewest signatures, then the first listed
    assert guard_choice.choose([_candidate(0, None), _candidate(2, 0.1)]) == 1
    with pytest.raises(ValueError, match="no guarded run has a finite validation CIDEr-D"):
        guard_choice.choose([_candidate(0, None)])
    record = guard_choice.choice_record("pac-s++", 3, "length_mask_slack", tied)
    assert (record["chosen"], record["chosen_stage"], record["seed"]) == (2, "s-2", 3)
    assert record["criterion"] == guard_choice.CRITERION and record["candidates"] == tied


def test_the_combination_takes_each_chosen_setting_and_leaves_out_the_guards_chosen_off() -> None:
    choices = {"kl_coef": {"chosen": 0.2}, "length_mask_slack": {"chosen": 0.0}, "cider_anchor": {"chosen": 0.0},
               "stop_on_gaming": {"chosen": False}, "rep_penalty": {"chosen": 0.5}}
    assert guard_choice.combination(choices) == {"kl_coef": 0.2, "length_mask_slack": 0.0, "rep_penalty": 0.5}


def test_each_guard_row_has_its_own_claim() -> None:
    assert guard_claim("scst pac-s++ +KL") == CLAIM_GUARD
    assert guard_claim("scst pac-s++ +length mask") == "the length mask guard keeps judge accuracy while its reward rises"
    assert guard_claim("scst pac-s++ +guards") == ("the combination of guards keeps judge accuracy while its reward "
                                                    "rises")


def test_a_kl_run_records_the_guard_settings_it_recorded_before_the_menu() -> None:
    # the fingerprint demo.yaml's `scst-<reward>-kl<coef>` stages were recorded with: they stay done
    assert guard_choice.scst_keys({"kl_coef": 0.2}) == {"kl_coef": 0.2, "select_by": "cider"}


def test_the_outcome_line_names_the_guards_that_held_or_says_none_did() -> None:
    def record(model: str, holds) -> dict:
        return {"subject": model, "claim": guard_claim(model), "holds": holds}

    rows = {"pac-s++": ["scst pac-s++ +KL", "scst pac-s++ +length mask", "scst pac-s++ +guards"],
            "ref-pac-s++": ["scst ref-pac-s++ +KL", "scst ref-pac-s++ +guards"]}
    records = [record("scst pac-s++ +KL", False), record("scst pac-s++ +length mask", True),
               record("scst pac-s++ +guards", True), record("scst ref-pac-s++ +KL", False),
               record("scst ref-pac-s++ +guards", "seed-dependent"),
               {"subject": "scst pac-s++ +KL", "claim": "judge accuracy falls", "holds": True},
               {"subject": "scst pac-s++ +early stop", "claim": CLAIM_INERT, "holds": True}]
    rows["pac-s++"].append("scst pac-s++ +early stop")
    assert guard_verdicts(records, rows) == [
        ("pac-s++: judge accuracy kept while the reward rose under scst pac-s++ +length mask and scst pac-s++ +guards "
        "(each guard's setting chosen on validation, without the judge). scst pac-s++ +early stop never acted (its "
        "test captions are the unguarded run's)."),
        ("ref-pac-s++: no guard chosen without the judge kept judge accuracy while the reward rose (scst ref-pac-s++ "
        "+KL and scst ref-pac-s++ +guards: the finding does not hold or is seed-dependent).")]
