"""`pacs train --dry-run` (issue 42 item 7): the stages in order, each reused / run / resumed and why, the checks
that ran, and nothing written: the whole tree is snapshotted (paths, sizes, mtimes, contents) before and after.

The plan is then checked against what a real run does: the stages it said would run are the ones that run.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
import yaml
from captioner_testkit import finished_stages, tiny_pipeline_recipe

from pacs.captioner.entry import run_from_config
from pacs.cli import main

torch.set_num_threads(1)

STAGES = ["vocab", "features/train", "xe", "scst-cider", "features/flickr8k", "eval/xe/flickr8k",
          "eval/cider/flickr8k"]


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry below `root`: kind, size, mtime and (files) sha256."""
    out = {}
    for path in sorted(root.rglob("*")):
        stat = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
        out[str(path.relative_to(root))] = (path.is_dir(), stat.st_size if path.is_file() else 0,
                                            stat.st_mtime_ns, digest)
    return out


def dry_run(capsys, *args: str) -> tuple[int, list[tuple[str, str, str]], str]:
    """`pacs train --dry-run ARGS`: exit code, the stage lines as (verdict, stage, why), the whole output."""
    capsys.readouterr()
    code = main(["train", "--dry-run", *args])
    out = capsys.readouterr()
    lines = out.out.splitlines()
    start = lines.index("stages, in order:") + 1
    stages = []
    for line in lines[start:-1]:
        verdict, name, *why = line.split(maxsplit=2)
        stages.append((verdict, name, why[0] if why else ""))
    return code, stages, out.out + out.err


@pytest.fixture
def recipe(tmp_path, shared_data) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(tiny_pipeline_recipe(tmp_path / "run", shared_data / "flickr8k")))
    return path


def test_a_fresh_folder_plans_every_stage_and_writes_nothing(tmp_path, recipe, capsys):
    before = snapshot(tmp_path)
    code, stages, out = dry_run(capsys, "--config", str(recipe))
    assert code == 0
    assert snapshot(tmp_path) == before and not (tmp_path / "run").exists()
    assert [name for _, name, _ in stages] == STAGES
    assert stages[0] == ("run", "vocab", "no record: it has not run here")
    assert stages[2] == ("run", "xe", "upstream vocab, features/train re-run")
    assert stages[6] == ("run", "eval/cider/flickr8k", "upstream scst-cider, features/flickr8k re-run")
    assert {verdict for verdict, _, _ in stages} == {"run"}
    assert "preflight: every model, file, tool and folder (check_before_start)" in out
    assert "--force names (none) among the 7 stages (check_force)" in out
    assert out.splitlines()[-1] == "would run 7"


@pytest.mark.slow
def test_a_finished_run_with_one_changed_setting(tmp_path, recipe, capsys):
    run_from_config(str(recipe), [])
    first = finished_stages(tmp_path / "run")
    before = snapshot(tmp_path)

    code, stages, out = dry_run(capsys, "--config", str(recipe), "scst.lr=1e-6")
    assert code == 0 and snapshot(tmp_path) == before  # no lock, log, record, config.yaml or hash cache written
    assert stages == [
        ("reuse", "vocab", "finished with the same fingerprint, its outputs verified"),
        ("reuse", "features/train", "finished with the same fingerprint, its outputs verified"),
        ("reuse", "xe", "finished with the same fingerprint, its outputs verified"),
        ("run", "scst-cider", "re-running: scst.lr 5e-06 -> 1e-06"),
        ("reuse", "features/flickr8k", "finished with the same fingerprint, its outputs verified"),
        ("reuse", "eval/xe/flickr8k", "finished with the same fingerprint, its outputs verified"),
        ("run", "eval/cider/flickr8k", "upstream scst-cider re-runs")]
    assert out.splitlines()[-1] == "would run 2, reuse 5"

    code, stages, _ = dry_run(capsys, "--config", str(recipe), "xe.max_steps=3", "--force", "features/flickr8k")
    assert code == 0 and snapshot(tmp_path) == before
    assert [(verdict, name) for verdict, name, _ in stages] == [
        ("reuse", "vocab"), ("reuse", "features/train"), ("run", "xe"), ("run", "scst-cider"),
        ("run", "features/flickr8k"), ("run", "eval/xe/flickr8k"), ("run", "eval/cider/flickr8k")]
    assert stages[2][2] == "re-running: xe.max_steps 2 -> 3" and stages[4][2] == "re-running (--force)"

    # a truncated output is found by the plan's check of the outputs, as the run would find it
    (tmp_path / "run" / "vocab.json").write_text("{}")
    truncated = snapshot(tmp_path)
    _, stages, _ = dry_run(capsys, "--config", str(recipe))
    assert stages[0][:2] == ("run", "vocab") and "its outputs are not as it made them" in stages[0][2]
    assert snapshot(tmp_path) == truncated

    # the plan said what the run does: after restoring vocab, the changed lr re-runs exactly the stages it named
    run_from_config(str(recipe), [])
    second = finished_stages(tmp_path / "run")
    _, planned, _ = dry_run(capsys, "--config", str(recipe), "scst.lr=1e-6")
    run_from_config(str(recipe), ["scst.lr=1e-6"])
    third = finished_stages(tmp_path / "run")
    assert {name for name in second if second[name] != third[name]} == \
        {name for verdict, name, _ in planned if verdict == "run"} == {"scst-cider", "eval/cider/flickr8k"}
    assert first.keys() == third.keys()


