"""`pacs train` with `captioner: {kind: transformers, checkpoint: FOLDER}` (issue 34 item 1): real Flickr8k, a
tiny random GIT folder: XE, SCST (KL guard, monitor, selection by validation CIDEr-D), evaluation; a re-run skips
every stage (fingerprints), and a recipe without the checkpoint is one clear error."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml
from captioner_testkit import finished_stages, tiny_clip_source, tiny_pipeline_recipe

from pacs.captioner.entry import run_from_config
from pacs.metric.common.errors import InputError
from tests.captioner.hf_tiny import build_git

torch.set_num_threads(1)


def _recipe(tmp_path, shared_data, folder) -> dict:
    """The tiny recipe with a transformers captioner (no vocabulary, no captioner model section)."""
    return tiny_pipeline_recipe(
        tmp_path / "run", shared_data / "flickr8k",
        captioner={"kind": "transformers", "checkpoint": str(folder)},
        data={"name": "flickr8k", "path": str(shared_data / "flickr8k"), "max_train_images": 4, "max_val_images": 2},
        features={"source": tiny_clip_source()}, vocab=None, model=None,
        xe={"max_steps": 2, "batch_size": 4, "micro_batch_size": 4, "eval_every": 2, "save_every": 1,
            "trackers": [], "schedule": {"warmup_steps": 1, "constant_until": 1, "decay_until": 2,
                                               "peak_lr": 1e-3, "final_lr": 1e-4}},
        scst={"batch_size": 2, "micro_batch_size": 2, "max_steps": 2, "k": 2, "lr": 1e-3, "samples": "multinomial",
              "max_length": 6, "save_every": 1, "trackers": [], "kl_coef": 0.1, "monitor_every": 1,
              "monitor_images": 2, "select_by": "cider"})


def test_transformers_captioner_runs_the_stages_and_a_rerun_skips_them(tmp_path, shared_data):
    folder = build_git(tmp_path / "git")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(_recipe(tmp_path, shared_data, folder)))
    run = tmp_path / "run"
    run_from_config(str(recipe), [])
    first = finished_stages(run)
    assert set(first) == {"xe", "scst-cider", "eval/xe/flickr8k", "eval/cider/flickr8k"}
    assert (run / "scst-cider" / "best" / "config.json").is_file()  # select_by cider: a transformers folder
    assert len((run / "scst-cider" / "monitor.csv").read_text().splitlines()) == 1 + 3  # steps 0, 1, 2
    rows = json.loads((run / "eval" / "results.json").read_text())["rows"]
    assert [r["model"] for r in rows] == ["xe", "cider"]
    run_from_config(str(recipe), [])
    assert finished_stages(run) == first  # same fingerprints: nothing re-ran


def test_transformers_kind_without_a_checkpoint_is_one_clear_error(tmp_path, shared_data):
    recipe = _recipe(tmp_path, shared_data, "")
    recipe["captioner"] = {"kind": "transformers"}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(InputError, match="captioner.checkpoint"):
        run_from_config(str(path), [])


def test_overrides_turn_flickr8k_tiny_into_a_transformers_run(tmp_path, shared_data, monkeypatch):
    """`captioner.kind=transformers captioner.checkpoint=FOLDER` on the packaged flickr8k_tiny recipe (shrunk)."""
    monkeypatch.setenv("PACS_SHARED", str(shared_data.parent))
    folder = build_git(tmp_path / "git")
    overrides = [f"run_dir={tmp_path / 'run'}", "captioner.kind=transformers", f"captioner.checkpoint={folder}",
                 "captioner.xe=false", "captioner.finetune=lora", "rewards=[cider]",
                 "data.max_train_images=4", "data.max_val_images=2", "evaluation.max_images=2",
                 "scst.max_steps=1", "scst.batch_size=2", "scst.micro_batch_size=2", "scst.k=2",
                 "scst.max_length=6", "scst.monitor_images=2", "scst.save_every=1"]
    run_from_config("flickr8k_tiny", overrides)
    run = tmp_path / "run"
    assert set(finished_stages(run)) == {"scst-cider", "eval/init/flickr8k", "eval/cider/flickr8k"}
    final = run / "scst-cider" / "final"
    assert (final / "adapter" / "adapter_config.json").is_file() and (final / "config.json").is_file()
    results = json.loads((run / "eval" / "results.json").read_text())
    assert [r["model"] for r in results["rows"]] == ["init", "cider"]
    # the reward's gain against init, from the two evaluation records' per-image CIDEr-D (on its scale, C / 100)
    c = {model: np.asarray(json.loads((run / "eval" / model / "flickr8k.json").read_text())
                           ["per_image"]["flickr8k"]["values"]["C"]) / 100 for model in ("init", "cider")}
    (gain,) = results["reward_gains"]
    assert gain["baseline"] == "init" and gain["init"] == pytest.approx(c["init"].mean(), abs=1e-12)
    assert gain["delta"] == pytest.approx((c["cider"] - c["init"]).mean(), abs=1e-12)
    assert [f["subject"] for f in results["findings"]] == ["cider"]
    assert "| model | reward | init | scst |" in (run / "eval" / "results.md").read_text()


def test_preflight_asks_no_feature_backbone_of_a_transformers_run(tmp_path, shared_data):
    """A transformers captioner reads the images: a missing features.source file is no problem for it."""
    from pacs.captioner.orchestration.pipeline_config import PipelineConfig
    from pacs.captioner.orchestration.preflight import preflight_problems
    from pacs.metric.common.config import from_dict

    recipe = _recipe(tmp_path, shared_data, build_git(tmp_path / "git"))
    recipe["features"] = {"source": {"backbone": f"ViT-B-32/{tmp_path / 'missing.bin'}"}}
    assert preflight_problems(from_dict(PipelineConfig, recipe, "recipe")) == []
    recipe["captioner"] = {"kind": "pacs"}
    assert any(line.startswith("features.source") for line in preflight_problems(from_dict(PipelineConfig, recipe,
                                                                                            "recipe")))
