"""`seeds:` of a recipe and `recipes/compare_rewards.py --seeds`: the pipeline once per seed (features extracted
once), the rows pooled over seeds (real Flickr8k, tiny models)."""
from __future__ import annotations

import json
import runpy
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from captioner_testkit import tiny_pipeline_recipe

from pacs.captioner.entry import run_from_config
from pacs.captioner.orchestration.seed_runs import pool_rows
from pacs.eval.intervals import StratifiedBootstrap

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, shared_data: Path) -> dict:
    return tiny_pipeline_recipe(tmp_path / "run", shared_data / "flickr8k", max_images=3, bootstrap=30, seeds=[0, 1])


def _two_seeds(baseline: str) -> tuple[dict, dict]:
    """The rows and per-image values of two seeds of a baseline row and a cider row, on two images."""
    rows = {0: [{"model": baseline, "test_set": "t", "C": 10.0}, {"model": "cider", "test_set": "t", "C": 16.0}],
            1: [{"model": baseline, "test_set": "t", "C": 20.0}, {"model": "cider", "test_set": "t", "C": 22.0}]}
    per_image = {0: {(baseline, "t"): {"image_ids": ["a", "b"], "values": {"C": [5.0, 15.0]}},
                     ("cider", "t"): {"image_ids": ["a", "b"], "values": {"C": [12.0, 20.0]}}},
                 1: {(baseline, "t"): {"image_ids": ["a", "b"], "values": {"C": [18.0, 22.0]}},
                     ("cider", "t"): {"image_ids": ["a", "b"], "values": {"C": [20.0, 24.0]}}}}
    return rows, per_image


def test_pooled_rows_are_the_mean_over_seeds_and_the_stratified_interval_of_the_difference() -> None:
    rows, per_image = _two_seeds("xe")
    pooled = pool_rows(rows, per_image, 40, 3)
    assert [r["C"] for r in pooled] == [15.0, 19.0] and pooled[1]["per_seed"]["C"] == [16.0, 22.0]
    assert "ci" not in pooled[0]
    # by hand: the per-seed differences of the per-image means are 6 and 2, their mean 4
    assert pooled[1]["delta"]["C"] == pytest.approx(4.0) and pooled[1]["delta_per_seed"]["C"] == [6.0, 2.0]
    expected = StratifiedBootstrap(2, 2, 40, 3).mean_difference(np.array([[12.0, 20.0], [20.0, 24.0]]),
                                                                np.array([[5.0, 15.0], [18.0, 22.0]]))
    assert pooled[1]["ci"]["C"] == expected.interval
    low, high = pooled[1]["ci"]["C"]
    assert 0.0 <= low <= high <= 8.0  # every resample's difference is a mean of per-image differences in [0, 8]


def test_pooled_rows_of_a_run_without_xe_are_taken_against_init() -> None:
    """Baseline `init` (a transformers run with `captioner.xe: false`): the same numbers as against xe above."""
    rows, per_image = _two_seeds("init")
    pooled = pool_rows(rows, per_image, 40, 3, baseline="init")
    assert "ci" not in pooled[0]
    assert pooled[1]["delta"]["C"] == pytest.approx(4.0) and pooled[1]["delta_per_seed"]["C"] == [6.0, 2.0]
    expected = StratifiedBootstrap(2, 2, 40, 3).mean_difference(np.array([[12.0, 20.0], [20.0, 24.0]]),
                                                                np.array([[5.0, 15.0], [18.0, 22.0]]))
    assert pooled[1]["ci"]["C"] == expected.interval
    assert all("ci" not in row for row in pool_rows(rows, per_image, 40, 3))  # against xe: no such row, no interval


@pytest.mark.slow
def test_a_recipe_with_two_seeds_runs_once_per_seed_and_pools_the_rows(tmp_path, shared_data) -> None:
    config = tmp_path / "recipe.yaml"
    config.write_text(yaml.safe_dump(_config(tmp_path, shared_data)))
    result = run_from_config(str(config), [])
    run = tmp_path / "run"
    for seed in (0, 1):
        xe = json.loads((run / f"seed-{seed}" / "stages" / "xe.json").read_text())
        assert xe["settings"]["seed"] == seed
    # the second seed read the first seed's features instead of extracting them again
    features = json.loads((run / "seed-1" / "stages" / "features" / "train.json").read_text())
    assert features["settings"]["cache_dir"] == str(run / "seed-0" / "features" / "train")
    pooled = json.loads((run / "seeds" / "results.json").read_text())
    assert pooled["seeds"] == [0, 1] and pooled["bootstrap"]["seeds"] == 2
    assert {(r["seed"], r["model"]) for r in pooled["seed_rows"]} == {(s, m) for s in (0, 1) for m in ("xe", "cider")}
    per_seed = [json.loads((run / f"seed-{s}" / "eval" / "results.json").read_text())["rows"] for s in (0, 1)]
    for row in pooled["rows"]:  # every column: the mean of the two seeds' own tables
        mine = [next(r for r in rows if r["model"] == row["model"]) for rows in per_seed]
        for column in ("B-4", "CLIP-S", "RefCLIP-S", "Rep-1"):
            assert row[column] == pytest.approx((mine[0][column] + mine[1][column]) / 2), (row["model"], column)
    cider = next(r for r in pooled["rows"] if r["model"] == "cider")
    assert set(cider["ci"]) == {"CLIP-S", "RefCLIP-S"}  # the per-image columns this recipe computes
    xe = next(r for r in pooled["rows"] if r["model"] == "xe")
    assert cider["delta"]["CLIP-S"] == pytest.approx(cider["CLIP-S"] - xe["CLIP-S"], abs=1e-6)
    assert [r["model"] for r in result["rows"]] == [r["model"] for r in pooled["rows"]]

    # compare_rewards --seeds: the same runs (every stage cached), every seed's row kept in its results.json
    compare = runpy.run_path(str(REPO / "recipes" / "compare_rewards.py"), run_name="compare_rewards")
    assert compare["main"](["--config", str(config), "--reward", "cider", "--seeds", "0", "1"]) == 0
    table = json.loads((run / "compare_rewards" / "results.json").read_text())
    assert table["seeds"] == [0, 1] and len(table["seed_rows"]) == len(pooled["seed_rows"])
    assert [r["CLIP-S"] for r in table["rows"]] == [r["CLIP-S"] for r in pooled["rows"]]


