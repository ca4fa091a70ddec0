"""The pipeline's reward models: one per family (`reward_models.clip`, `.pacs` = PAC-S, `.pac` = PAC-S++);
pac-s / ref-pac-s rewards use the PAC-S model, a reward without its family's model is a config error before any
work, and a model whose established family contradicts its slot is refused."""
from __future__ import annotations

import pytest
import torch

from pacs.captioner.orchestration.pipeline import PipelineConfig, reward_context, reward_scorers, run_pipeline
from pacs.metric.common.config import from_dict
from pacs.metric.common.errors import InputError
from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
from pacs.metric.models.families import FamilyMismatchError

torch.set_num_threads(1)


def tiny(seed: int, family: str = "") -> dict:
    """A seeded tiny random reward model source (with its declared family)."""
    return {"backbone": "", "random_config": tiny_clip_config(), "random_seed": seed, "family": family}


def config(tmp_path, rewards: list[str], **models: dict) -> PipelineConfig:
    return from_dict(PipelineConfig, {"run_dir": str(tmp_path / "run"), "rewards": rewards,
                                      "reward_models": {"clip": tiny(3, "clip"), **models}}, "test")


def test_pac_s_reward_without_reward_models_pacs_is_a_config_error_before_any_work(tmp_path):
    for rewards in (["pac-s"], ["cider", "cider:1,ref-pac-s:0.5"]):
        with pytest.raises(InputError, match="needs a pac-s model: set reward_models.pacs"):
            run_pipeline(config(tmp_path, rewards, pac=tiny(1, "pac-s++")))  # data.path is empty: not reached
        assert not (tmp_path / "run").exists()


def test_pac_s_rewards_are_scored_by_the_pacs_model_not_the_pac_s_plus_plus_one(tmp_path):
    context = reward_context(config(tmp_path, ["pac-s"], pac=tiny(1, "pac-s++"), pacs=tiny(2, "pac-s")), {}, {})
    scorers = context["scorers"]
    fingerprint = {seed: build_backbone_from_config(tiny_clip_config(), seed=seed).fingerprint for seed in (1, 2, 3)}
    assert scorers["pac-s"].backbone.fingerprint == scorers["ref-pac-s"].backbone.fingerprint == fingerprint[2]
    assert scorers["pac-s++"].backbone.fingerprint == scorers["ref-pac-s++"].backbone.fingerprint == fingerprint[1]
    assert scorers["clip-s"].backbone.fingerprint == fingerprint[3]


def test_a_model_contradicting_its_slot_is_refused_unless_allowed(tmp_path):
    wrong = config(tmp_path, ["pac-s"], pacs=tiny(2, "pac-s++"))
    with pytest.raises(FamilyMismatchError, match="reward_models.pacs must be a pac-s model.*user --family"):
        reward_scorers(wrong)
    wrong.reward_models.allow_family_mismatch = True
    assert reward_scorers(wrong)["pac-s"].backbone.family == "pac-s++"


def test_reward_models_dtype_reaches_every_scorer_and_fp32_keeps_the_old_fingerprint(tmp_path):
    from pacs.captioner.orchestration.stage_fingerprints import reward_model_settings

    default = config(tmp_path, ["pac-s++"], pac=tiny(1, "pac-s++"))
    assert {scorer.dtype for scorer in reward_scorers(default).values()} == {"fp32"}
    assert "dtype" not in reward_model_settings(default.reward_models)  # a 0.2 run directory stays done
    half = from_dict(PipelineConfig, {"run_dir": str(tmp_path / "run"), "rewards": ["pac-s++"],
                                      "reward_models": {"clip": tiny(3, "clip"), "pac": tiny(1, "pac-s++"),
                                                        "dtype": "bf16"}}, "test")
    assert {scorer.dtype for scorer in reward_scorers(half).values()} == {"bf16"}
    assert reward_model_settings(half.reward_models)["dtype"] == "bf16"  # a changed precision re-runs SCST
    with pytest.raises(InputError, match="reward_models.dtype='fp8': expected fp32, bf16 or fp16"):
        from_dict(PipelineConfig, {"reward_models": {"dtype": "fp8"}}, "test")
