"""A weighted mix cannot be split by the override parser into runs nobody asked for.

`rewards=[cider:1,pac-s++:0.5]` on the command line is a YAML flow list of two items, `cider:1` and
`pac-s++:0.5`: before, two SCST runs, one of them PAC-S++ alone at half weight. Now a list item that is a single
weighted term is refused in one line showing the spelling that gives the mix, the same in YAML, on the command
line, in compare_rewards.py and for configs built in Python.
"""
from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from pacs.captioner.demo.config import ScstStageConfig
from pacs.captioner.orchestration.pipeline import PipelineConfig
from pacs.metric.common.config import from_dict, load_config
from pacs.metric.common.config_files import packaged_config
from pacs.metric.common.errors import InputError

SPLIT = "rewards: 'cider:1', 'pac-s++:0.5' are single weighted terms, not rewards: a mix is one item"
QUOTED = "\"rewards=['cider:1,pac-s++:0.5']\""


def test_the_split_mix_on_the_command_line_is_refused_before_any_folder(tmp_path, capsys):
    from pacs.cli import main

    code = main(["train", "--config", "flickr8k_tiny", f"run_dir={tmp_path / 'run'}", "rewards=[cider:1,pac-s++:0.5]"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert SPLIT in err and QUOTED in err
    assert not (tmp_path / "run").exists()


def test_the_spelling_the_message_shows_gives_the_mix() -> None:
    config = load_config(PipelineConfig, "flickr8k_tiny", ["rewards=['cider:1,pac-s++:0.5']"])
    assert config.rewards == ["cider:1,pac-s++:0.5"]  # one run, the mix


def test_yaml_and_python_configs_follow_the_same_rule(tmp_path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"_base_: {packaged_config('flickr8k_tiny')}\nrewards: [cider:1, pac-s++:0.5]\n")
    with pytest.raises(InputError, match="'cider:1', 'pac-s\\+\\+:0.5' are single weighted terms"):
        load_config(PipelineConfig, str(recipe), [])
    with pytest.raises(InputError, match="rewards: 'pac-s\\+\\+:0.5' is a single weighted term, not a reward: "
                                         "a reward alone is its name \\('pac-s\\+\\+'\\)"):
        from_dict(PipelineConfig, {"rewards": ["cider", "pac-s++:0.5"]})
    assert from_dict(PipelineConfig, {"rewards": ["cider", "cider:1,pac-s++:0.5"]}).rewards == [
        "cider", "cider:1,pac-s++:0.5"]


def test_the_demo_and_compare_rewards_follow_it_too(capsys) -> None:
    with pytest.raises(InputError, match="scst.rewards: 'cider:1', 'pac-s\\+\\+:0.5' are single weighted terms"):
        ScstStageConfig(rewards=["cider:1", "pac-s++:0.5"]).validate()
    compare = runpy.run_path(str(Path(__file__).resolve().parents[2] / "recipes" / "compare_rewards.py"),
                             run_name="compare_rewards")
    assert compare["main"](["--config", "flickr8k_tiny", "--reward", "cider:1", "--reward", "pac-s++:0.5"]) == 2
    err = capsys.readouterr().err
    assert "--reward: 'cider:1', 'pac-s++:0.5' are single weighted terms" in err
    assert "--reward 'cider:1,pac-s++:0.5'" in err

