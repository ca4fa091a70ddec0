"""A recipe checks before it trains: every missing model, file, tool and folder in one error (exit 2) that names the
config key to set, before the run folder exists; only the reward models a stage uses are loaded; a stage that
never took a step is not "interrupted"; `${PACS_SHARED}` in a config is the environment's."""
from __future__ import annotations

import pytest
import yaml

from pacs.captioner.orchestration.pipeline import PipelineConfig
from pacs.captioner.orchestration.stages import StageRunner
from pacs.metric.common.config import expand_env, from_dict, load_config
from pacs.metric.common.errors import InputError
from pacs.metric.models.backbones import tiny_clip_config


def tiny(seed: int, family: str = "") -> dict:
    """A seeded tiny random model source."""
    return {"random_config": tiny_clip_config(), "random_seed": seed, "family": family}


def _write(tmp_path, config: dict):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _bad_config(tmp_path) -> dict:
    return {"run_dir": str(tmp_path / "run"),
            "data": {"name": "flickr8k", "path": "${PACS_SHARED}/data/flickr8k"},
            "features": {"source": tiny(0)},
            "rewards": ["cider", "pac-s++"],
            "reward_models": {"pac": {"checkpoint": str(tmp_path / "missing" / "PAC++_clip_ViT-B-32.pth")},
                              "pacs": {"checkpoint": str(tmp_path / "missing" / "clip_ViT-B-32.pth")}},
            "evaluation": {"text_metrics": ["bleu4", "meteor"], "contrastive_models": ["pac"],
                           "test_sets": {"flickr8k": {"name": "flickr8k", "path": "${PACS_SHARED}/data/flickr8k"}}}}


def test_every_problem_is_listed_in_one_error_before_any_folder_exists(tmp_path, monkeypatch, capsys):
    from pacs.cli import main

    monkeypatch.setattr("pacs.eval.java_metrics.java_executable", lambda: None)  # no Java on this machine
    loaded = []
    monkeypatch.setattr("pacs.captioner.orchestration.pipeline_rewards.load_source_backbone",
                        lambda *a, **k: loaded.append(a))
    code = main(["train", "--config", str(_write(tmp_path, _bad_config(tmp_path)))])
    err = capsys.readouterr().err
    head = f"pacs train: error: run {tmp_path / 'run'}: the run cannot start (2 problems, nothing was written): (1) "
    assert code == 2 and err.startswith(head) and len(err.strip().splitlines()) == 1
    problems = err[len(head) - 4:].strip().split(" (2) ")
    assert len(problems) == 2
    assert problems[0].startswith(f"(1) reward_models.pac.checkpoint: {tmp_path / 'missing' / 'PAC++_clip_ViT-B-32.pth'}"
                                  " not found; set reward_models.pac.checkpoint")
    assert problems[0].endswith("(used by reward pac-s++, the evaluation's PAC-S++ columns);")
    assert problems[1].startswith("evaluation.text_metrics: metric meteor needs Java")
    # the unused models (pacs: no reward, not an evaluation column; clip's default ViT-B-32/openai) are not checked
    assert "reward_models.pacs" not in err and "ViT-B-32/openai" not in err and loaded == []
    assert not (tmp_path / "run").exists()


def test_a_default_model_that_is_not_available_offline_names_the_keys_that_fix_it(tmp_path, monkeypatch):
    from pacs.captioner.orchestration.preflight import preflight_problems

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "cache" / "hub"))
    data = _bad_config(tmp_path)
    data["reward_models"] = {"pac": tiny(1, "pac-s++")}  # clip keeps its default, ViT-B-32/openai
    data["evaluation"] = {"text_metrics": ["bleu4"]}  # every model named is an evaluation column
    config = from_dict(PipelineConfig, expand_env(data), "test")
    problems = preflight_problems(config)
    assert len(problems) == 1
    assert problems[0].startswith("reward_models.clip.backbone: pretrained weights ViT-B-32/openai are not available "
                                  "offline")
    assert problems[0].endswith("set reward_models.clip.backbone=ViT-B-32/PATH_TO_FILE (a local copy of the weights) "
                                "or reward_models.clip.checkpoint (used by the evaluation's CLIP-S columns); or leave "
                                "its columns out with evaluation.contrastive_models=[pac]")


def test_only_the_reward_models_a_reward_uses_are_loaded(tmp_path, monkeypatch):
    from pacs.captioner.orchestration import pipeline_rewards

    config = from_dict(PipelineConfig, {"run_dir": str(tmp_path / "run"), "rewards": ["cider", "pac-s++"],
                                        "reward_models": {"clip": tiny(3), "pac": tiny(1, "pac-s++"),
                                                          "pacs": tiny(2, "pac-s")}}, "test")
    loaded = []
    real = pipeline_rewards.load_source_backbone
    monkeypatch.setattr(pipeline_rewards, "load_source_backbone",
                        lambda source, *a: loaded.append(source.random_seed) or real(source, *a))
    assert "scorers" not in pipeline_rewards.reward_context(config, {}, {}, spec="cider") and loaded == []
    context = pipeline_rewards.reward_context(config, {}, {}, spec="cider:1,ref-pac-s++:0.5")
    assert loaded == [1] and {name for name in context["scorers"] if "pac" in name} == {"pac-s++", "ref-pac-s++"}


