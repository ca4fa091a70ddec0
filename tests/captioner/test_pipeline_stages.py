"""Re-running a pipeline run directory: only the stages a change determines re-run (real Flickr8k, tiny models)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import yaml
from captioner_testkit import finished_stages, tiny_pipeline_recipe

from pacs.captioner.entry import run_from_config
from pacs.metric.common.errors import InputError

torch.set_num_threads(1)


def _config(tmp_path, shared_data) -> dict:
    return tiny_pipeline_recipe(tmp_path / "run", shared_data / "flickr8k")


@pytest.mark.slow
def test_changed_scst_lr_reruns_only_scst_and_its_evaluation(tmp_path, shared_data, caplog):
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump(_config(tmp_path, shared_data)))
    run = tmp_path / "run"
    run_from_config(str(config), [])
    first = finished_stages(run)
    assert set(first) == {"vocab", "features/train", "xe", "scst-cider", "features/flickr8k", "eval/xe/flickr8k",
                          "eval/cider/flickr8k"}

    with caplog.at_level(logging.INFO, logger="pacs.captioner.orchestration.stages"):
        run_from_config(str(config), ["scst.lr=1e-6"])
    second = finished_stages(run)
    changed = {name for name in first if first[name] != second[name]}
    assert changed == {"scst-cider", "eval/cider/flickr8k"}
    assert "stage scst-cider: re-running: scst.lr 5e-06 -> 1e-06" in caplog.messages
    assert "stage eval/cider/flickr8k: re-running: upstream scst-cider re-ran" in caplog.messages
    table = json.loads((run / "eval" / "results.json").read_text())
    assert [row["model"] for row in table["rows"]] == ["xe", "cider"]

    # an interrupted SCST (record left 'running', its checkpoint kept) with another lr is refused, untouched
    record_path = run / "stages" / "scst-cider.json"
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps(dict(record, status="running")))
    checkpoints = sorted(p.name for p in (run / "scst-cider" / "checkpoints").iterdir())
    with pytest.raises(InputError, match=r"scst-cider was interrupted .*scst\.lr 1e-06 -> 5e-06.*--force scst-cider"):
        run_from_config(str(config), ["scst.lr=5e-6"])
    assert sorted(p.name for p in (run / "scst-cider" / "checkpoints").iterdir()) == checkpoints
    # with its own settings it resumes (nothing else re-runs); --force xe re-runs XE and everything below it
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pacs.captioner.orchestration.stages"):
        run_from_config(str(config), ["scst.lr=1e-6"])
    third = finished_stages(run)
    assert {name for name in second if second[name] != third[name]} == {"scst-cider", "eval/cider/flickr8k"}
    assert "stage scst-cider: interrupted with the same settings, resuming" in caplog.messages
    run_from_config(str(config), ["scst.lr=1e-6"], force=["xe"])
    fourth = finished_stages(run)
    assert {name for name in third if third[name] != fourth[name]} == {"xe", "scst-cider", "eval/xe/flickr8k",
                                                                        "eval/cider/flickr8k"}
    with pytest.raises(InputError, match="force= scst: no such stage"):
        run_from_config(str(config), [], force=["scst"])


def test_pacs_train_refuses_unknown_force_and_unsplittable_batch_before_any_work(tmp_path, capsys):
    from pacs.cli import main

    smoke = str(Path(__file__).resolve().parents[2] / "recipes" / "configs" / "demo_smoke.yaml")
    assert main(["train", "--config", smoke, "--force", "scst", f"runs_dir={tmp_path}"]) == 2
    per_seed = ["xe", "scst-cider", "scst-clip-s", "scst-pac-s++", "scst-ref-pac-s++", "scst-cider_1_pac-s++_0.5",
                "scst-judge", "scst-cider_1_pac-s++_0.5-norm", "scst-clip-s-kl0.1"]  # once per training seed (seeds [0, 1])
    assert ("--force scst: no such stage; the stages of this run are: data, clip, pacs, correlation, features, "
            + ", ".join(f"seed-{seed}/{name}" for seed in (0, 1) for name in per_seed) + ", evaluate"
            ) in capsys.readouterr().err
    assert main(["train", "--config", smoke, "xe.batch_size=30", "xe.micro_batch_size=7", f"runs_dir={tmp_path}"]) == 2
    assert "demo.xe: batch_size=30 must be a multiple of micro_batch_size (7)" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing was written


@pytest.mark.slow
def test_a_precomputed_feature_cache_is_used_after_its_fingerprint_is_checked(tmp_path, shared_data):
    """`features.cache_dir`: features extracted elsewhere (here by a first run) are checked, not re-extracted, and
    give the same table; a cache of another backbone, or one missing images, is one clear error (issue 22)."""
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump(_config(tmp_path, shared_data)))
    first = run_from_config(str(config), [])
    elsewhere = tmp_path / "extracted"
    (tmp_path / "run" / "features").rename(elsewhere)  # as if another machine had extracted them
    second_run = tmp_path / "second"
    second = run_from_config(str(config), [f"run_dir={second_run}", f"features.cache_dir={elsewhere}"])
    assert second["rows"] == first["rows"]
    assert not (second_run / "features").exists()  # nothing extracted
    record = json.loads((second_run / "stages" / "features" / "train.json").read_text())
    assert record["summary"]["cache"] == str(elsewhere / "train")
    with pytest.raises(InputError, match=r"features.cache_dir: .*train/meta.json records features of backbone .* "
                                         r"but features.source is .*set features.source to the backbone"):
        run_from_config(str(config), [f"run_dir={tmp_path / 'third'}", f"features.cache_dir={elsewhere}",
                                      "features.source.random_seed=1"])
    shard = next((elsewhere / "flickr8k" / "shards").glob("*.safetensors"))
    shard.unlink()
    with pytest.raises(InputError, match=r"features.cache_dir: .*flickr8k lacks the features of \d+ image\(s\) of "
                                         r"set 'flickr8k'"):
        run_from_config(str(config), [f"run_dir={tmp_path / 'fourth'}", f"features.cache_dir={elsewhere}"])
