"""SCST with `scst.mix_normalisation: normalize_then_sum` (issue 34 item 4): the policy gradient learns from each
component normalised within the image's k samples; the option is checked and reaches the stage fingerprint."""
from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
import torch
from captioner_testkit import tiny_checkpoint, tiny_data

from pacs.captioner.modeling.train_scst import GUARD_FIELDS, SCSTConfig, guard_settings, train_scst
from pacs.captioner.orchestration.pipeline_config import PipelineConfig
from pacs.captioner.orchestration.stage_fingerprints import trainer_settings
from pacs.metric.common.config import from_dict, load_config
from pacs.metric.common.errors import InputError
from pacs.rewards.base import Reward, WeightedReward

torch.set_num_threads(1)
RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "configs" / "coco_vitb32_pac-spp.yaml"


def _words(image_ids, captions, references):
    return torch.tensor([[float(len(c.split())) for c in row] for row in captions])


def _overlap(image_ids, captions, references):
    return torch.tensor([[float(len(set(c.split()) & set(refs[0].split()))) for c in row]
                         for row, refs in zip(captions, references)])


def _z(row: list[float]) -> list[float]:
    """Plain-Python per-image normalisation: (x − mean) / (Bessel std + 1e-4), 0 for a flat row."""
    mean = sum(row) / len(row)
    if max(row) == min(row):
        return [0.0] * len(row)
    std = math.sqrt(sum((x - mean) ** 2 for x in row) / (len(row) - 1))
    return [(x - mean) / (std + 1e-4) for x in row]


def _hand_normalised(image_ids, captions, references):
    """The normalised mix words:1,overlap:0.5 written out by hand, as a plain (weighted-sum) reward."""
    words, overlap = _words(image_ids, captions, references), _overlap(image_ids, captions, references)
    return torch.tensor([[a + 0.5 * b for a, b in zip(_z(ra), _z(rb))]
                         for ra, rb in zip(words.tolist(), overlap.tolist())])


def _mix() -> WeightedReward:
    return WeightedReward("words:1,overlap:0.5", [("words", 1.0, Reward("words", _words)),
                                                   ("overlap", 0.5, Reward("overlap", _overlap))])


def _run(tmp_path: Path, out: str, reward, **overrides):
    cache, train, _ = tiny_data(tmp_path)
    init = tmp_path / "init"
    if not init.is_dir():
        tiny_checkpoint(tmp_path, dropout=0.1)
    config = SCSTConfig(output_dir=str(tmp_path / out), reward="mix", lr=1e-3, batch_size=8, micro_batch_size=8,
                        epochs=1, max_steps=2, k=3, save_every=100, trackers=[], samples="multinomial",
                        **overrides)
    items = list({image_id: [caption] for image_id, caption in train}.items())
    return train_scst(config, init, cache, items, reward)


def _log(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_scst_learns_from_the_normalised_components(tmp_path):
    normalised = _run(tmp_path, "norm", _mix(), mix_normalisation="normalize_then_sum")
    by_hand = _run(tmp_path, "hand", _hand_normalised)  # the same samples (same seed): the same first update
    summed = _run(tmp_path, "sum", _mix())
    assert normalised.losses[0] == pytest.approx(by_hand.losses[0], rel=1e-5, abs=1e-7)
    assert normalised.losses[1] == pytest.approx(by_hand.losses[1], rel=1e-4, abs=1e-6)
    assert summed.losses[0] != pytest.approx(normalised.losses[0], rel=1e-3)  # the option changes the gradient
    # log.csv keeps the weighted sum as the reward (comparable with a weighted-sum run); step 1 samples alike
    assert float(_log(tmp_path / "norm" / "log.csv")[0]["reward_mean"]) == \
        pytest.approx(float(_log(tmp_path / "sum" / "log.csv")[0]["reward_mean"]), rel=1e-6)


def test_the_option_is_checked_with_the_key_named():
    with pytest.raises(InputError, match=r"mix_normalisation='zscore': unknown aggregation of a mixed reward"):
        from_dict(SCSTConfig, {"mix_normalisation": "zscore"}, "scst")
    with pytest.raises(InputError, match="normalize_then_sum needs a baseline over the k samples"):
        from_dict(SCSTConfig, {"mix_normalisation": "normalize_then_sum", "baseline": "greedy"}, "scst")
    config = load_config(PipelineConfig, RECIPE, ["scst.mix_normalisation=normalize_then_sum"])
    assert config.scst.mix_normalisation == "normalize_then_sum"


def test_a_reward_built_normalised_needs_the_scst_key(tmp_path):
    reward = _mix()
    reward.mix_normalisation = "normalize_then_sum"  # build_reward(..., mix_normalisation="normalize_then_sum")
    with pytest.raises(InputError, match="built with mix_normalisation='normalize_then_sum' but "
                                         "scst.mix_normalisation='weighted_sum'"):
        _run(tmp_path, "mismatch", reward)


def test_the_option_reaches_the_stage_fingerprint_and_its_default_leaves_it_as_before():
    assert "mix_normalisation" in GUARD_FIELDS
    default = guard_settings(trainer_settings(SCSTConfig()))
    assert "mix_normalisation" not in default  # runs finished before the key existed stay done
    on = guard_settings(trainer_settings(SCSTConfig(mix_normalisation="normalize_then_sum")))
    assert on == {**default, "mix_normalisation": "normalize_then_sum"}  # changing it: another fingerprint


def test_a_transformers_captioner_learns_from_the_normalised_components_too(tmp_path):
    """The same rule through the transformers policy (a tiny GIT): train_scst's one aggregation serves both kinds."""
    from pacs.captioner.modeling.hf_policy import HFPolicy, HFTrainOptions
    from tests.captioner.hf_tiny import build_git, coloured_images

    paths, refs = coloured_images(tmp_path / "images", 4)
    folder = build_git(tmp_path / "git")
    train = [(image_id, refs[image_id]) for image_id in paths]
    losses = {}
    for name, reward, normalisation in (("norm", _mix(), "normalize_then_sum"), ("hand", _hand_normalised,
                                                                                  "weighted_sum")):
        policy = HFPolicy.load(folder, paths, HFTrainOptions(), max_length=6)
        config = SCSTConfig(output_dir=str(tmp_path / name), reward="mix", lr=1e-3, batch_size=2, micro_batch_size=2,
                            samples="multinomial", k=3, max_length=6, max_steps=1, save_every=0, trackers=[],
                            seed=3, mix_normalisation=normalisation)
        losses[name] = train_scst(config, folder, None, train, reward, policy=policy).losses[0]
    assert losses["norm"] != 0.0  # some component varied within an image's samples: a real gradient
    assert losses["norm"] == pytest.approx(losses["hand"], rel=1e-5, abs=1e-7)