def test_a_bad_config_is_still_one_line_and_exit_2(tmp_path, recipe, capsys):
    before = snapshot(tmp_path)
    assert main(["train", "--dry-run", "--config", str(recipe), "xe.eval_evry=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did you mean 'eval_every'?" in err[0]
    assert main(["train", "--dry-run", "--config", str(recipe), "--force", "scst-cidr"]) == 2
    assert "did you mean 'scst-cider'?" in capsys.readouterr().err
    assert snapshot(tmp_path) == before


def test_several_seeds_plan_each_seed_folder(tmp_path, recipe, capsys):
    before = snapshot(tmp_path)
    capsys.readouterr()
    assert main(["train", "--dry-run", "--config", str(recipe), "seeds=[0,1]"]) == 0
    out = capsys.readouterr().out
    assert snapshot(tmp_path) == before
    assert f"seed 0: dry run of {tmp_path / 'run' / 'seed-0'} (nothing written)" in out
    assert f"seed 1: dry run of {tmp_path / 'run' / 'seed-1'} (nothing written)" in out
    # seed 1 reads seed 0's features (features.cache_dir), made earlier in the same run: not checked, they run
    assert ("  run     features/train       its features are seed 0's, which this run makes first "
            "(features/train, features/flickr8k)") in out.splitlines()


def test_the_plan_says_resume_and_refused_as_the_run_would(tmp_path):
    from pacs.captioner.orchestration.stages import StageRunner

    runner = StageRunner(tmp_path / "run")
    runner.begin("xe", {"lr": 1}, resumable=True)  # interrupted: begun, never finished
    (tmp_path / "run" / "xe" / "checkpoints" / "step-1").mkdir(parents=True)
    before = snapshot(tmp_path)
    plan = StageRunner(tmp_path / "run", planning=True)
    assert plan.plan("xe", {"lr": 1}, resumable=True, progress=tmp_path / "run" / "xe" / "checkpoints") == "resume"
    assert plan.plan("scst", {"k": 2}, upstream=["xe"]) == "run"
    other = StageRunner(tmp_path / "run", planning=True)
    assert other.plan("xe", {"lr": 2}, resumable=True, progress=tmp_path / "run" / "xe" / "checkpoints") == "refused"
    assert plan.planned == [("xe", "resume", "interrupted with the same settings, resuming"),
                            ("scst", "run", "upstream xe re-runs")]
    assert other.planned[0][2].startswith("stage xe was interrupted under other settings and cannot resume with "
                                          "these (lr 1 -> 2)")
    assert snapshot(tmp_path) == before
    assert StageRunner(tmp_path / "fresh", planning=True).plan("a", {}) == "run"
    assert not (tmp_path / "fresh").exists()


@pytest.mark.slow
def test_a_transformers_run_is_planned_too(tmp_path, shared_data, capsys):
    from tests.captioner.hf_tiny import build_git
    from tests.captioner.test_hf_pipeline import _recipe

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(_recipe(tmp_path, shared_data, build_git(tmp_path / "git"))))
    before = snapshot(tmp_path)
    _, stages, _ = dry_run(capsys, "--config", str(recipe))
    assert snapshot(tmp_path) == before
    assert stages == [("run", "xe", "no record: it has not run here"), ("run", "scst-cider", "upstream xe re-runs"),
                      ("run", "eval/xe/flickr8k", "upstream xe re-runs"),
                      ("run", "eval/cider/flickr8k", "upstream scst-cider re-runs")]
    run_from_config(str(recipe), [])
    before = snapshot(tmp_path)
    _, stages, _ = dry_run(capsys, "--config", str(recipe), "scst.lr=1e-4")
    assert snapshot(tmp_path) == before
    assert [(verdict, name) for verdict, name, _ in stages] == [
        ("reuse", "xe"), ("run", "scst-cider"), ("reuse", "eval/xe/flickr8k"), ("run", "eval/cider/flickr8k")]
    assert stages[1][2] == "re-running: scst.lr 0.001 -> 0.0001"
