"""One folder name per reward (issue 40 item 2): the demo and the recipes name `scst-<slug>` alike, and a run folder
written by a recipe of pacs < 0.7 (`scst-pac-spp`) is refused in one line that says how to go on."""
from __future__ import annotations

import pytest

from pacs.rewards.slug import legacy_folders_problem, legacy_reward_slug, reward_slug


@pytest.mark.parametrize(("spec", "slug", "legacy"), [
    ("cider", "cider", "cider"),
    ("pac-s++", "pac-s++", "pac-spp"),
    ("ref-pac-s++", "ref-pac-s++", "ref-pac-spp"),
    ("cider:1,pac-s++:0.5", "cider_1_pac-s++_0.5", "cider1_pac-spp0.5"),
    ("CIDEr:1,rep-penalty:0.5", "cider_1_rep-penalty_0.5", "cider1_rep-penalty0.5"),
])
def test_the_slug_keeps_the_reward_readable(spec, slug, legacy):
    assert reward_slug(spec) == slug
    assert legacy_reward_slug(spec) == legacy


def test_the_demo_and_the_recipes_share_the_slug():
    from pacs.captioner.demo import captioning
    from pacs.captioner.orchestration import pipeline

    assert captioning.reward_slug is reward_slug and pipeline.reward_slug is reward_slug
    assert captioning.guarded_label("pac-s++", 0.2) == "pac-s++-kl0.2"


@pytest.mark.parametrize("old", ["scst-pac-spp", "stages/scst-pac-spp.json", "eval/pac-spp"])
def test_a_pre_0_7_recipe_folder_is_refused_naming_both_names(tmp_path, old):
    (tmp_path / old).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / old).mkdir() if not old.endswith(".json") else (tmp_path / old).write_text("{}")
    problem = legacy_folders_problem(tmp_path, ["cider", "pac-s++"])
    assert problem == (f"{tmp_path}: reward 'pac-s++' was trained here by pacs < 0.7 into {old}; 0.7 names its "
                       "folders scst-pac-s++ and eval/pac-s++: use a new run_dir (or delete the old scst-pac-spp, "
                       "stages/scst-pac-spp.json and eval/pac-spp to train it again here)")


def test_a_folder_whose_name_did_not_change_is_not_a_problem(tmp_path):
    (tmp_path / "scst-cider").mkdir()
    (tmp_path / "eval" / "cider").mkdir(parents=True)
    (tmp_path / "scst-pac-s++").mkdir()
    assert legacy_folders_problem(tmp_path, ["cider", "pac-s++"]) is None
