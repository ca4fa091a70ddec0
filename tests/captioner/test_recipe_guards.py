"""A recipe's guarded SCST runs (`guarded:`): every setting of every guard trained, each guard's setting chosen on
the hacking monitor's validation CIDEr-D, the best combination trained, the chosen runs evaluated as table rows
(real Flickr8k, tiny models)."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import yaml
from captioner_testkit import finished_stages, tiny_pipeline_recipe

from pacs.captioner.entry import plan_from_config, run_from_config
from pacs.captioner.orchestration.pipeline import PipelineConfig, stage_names
from pacs.metric.common.config import from_dict
from pacs.metric.common.errors import InputError

torch.set_num_threads(1)
GUARDED = {"rewards": ["cider"], "kl_coefs": [0.0, 0.5], "grid": {"length_mask_slack": [0, 2]}}
CANDIDATES = {"kl_coef": ["scst-cider-kl0", "scst-cider-kl0.5"], "length_mask_slack": ["scst-cider-mask0",
                                                                                      "scst-cider-mask2"]}


def _recipe(tmp_path: Path, shared_data: Path, **changes) -> dict:
    recipe = tiny_pipeline_recipe(tmp_path / "run", shared_data / "flickr8k", max_images=3, bootstrap=20,
                                  guarded=GUARDED)
    recipe["scst"].update(max_steps=2, monitor_every=1, monitor_images=2)
    recipe["evaluation"]["text_metrics"] = ["bleu4", "cider"]  # C: the reward's own value, so its gain
    recipe.update(changes)
    return recipe


def _monitor_cider(folder: Path) -> dict[int, float]:
    with open(folder / "monitor.csv", encoding="utf-8", newline="") as handle:
        return {int(row["step"]): float(row["cider"]) for row in csv.DictReader(handle)}


@pytest.mark.slow
def test_a_recipe_trains_every_guard_chooses_on_validation_and_evaluates_the_chosen_runs(tmp_path, shared_data):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(_recipe(tmp_path, shared_data)))
    run_from_config(str(path), [])
    run = tmp_path / "run"
    config = from_dict(PipelineConfig, _recipe(tmp_path, shared_data), "recipe")
    guarded = [*CANDIDATES["kl_coef"], *CANDIDATES["length_mask_slack"], "scst-cider-guards"]
    assert [name for name in stage_names(config) if name.startswith("scst-cider-")] == guarded
    record = json.loads((run / "stages" / "scst-cider-kl0.5.json").read_text())
    assert record["settings"]["guard"] == {"kl_coef": 0.5, "select_by": "cider"}
    assert json.loads((run / "stages" / "scst-cider-mask2.json").read_text())["settings"]["guard"] == {
        "length_mask": True, "length_mask_slack": 2, "select_by": "cider"}
    choice = json.loads((run / "guard_choice-cider.json").read_text())
    for key, stages in CANDIDATES.items():  # the validation CIDEr-D of each candidate: its monitor's best step
        record = choice["choices"][key]
        best = {stage: max(_monitor_cider(run / stage).values()) for stage in stages}
        assert [c["val_cider"] for c in record["candidates"]] == pytest.approx([best[s] for s in stages], abs=1e-9)
        top = max(best.values())
        tied = [c for c in record["candidates"] if abs(c["val_cider"] - top) <= 1e-12]
        fewest = min(len(c["signatures"]) for c in tied)
        assert record["chosen_stage"] == next(c["stage"] for c in tied if len(c["signatures"]) == fewest)
    assert choice["combination"]["settings"] == {key: value for key, value in
                                                 (("kl_coef", choice["choices"]["kl_coef"]["chosen"]),
                                                  ("length_mask_slack",
                                                   choice["choices"]["length_mask_slack"]["chosen"]))
                                                 if not (key == "kl_coef" and value == 0.0)}
    rows = {row["model"] for row in json.loads((run / "eval" / "results.json").read_text())["rows"]}
    assert rows == {"xe", "cider", "cider +KL", "cider +length mask", "cider +guards"}
    evaluated = json.loads((run / "stages" / "eval" / "cider_+kl" / "flickr8k.json").read_text())
    assert choice["choices"]["kl_coef"]["chosen_stage"] in evaluated["upstream"]
    results = json.loads((run / "eval" / "results.json").read_text())
    assert results["guarded"]["choices_by_seed"][str(config.seed)]["cider"]["guards"] == choice
    assert {gain["model"] for gain in results["reward_gains"]} == rows - {"xe"}
    markdown = (run / "eval" / "results.md").read_text()
    assert f"| cider | {config.seed} | length_mask_slack | " in markdown and "| cider | " \
        f"{config.seed} | best combination | " in markdown and "What the run found:\n\n* cider: " in markdown \
        and "\n* cider +KL: its own reward rises" in markdown

    before = finished_stages(run)
    run_from_config(str(path), [])  # done: every stage reused
    assert finished_stages(run) == before
    # the dry run makes the choices again from the finished candidates' records: every stage reused
    plan = plan_from_config(str(path), [])
    assert plan.splitlines()[-1] == f"would reuse {len(stage_names(config))}"
    # a changed candidate re-runs, and so do the combination and every guarded row's evaluation (not known yet)
    plan = " ".join(plan_from_config(str(path), ["scst.lr=1e-5"]).split())
    assert "run scst-cider-guards upstream scst-cider-kl0, scst-cider-kl0.5, scst-cider-mask0 and 1 more re-run" \
        in plan and "run eval/cider_+length_mask/flickr8k upstream scst-cider-kl0" in plan


def test_guarded_rewards_are_trained_rewards_and_need_the_validation_monitor(tmp_path, shared_data):
    with pytest.raises(InputError, match=r"guarded.rewards: pac-s\+\+ not in rewards=\['cider'\]"):
        from_dict(PipelineConfig, _recipe(tmp_path, shared_data, guarded={**GUARDED, "rewards": ["pac-s++"]}), "r")
    recipe = _recipe(tmp_path, shared_data)
    recipe["scst"]["monitor_every"] = 0
    with pytest.raises(InputError, match="set scst.monitor_every > 0"):
        from_dict(PipelineConfig, recipe, "r")
    with pytest.raises(InputError, match="guarded.grid.length_mask: unknown guard"):
        from_dict(PipelineConfig, _recipe(tmp_path, shared_data, guarded={**GUARDED, "grid": {"length_mask": [1]}}),
                  "r")