def _stage_records(run: Path) -> dict[str, str]:
    return {str(path.relative_to(run)): path.read_text(encoding="utf-8")
            for path in sorted(run.glob("seed-*/stages/**/*.json")) if path.name != "hashes.json"}


@pytest.mark.slow
def test_seeds_in_parallel_processes_train_what_seeds_in_turn_train(tmp_path, shared_data) -> None:
    """`parallel_seeds: 2`: each seed in a spawned process (one torch thread each here, as the in-turn run), the
    first seed's features made before either starts; the same rows as seeds in turn, and a re-run in turn reuses
    every stage the processes recorded (the setting is in no fingerprint)."""
    rows = {}
    for name, parallel in (("in_turn", 1), ("parallel", 2)):
        recipe = _config(tmp_path / name, shared_data)
        recipe["parallel_seeds"] = parallel
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(recipe))
        run_from_config(str(path), [])
        rows[name] = json.loads((tmp_path / name / "run" / "seeds" / "results.json").read_text())["seed_rows"]
    assert rows["parallel"] == rows["in_turn"]
    run = tmp_path / "parallel" / "run"
    assert {p.name for p in (run / "logs").iterdir()} == {"seed-0.log", "seed-1.log"}
    for seed in (0, 1):  # each seed process's own log holds its pipeline's lines
        assert "pacs.captioner.orchestration.pipeline: pipeline: " in \
            (run / "logs" / f"seed-{seed}.log").read_text(encoding="utf-8")
    features = json.loads((run / "seed-1" / "stages" / "features" / "train.json").read_text())
    assert features["settings"]["cache_dir"] == str(run / "seed-0" / "features" / "train")
    before = _stage_records(run)
    run_from_config(str(tmp_path / "parallel.yaml"), ["parallel_seeds=1"])
    assert _stage_records(run) == before


@pytest.mark.slow
def test_recipe_runs_of_one_seed_each_pool_as_a_run_over_both_seeds(tmp_path, shared_data, capsys) -> None:
    """tools/pool_seeds.py on two single-seed recipe runs gives the rows `seeds: [0, 1]` gives; a run of other
    settings, a seed taken twice and an existing --out are refused in one line, exit 2, nothing written."""
    pool = runpy.run_path(str(REPO / "tools" / "pool_seeds.py"))["main"]

    def recipe(name: str) -> dict:  # C: the cider reward's own value, so its gain and finding are pooled too
        config = _config(tmp_path / name, shared_data)
        config["evaluation"]["text_metrics"] = ["bleu4", "cider"]
        return config

    both = recipe("both")
    (tmp_path / "both.yaml").write_text(yaml.safe_dump(both))
    run_from_config(str(tmp_path / "both.yaml"), [])
    for seed in (0, 1):
        single = recipe(f"s{seed}")
        single.update(seeds=[], seed=seed)
        (tmp_path / f"s{seed}.yaml").write_text(yaml.safe_dump(single))
        run_from_config(str(tmp_path / f"s{seed}.yaml"), [])
    out = tmp_path / "pooled"
    assert pool([str(tmp_path / "s0" / "run"), str(tmp_path / "s1" / "run"), "--out", str(out)]) == 0
    pooled = json.loads((out / "results.json").read_text())
    expected = json.loads((tmp_path / "both" / "run" / "seeds" / "results.json").read_text())
    assert pooled["rows"] == expected["rows"] and pooled["seeds"] == [0, 1]
    assert pooled["reward_gains"] == expected["reward_gains"] and pooled["findings"] == expected["findings"]
    assert json.loads((out / "pooled.json").read_text())["seeds"] == {
        "0": str(tmp_path / "s0" / "run"), "1": str(tmp_path / "s1" / "run")}
    capsys.readouterr()

    other = recipe("lr")
    other.update(seeds=[], seed=1)
    other["scst"]["lr"] = 1e-5
    (tmp_path / "lr.yaml").write_text(yaml.safe_dump(other))
    run_from_config(str(tmp_path / "lr.yaml"), [])
    capsys.readouterr()  # its training's bars
    for argv, message in (([str(tmp_path / "s0" / "run"), str(tmp_path / "lr" / "run")], "setting scst.lr differs"),
                          ([str(tmp_path / "s0" / "run"), str(tmp_path / "both" / "run") + ":0"],
                           "seed 0 is taken from both"),
                          ([str(tmp_path / "s0" / "run"), str(tmp_path / "s1" / "run")], "exists")):
        target = out if message == "exists" else tmp_path / "refused"
        assert pool([*argv, "--out", str(target)]) == 2
        error = capsys.readouterr().err
        assert message in error and len(error.strip().splitlines()) == 1, error
        assert not (tmp_path / "refused").exists()
    assert not list(tmp_path.glob(".refused.*")) and not list(tmp_path.glob(".pooled.*"))
