"""A reward that never varies within the k samples is loud: counted per step (log.csv, monitor.csv), warned once
naming the reward and its likely cause, and recorded in the SCST result (the stage summary's flag)."""
from __future__ import annotations

import csv
import logging
import math
from pathlib import Path

import pytest
import torch
from captioner_testkit import overlap_reward, tiny_checkpoint, tiny_data

from pacs.captioner.modeling.reward_spread import SpreadWatch, likely_cause, spread_counts
from pacs.captioner.modeling.train_scst import SCSTConfig, train_scst

torch.set_num_threads(1)


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _scst(tmp_path: Path, out: str, reward, steps: int = 4, **overrides):
    cache, train, val = tiny_data(tmp_path)
    if not (tmp_path / "init").is_dir():
        tiny_checkpoint(tmp_path, dropout=0.1)
    config = SCSTConfig(output_dir=str(tmp_path / out), reward="flat", lr=1e-3, batch_size=8, micro_batch_size=4,
                        epochs=3, max_steps=steps, k=3, save_every=100, trackers=[], samples="multinomial",
                        degenerate_window=3, monitor_every=2, monitor_images=4)
    for key, value in overrides.items():
        setattr(config, key, value)
    items = list({image_id: [caption] for image_id, caption in train}.items())
    return train_scst(config, tmp_path / "init", cache, items, reward, validation=val)


def test_spread_counts_by_hand():
    rewards = torch.tensor([[0.0, 0.0, 0.0],      # zero spread, every score 0, two different captions
                            [0.4, 0.4, 0.4],      # zero spread, one caption three times
                            [0.2, 0.9, 0.2],      # varies
                            [float("nan"), 0.3, 0.3]])  # the finite ones agree: zero spread
    captions = [["a dog", "a cat", "a dog"], ["red", "red ", "red"], ["x", "y", "x"], ["p", "q", "r"]]
    assert spread_counts(rewards, captions) == {"images": 4, "zero_spread": 3, "all_zero": 1, "identical": 1}


def test_the_likely_cause_follows_the_counts():
    all_zero = {"zero_spread": 10, "all_zero": 6, "identical": 9}
    assert "every sample scored exactly 0: a contrastive reward is w·max(cos, 0)" in likely_cause(all_zero, 3,
                                                                                                 "cider:1,clip-s:1")
    assert likely_cause(all_zero, 3, "cider").startswith("every sample scored exactly 0 (for cider: no n-gram")
    assert "scst.k=1" in likely_cause({"zero_spread": 10, "all_zero": 0, "identical": 10}, 1)
    assert "are one caption" in likely_cause({"zero_spread": 10, "all_zero": 0, "identical": 5}, 3)
    assert "constant or saturated" in likely_cause({"zero_spread": 10, "all_zero": 1, "identical": 2}, 3)


def test_the_watch_warns_once_when_the_window_mean_passes_the_threshold():
    watch = SpreadWatch("clip-s", k=3, window=3, threshold=0.5, total_steps=100)
    counts = [(8, 8), (8, 2), (8, 6), (8, 8), (8, 8)]  # fractions 1, .25, .75, 1, 1
    said = [watch.update(step, {"images": n, "zero_spread": z, "all_zero": z}) for step, (n, z) in
            enumerate(counts, start=1)]
    # windows: steps 1-3 mean 2/3 > .5: warned at step 3, never again
    assert said[:2] == [None, None] and said[3:] == [None, None]
    assert said[2].startswith("reward 'clip-s' is degenerate: over steps 1-3 its spread within the k=3 samples "
                              "was zero for 67% of the images")
    assert watch.fraction == pytest.approx((8 + 2 + 6 + 8 + 8) / 40)
    resumed = SpreadWatch("clip-s", 3, 3, 0.5, 100, watch.state())
    assert resumed.warning == said[2] and resumed.fraction == watch.fraction
    short = SpreadWatch("cider", k=3, window=10, threshold=0.5, total_steps=2)  # a run shorter than the window
    assert short.update(1, {"images": 4, "zero_spread": 1}) is None
    assert short.update(2, {"images": 4, "zero_spread": 1}) is None  # mean .25
    assert short.summary() == {"zero_spread_fraction": 0.25, "degenerate_reward": False, "degenerate_warning": None}


def test_a_constant_reward_triggers_the_warning_in_log_monitor_and_result(tmp_path, caplog):
    def flat(image_ids, captions, references):  # w·max(cos, 0) of a reward model whose cosines are all <= 0
        return torch.zeros(len(captions), len(captions[0]))

    with caplog.at_level(logging.WARNING, logger="pacs.captioner.modeling.train_scst"):
        result = _scst(tmp_path, "flat", flat)
    warnings = [r.getMessage() for r in caplog.records if "degenerate" in r.getMessage()]
    assert len(warnings) == 1
    assert warnings[0].startswith("scst step 3: reward 'flat' is degenerate: over steps 1-3 its spread within the "
                                  "k=3 samples was zero for 100% of the images")
    assert "every sample scored exactly 0" in warnings[0]
    assert result.zero_spread_fraction == 1.0 and result.degenerate_warning == warnings[0][len("scst step 3: "):]
    assert [float(r["zero_spread"]) for r in _rows(tmp_path / "flat" / "log.csv")] == [1.0] * 4
    monitor = _rows(tmp_path / "flat" / "monitor.csv")
    assert [int(r["step"]) for r in monitor] == [0, 2, 4]
    assert math.isnan(float(monitor[0]["zero_spread"])) and [float(r["zero_spread"]) for r in monitor[1:]] == [1.0, 1.0]


def test_a_varying_reward_is_not_flagged(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="pacs.captioner.modeling.train_scst"):
        result = _scst(tmp_path, "varied", overlap_reward)
    assert not [r for r in caplog.records if "degenerate" in r.getMessage()]
    assert result.degenerate_warning is None
    fractions = [float(r["zero_spread"]) for r in _rows(tmp_path / "varied" / "log.csv")]
    assert result.zero_spread_fraction == pytest.approx(sum(fractions) / len(fractions))  # 8 images every step
    assert sum(fractions[-3:]) / 3 <= 0.5
