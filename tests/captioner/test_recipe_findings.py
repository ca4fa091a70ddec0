"""A recipe's reward gains and findings (`pacs.captioner.orchestration.recipe_findings`), by the demo's rules."""
from __future__ import annotations

import numpy as np
import pytest

from pacs.captioner.orchestration.recipe_findings import reward_findings
from pacs.eval.finding_claims import CLAIM_REWARD_RISES
from pacs.eval.intervals import StratifiedBootstrap

IDS = [f"i{k}" for k in range(6)]


def _values(c: list[float], clip: list[float]) -> dict:
    return {"image_ids": IDS, "values": {"C": c, "CLIP-S": clip}}


XE = _values([10.0, 20.0, 30.0, 40.0, 50.0, 60.0], [0.50, 0.55, 0.60, 0.65, 0.70, 0.75])
MIX = _values([14.0, 22.0, 31.0, 47.0, 52.0, 66.0], [0.40, 0.50, 0.50, 0.60, 0.70, 0.70])


def test_a_mix_gain_is_its_weighted_terms_on_their_reward_scales():
    """cider:1,clip-s:2 on CIDEr-D (the C column / 100) and CLIP-S, computed here by hand."""
    found = reward_findings({7: {("xe", "coco"): XE, ("cider:1,clip-s:2", "coco"): MIX}}, [("cider:1,clip-s:2",) * 2],
                            300, 0)
    (gain,) = found["reward_gains"]

    def reward(v: dict) -> np.ndarray:
        return np.asarray(v["values"]["C"]) / 100 + 2 * np.asarray(v["values"]["CLIP-S"])

    assert gain["xe"] == pytest.approx(reward(XE).mean(), abs=1e-12)
    assert gain["scst"] == pytest.approx(reward(MIX).mean(), abs=1e-12)
    assert gain["delta"] == pytest.approx((reward(MIX) - reward(XE)).mean(), abs=1e-12)
    expected = StratifiedBootstrap(1, len(IDS), 300, 0).mean_difference(reward(MIX)[None], reward(XE)[None])
    assert gain["ci"] == pytest.approx(list(expected.interval), abs=1e-12)
    (record,) = found["findings"]  # the mix falls (CLIP-S weighs twice): "does not rise"
    assert record["claim"] == CLAIM_REWARD_RISES and record["holds"] is False and expected.interval[1] < 0
    assert record["seeds"] == {"7": record["holds"]}
    assert found["replication"]["claims"] == 1


def test_seeds_pool_per_test_set_and_a_reward_without_a_column_gets_no_gain():
    up = _values([11.0, 21.0, 32.0, 41.0, 53.0, 61.0], XE["values"]["CLIP-S"])
    by_seed = {seed: {("xe", name): XE for name in ("coco", "nocaps")} | {("cider", name): up
                                                                         for name in ("coco", "nocaps")}
               | {("ref-pac-s++", "coco"): up} for seed in (0, 1)}
    found = reward_findings(by_seed, [("cider", "cider"), ("ref-pac-s++", "ref-pac-s++")], 200, 3)
    assert [(g["model"], g["test_set"]) for g in found["reward_gains"]] == [("cider on coco", "coco"),
                                                                            ("cider on nocaps", "nocaps")]
    for gain in found["reward_gains"]:  # +1, +1, +2, +1, +3, +1 CIDEr-D points in both seeds: 0.015 on its scale
        assert gain["delta"] == pytest.approx(9 / 6 / 100, abs=1e-12) and gain["per_seed"] == pytest.approx(
            [9 / 6 / 100] * 2, abs=1e-12)
    texts = [r["text"] for r in found["findings"]]
    assert texts[0].startswith(f"cider on coco: {CLAIM_REWARD_RISES} (reward +0.015 [")
    assert "per seed 0: +0.015, 1: +0.015" in texts[0]
    assert reward_findings(by_seed, [("ref-pac-s++", "ref-pac-s++")], 200, 3) == {}  # no RefPAC-S++ values: no gain, no finding


def test_a_transformers_run_without_xe_takes_its_gains_against_init():
    """Baseline `init` (a transformers run with `captioner.xe: false`): the gain is against the init row, keyed by
    it, and an `xe` row, if one were there, is ignored."""
    other = _values([0.0] * 6, [0.0] * 6)  # an unrelated row named xe: nothing is taken against it
    found = reward_findings({0: {("init", "coco"): XE, ("xe", "coco"): other, ("cider", "coco"): MIX}},
                            [("cider", "cider")], 300, 0, baseline="init")
    (gain,) = found["reward_gains"]
    c_init, c_mix = np.asarray(XE["values"]["C"]) / 100, np.asarray(MIX["values"]["C"]) / 100
    assert gain["baseline"] == "init" and "xe" not in gain
    assert gain["init"] == pytest.approx(c_init.mean(), abs=1e-12)
    assert gain["delta"] == pytest.approx((c_mix - c_init).mean(), abs=1e-12)
    expected = StratifiedBootstrap(1, len(IDS), 300, 0).mean_difference(c_mix[None], c_init[None])
    assert gain["ci"] == pytest.approx(list(expected.interval), abs=1e-12)
    (record,) = found["findings"]
    assert record["claim"] == CLAIM_REWARD_RISES and record["holds"] is (expected.interval[0] > 0)
    assert reward_findings({0: {("init", "coco"): XE, ("cider", "coco"): MIX}}, [("cider", "cider")], 300, 0) == {}
