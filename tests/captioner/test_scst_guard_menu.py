"""Issue 44's SCST guards, each against a hand computation: the length-conditional reward mask, the CIDEr-D anchor,
early stopping on the hacking monitor."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from captioner_testkit import overlap_reward, tiny_checkpoint, tiny_data
from safetensors.torch import load_file

from pacs.captioner.modeling.hacking_monitor import GamingThresholds, HackingMonitor
from pacs.captioner.modeling.scst_guards import (
    anchored_reward_spec,
    length_band_mask,
    mask_advantages,
    stop_point,
)
from pacs.captioner.modeling.train_scst import GUARD_FIELDS, SCSTConfig, compute_advantages, guard_settings, train_scst
from pacs.metric.common.errors import InputError
from pacs.rewards import build_reward

torch.set_num_threads(1)


def _scst(tmp_path: Path, out: str, steps: int, reward=overlap_reward, items=None, **overrides):
    cache, train, val = tiny_data(tmp_path)
    init = tmp_path / "init"
    if not init.is_dir():
        tiny_checkpoint(tmp_path, dropout=0.1)
    config = SCSTConfig(output_dir=str(tmp_path / out), reward="overlap", lr=1e-3, batch_size=8, micro_batch_size=8,
                        epochs=3, max_steps=steps, k=3, save_every=100, trackers=[], samples="multinomial")
    for key, value in overrides.items():
        setattr(config, key, value)
    items = items or list({image_id: [caption] for image_id, caption in train}.items())
    seen: dict[int, dict[str, torch.Tensor]] = {}

    def on_step(step, model):
        seen[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    return train_scst(config, init, cache, items, reward, on_step=on_step, validation=val), seen


# -- the length-conditional reward mask ---------------------------------------------------------------------------

def test_length_mask_zeroes_the_advantages_of_out_of_band_samples_by_hand():
    # references of 3 and 5 words, slack 1: the band is [2, 6]; captions of 1, 2, 6 and 7 words
    references = [["a red circle", "the red circle is big"]]
    captions = [["circle", "red circle", "a b c d e f", "a b c d e f g"]]
    in_band = length_band_mask(captions, references, slack=1)
    assert in_band.tolist() == [[False, True, True, False]]
    rewards = torch.tensor([[1.0, 2.0, 3.0, 4.0]])  # mean baseline 2.5: advantages -1.5, -0.5, 0.5, 1.5
    _, advantages, _ = compute_advantages(rewards, "mean")
    assert mask_advantages(advantages, in_band).tolist() == [[0.0, -0.5, 0.5, 0.0]]
    # slack 0: the band is [3, 5], so the 2- and 6-word captions leave it as well
    assert length_band_mask(captions, references, slack=0).tolist() == [[False, False, False, False]]


def test_length_mask_off_band_everywhere_gives_a_zero_loss_and_a_wide_band_changes_nothing(tmp_path):
    _, train, _ = tiny_data(tmp_path)
    long_refs = [(image_id, [" ".join(["word"] * 40)]) for image_id in dict(train)]  # no caption reaches 38 words
    masked, _ = _scst(tmp_path, "masked", 2, items=long_refs, length_mask=True, length_mask_slack=2)
    assert masked.losses == [0.0, 0.0]  # every advantage is 0: −mean(0 · log p) = 0
    plain, _ = _scst(tmp_path, "plain", 2)
    wide, _ = _scst(tmp_path, "wide", 2, length_mask=True, length_mask_slack=100)  # every sample in band
    assert wide.losses == plain.losses


# -- the CIDEr-D anchor ---------------------------------------------------------------------------------------------

def test_anchored_reward_spec_adds_one_cider_term():
    assert anchored_reward_spec("pac-s++", 0.5) == "pac-s++:1,cider:0.5"
    assert anchored_reward_spec("clip-s:1,pac-s++:0.5", 0.25) == "clip-s:1,pac-s++:0.5,cider:0.25"
    assert anchored_reward_spec("pac-s++", 0.0) == "pac-s++"
    with pytest.raises(InputError, match="already has a 'cider' term"):
        anchored_reward_spec("cider:1,pac-s++:0.5", 0.5)


def test_anchored_reward_is_the_reward_plus_weighted_cider():
    refs = {"a": ["a red circle on white", "the circle is red"], "b": ["a blue square", "the square is blue"]}
    train_refs = list(refs.values())
    captions = [["a red circle", "a a a red red circle circle circle"], ["a blue square", "blue"]]
    context = {"train_references": train_refs, "length_limit": 4}
    anchored = build_reward(anchored_reward_spec("length-penalty", 0.5), **context)
    penalty, cider = build_reward("length-penalty", **context), build_reward("cider", **context)
    got = anchored(list(refs), captions, list(refs.values()))
    expected = penalty(list(refs), captions, list(refs.values())) + 0.5 * cider(list(refs), captions, list(refs.values()))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    # the length penalty by hand: 0 and −(8 − 4) words for image a, 0 and 0 for image b
    torch.testing.assert_close(penalty(list(refs), captions, list(refs.values())), torch.tensor([[0.0, -4.0], [0.0, 0.0]]))


def test_cider_anchor_refuses_a_reward_without_the_term(tmp_path):
    with pytest.raises(InputError, match="cider_anchor=0.5: the reward has no cider:0.5 term"):
        _scst(tmp_path, "anchor", 1, cider_anchor=0.5)


# -- early stopping on the hacking monitor --------------------------------------------------------------------------

THRESHOLDS = GamingThresholds(reward_rise=0.0, rep_rise=0.5, length_rise=10.0, distinct_drop=10.0,
                              incorrect_rise=1000.0, cider_drop=10.0)


def _row(step, reward, rep2):
    return {"step": float(step), "reward": reward, "cider": 10.0, "length": 5.0, "rep1": 0.0, "rep2": rep2,
            "rep3": 0.0, "rep4": 0.0, "distinct1": 0.5, "distinct2": 0.5, "incorrect": 0.0, "grammar_errors": 0.0}


def test_stop_point_by_hand():
    # the reward rises at steps 2 and 4; Rep-2 drifts +0.1 (under 0.5) at step 2 and +0.9 at step 4: it fires at 4
    rows = [_row(0, 0.1, 0.0), _row(2, 0.15, 0.1), _row(4, 0.3, 0.9), _row(6, 0.4, 0.0)]
    assert stop_point(rows, THRESHOLDS) == (2, 4)
    # Rep-2 +0.9 without a reward rise is no gaming signature: nothing stops
    assert stop_point([_row(0, 0.1, 0.0), _row(2, 0.1, 0.9)], THRESHOLDS) == (2, 0)


def test_stop_on_gaming_stops_at_the_signature_and_keeps_the_step_before(tmp_path, monkeypatch):
    scripted = {0: _row(0, 0.1, 0.0), 2: _row(2, 0.15, 0.1), 4: _row(4, 0.3, 0.9), 6: _row(6, 0.4, 0.0)}
    monkeypatch.setattr(HackingMonitor, "score", lambda self, step, captions: dict(scripted[step]))
    thresholds = {f"monitor_{name}": value for name, value in (
        ("reward_rise", 0.0), ("rep_rise", 0.5), ("length_rise", 10.0), ("distinct_drop", 10.0),
        ("incorrect_rise", 1000.0), ("cider_drop", 10.0))}
    result, seen = _scst(tmp_path, "stop", 6, monitor_every=2, monitor_images=4, stop_on_gaming=True, **thresholds)
    assert (result.steps, result.kept_step, result.stopped_step) == (4, 2, 4)
    assert len(result.losses) == 4
    assert result.selected_dir == tmp_path / "stop" / "kept"
    kept = load_file(str(result.kept_dir / "model.safetensors"))
    at_step_2 = seen[2]
    assert all(torch.equal(kept[name], at_step_2[name]) for name in kept)  # the model of step 2, not 4
    final = load_file(str(result.final_dir / "model.safetensors"))
    assert any(not torch.equal(final[name], at_step_2[name]) for name in final)
    # a rerun in the same folder resumes the stopped run and trains nothing more
    again, _ = _scst(tmp_path, "stop", 6, monitor_every=2, monitor_images=4, stop_on_gaming=True, **thresholds)
    assert (again.steps, again.kept_step, again.stopped_step, again.losses) == (4, 2, 4, [])


def test_stop_on_gaming_needs_the_monitor_and_the_new_keys_stay_out_of_fingerprints_at_defaults():
    with pytest.raises(InputError, match="stop_on_gaming needs monitor_every > 0"):
        SCSTConfig(stop_on_gaming=True).check_guards()
    with pytest.raises(InputError, match="length_mask_slack=3 has no effect"):
        SCSTConfig(length_mask_slack=3).check_guards()
    for key in ("length_mask", "length_mask_slack", "cider_anchor", "stop_on_gaming"):
        assert key in GUARD_FIELDS
    settings = {"lr": 1e-6, "length_mask": False, "length_mask_slack": 2, "cider_anchor": 0.0, "stop_on_gaming": False}
    assert guard_settings(settings) == {"lr": 1e-6}
    assert guard_settings({**settings, "cider_anchor": 0.5})["cider_anchor"] == 0.5


def test_the_pipeline_builds_the_anchored_reward():
    from pacs.captioner.orchestration.pipeline_config import PipelineConfig
    from pacs.captioner.orchestration.pipeline_rewards import build_pipeline_reward

    config = PipelineConfig()
    config.scst.cider_anchor = 0.5
    reward = build_pipeline_reward("length-penalty", config, dataset_references={"a": ["a red circle"]},
                                   image_paths={})
    assert [(name, weight) for name, weight, _ in reward.components] == [("length-penalty", 1.0), ("cider", 0.5)]
