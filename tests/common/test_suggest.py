"""'did you mean' (issue 42 item 7): unknown keys and names are answered with the closest known one, by one helper.

Config keys, reward names, metric names, packaged config presets and `--force` stage names each give the
suggestion in their one-line error; a long list of known names is left out when a suggestion is given.
"""
from __future__ import annotations

import pytest

from pacs.captioner.modeling.train_xe import XEConfig
from pacs.captioner.orchestration.stages import check_force
from pacs.eval.registry import get_metric
from pacs.metric.common.config import from_dict
from pacs.metric.common.config_files import packaged_config
from pacs.metric.common.errors import InputError
from pacs.metric.common.suggest import MAX_LISTED, close_matches, did_you_mean, known_hint
from pacs.rewards.registry import parse_reward_spec


def test_close_matches_and_hint():
    """difflib's matches, case-insensitive and spelled as known; the list only when short or nothing is close."""
    assert close_matches("Eval_Evry", ["eval_every", "save_every", "seed"]) == ["eval_every", "save_every"]
    assert did_you_mean("cidr", ["cider", "clip-s"]) == "did you mean 'cider'?"
    assert did_you_mean("zzz", ["cider", "clip-s"]) == ""
    assert known_hint("cidr", ["cider", "clip-s"]) == "(did you mean 'cider'? known: cider, clip-s)"
    assert known_hint("zzz", ["cider", "clip-s"]) == "(known: cider, clip-s)"
    many = [f"key_{i}" for i in range(MAX_LISTED)] + ["learning_rate"]
    assert known_hint("learning_rat", many) == "(did you mean 'learning_rate'?)"


def _message(call, *args) -> str:
    with pytest.raises(InputError) as caught:
        call(*args)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_config_key():
    """A typo of an XE key names the key it meant and not the other 30-odd keys."""
    message = _message(from_dict, XEConfig, {"eval_evry": 10}, "run.yaml")
    assert message == "run.yaml: unknown key 'eval_evry' (did you mean 'eval_every'?)"


def test_reward_metric_preset_and_stage_names():
    """Reward, metric, config preset and --force stage names."""
    assert "unknown reward 'cidr' in spec 'cidr:1' (did you mean 'cider'?" in _message(parse_reward_spec, "cidr:1")
    assert "unknown metric 'blue4' (did you mean 'bleu4'" in _message(get_metric, "blue4")
    assert "(did you mean 'demo_smoke'? available: " in _message(packaged_config, "demo_smok")  # presets all listed
    message = _message(check_force, ["scts-cider"], ["vocab", "xe", "scst-cider", "eval"])
    assert message == ("force= scts-cider: no such stage; did you mean 'scst-cider'?; the stages of this run are: "
                       "vocab, xe, scst-cider, eval")
    message = _message(check_force, ["zzz"], ["vocab", "xe"])
    assert message == "force= zzz: no such stage; the stages of this run are: vocab, xe"