def test_a_stage_that_never_took_a_step_starts_over_under_other_settings(tmp_path):
    checkpoints = tmp_path / "run" / "scst" / "checkpoints"
    first = StageRunner(tmp_path / "run")
    assert first.begin("scst", {"lr": 1}, resumable=True, progress=checkpoints) == "ran"  # then it failed
    again = StageRunner(tmp_path / "run")
    assert again.begin("scst", {"lr": 2}, resumable=True, progress=checkpoints) == "ran"
    (checkpoints / "step-00000004").mkdir(parents=True)  # this start took steps: other settings are refused
    with pytest.raises(InputError, match="stage scst was interrupted under other settings .*lr 2 -> 3"):
        StageRunner(tmp_path / "run").begin("scst", {"lr": 3}, resumable=True, progress=checkpoints)


def test_environment_variables_in_config_values(monkeypatch):
    monkeypatch.setenv("PACS_TEST_ROOT", "/data/here")
    monkeypatch.delenv("PACS_TEST_UNSET", raising=False)
    data = {"data": {"path": "${PACS_TEST_ROOT}/flickr8k", "options": {"x": ["$${PACS_TEST_ROOT}", 3]}}}
    assert expand_env(data) == {"data": {"path": "/data/here/flickr8k", "options": {"x": ["${PACS_TEST_ROOT}", 3]}}}
    with pytest.raises(InputError, match=r"^f.yaml: data.path='\$\{PACS_TEST_UNSET\}/x': the environment variable "
                                         r"PACS_TEST_UNSET is not set \(export PACS_TEST_UNSET=..., or set data.path"):
        expand_env({"data": {"path": "${PACS_TEST_UNSET}/x"}}, "f.yaml")


def test_an_override_replaces_a_value_whose_variable_is_unset(tmp_path, monkeypatch):
    monkeypatch.delenv("PACS_TEST_UNSET", raising=False)
    path = _write(tmp_path, {"run_dir": "${PACS_TEST_UNSET}/run"})
    assert load_config(PipelineConfig, path, [f"run_dir={tmp_path}/r"]).run_dir == f"{tmp_path}/r"
    with pytest.raises(InputError, match="PACS_TEST_UNSET is not set"):
        load_config(PipelineConfig, path)


def test_the_vitb32_recipe_names_the_three_files_to_set_and_accepts_them_once_set(tmp_path, monkeypatch):
    from pacs.captioner.orchestration.preflight import preflight_problems

    monkeypatch.chdir(tmp_path)  # the recipe's relative model paths resolve here: nothing there
    monkeypatch.setattr("pacs.eval.java_metrics.java_executable", lambda: "java")  # METEOR's Java, found
    config = load_config(PipelineConfig, "flickr8k_vitb32", [f"run_dir={tmp_path / 'run'}"])
    assert [line.split(":")[0] for line in preflight_problems(config)] == [
        "features.source.backbone", "reward_models.clip.backbone", "reward_models.pac.checkpoint"]
    (tmp_path / "w").mkdir()
    for name in ("vitb32.bin", "PAC++_clip_ViT-B-32.pth"):
        (tmp_path / "w" / name).write_bytes(b"weights")
    spec = f"ViT-B-32/{tmp_path / 'w' / 'vitb32.bin'}"
    config = load_config(PipelineConfig, "flickr8k_vitb32", [
        f"run_dir={tmp_path / 'run'}", f"features.source.backbone={spec}", f"reward_models.clip.backbone={spec}",
        f"reward_models.pac.checkpoint={tmp_path / 'w' / 'PAC++_clip_ViT-B-32.pth'}"])
    assert preflight_problems(config) == []


@pytest.mark.parametrize("section, key, value", [
    ("reward_models.pac", "checkpoint", "PAC++_clip_ViT-B-32.pth"),
    ("features.source", "checkpoint", "clip_ViT-B-32.pth"),
    ("features.source", "backbone", "ViT-L-14/openai"),
])
def test_a_model_source_with_two_origins_is_refused_naming_both(section, key, value, tmp_path, capsys):
    """The Flickr8k recipe copied and pointed at a real file: random_config would win without a word, so a user
    would publish numbers of a model they never loaded; the run refuses before anything exists instead."""
    from pacs.cli import main

    given = tmp_path / value
    if key == "checkpoint":
        given.write_bytes(b"weights")
    code = main(["train", "--config", "flickr8k_tiny", f"run_dir={tmp_path / 'run'}",
                 f"{section}.{key}={given if key == 'checkpoint' else value}"])
    err = capsys.readouterr().err
    shown = given if key == "checkpoint" else value
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert (f"{section}: two origins for one model: {section}.random_config (a random model) and "
            f"{section}.{key}={shown}; keep one") in err
    assert not (tmp_path / "run").exists()
    # the advice works: `random_config={}` clears the preset's random model (an empty mapping replaces)
    advised = load_config(PipelineConfig, "flickr8k_tiny", [f"run_dir={tmp_path / 'run'}",
                                                            f"{section}.{key}={given if key == 'checkpoint' else value}",
                                                            f"{section}.random_config={{}}"])
    source = advised.features.source if section == "features.source" else advised.reward_models.pac
    assert source.random_config == {} and getattr(source, key) == (str(given) if key == "checkpoint" else value)
