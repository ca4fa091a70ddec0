"""The seeds of several finished recipe runs pooled as one (`tools/pool_seeds.py`, which pools demo runs too):
seeds trained in different run folders — more seeds added later, or seeds trained on several machines — give one
table over all of them, as `seeds:` would have (`seed_runs.pool_rows`, the reward gains and findings of
`recipe_findings`), into a new folder (results.json / .csv / .md, pooled.json naming each seed's run).

A source is a finished recipe run folder (one seed) or the folder of a run over `seeds:` (its `seed-<s>/`
folders); `RUN:S,S` takes some of its seeds. Pooling is refused, in one line naming the run and the setting, record
or file, unless it is the same experiment: every run's settings equal apart from where and how it ran
(`RUN_SETTINGS`), each seed taken once, every evaluation stage finished with the files it recorded and the same
settings in every run, every seed's test images the same. Nothing is re-scored: the pooled rows come from the
per-image values the evaluation stages recorded.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from pacs.captioner.orchestration.captioner_stages import captioner_kind
from pacs.captioner.orchestration.evaluation import row_columns
from pacs.captioner.orchestration.guarded_stages import reward_rows
from pacs.captioner.orchestration.pipeline_config import PipelineConfig, normalisation_pairs
from pacs.captioner.orchestration.recipe_findings import reward_findings
from pacs.captioner.orchestration.results_files import write_results
from pacs.captioner.orchestration.run_records import read_record
from pacs.captioner.orchestration.seed_runs import pool_rows, read_per_image
from pacs.captioner.orchestration.stage_outputs import manifest_problems
from pacs.eval.intervals import LEVEL, METHOD, point_name
from pacs.metric.common.config import from_dict, load_yaml, to_dict
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import write_json_atomic

RUN_SETTINGS = ("run_dir", "seed", "seeds", "parallel_seeds", "force", "device", "features.cache_dir")
"""The settings that may differ between pooled recipe runs: where and how a run ran, and its seed."""


def is_recipe_run(run_dir: Path) -> bool:
    """Whether `run_dir` is a recipe run (its config.yaml holds a recipe's keys only, no demo's) or a recipe run
    over `seeds:` (no config.yaml of its own, its `seed-<s>/` runs)."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return bool(_seed_folders(run_dir))
    data = load_yaml(path)
    return isinstance(data, dict) and set(data) <= {field.name for field in dataclasses.fields(PipelineConfig)}


def _seed_folders(run_dir: Path) -> dict[int, Path]:
    """{seed: folder} of the `seed-<s>/` run folders of a recipe run over `seeds:` (none: not such a run)."""
    found = {}
    for folder in sorted(run_dir.glob("seed-*")) if run_dir.is_dir() else []:
        seed = folder.name.removeprefix("seed-")
        if seed.lstrip("-").isdigit() and (folder / "config.yaml").is_file():
            found[int(seed)] = folder
    return found


def seed_runs(run_dir: Path, chosen: tuple[int, ...] = ()) -> dict[int, Path]:
    """{seed: its run folder} of a recipe run (a run over `seeds:`: each `seed-<s>/`), `chosen` ones only when given."""
    runs = _seed_folders(run_dir) if not (run_dir / "config.yaml").is_file() else {}
    if not runs:
        config = _config(run_dir)
        runs = {config.seed: run_dir}
    for seed in chosen:
        if seed not in runs:
            raise InputError(f"{run_dir}: has no seed {seed} (its seeds: {sorted(runs)})")
    return {seed: runs[seed] for seed in chosen} if chosen else runs


def _config(run_dir: Path) -> PipelineConfig:
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise InputError(f"{run_dir}: not a run directory (no config.yaml)")
    return from_dict(PipelineConfig, load_yaml(path), str(path))


def _trained(config: PipelineConfig) -> dict[str, Any]:
    """The settings that define the experiment (`RUN_SETTINGS` left out), flattened to dotted keys."""
    flat: dict[str, Any] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, dict) and value:
            for name, item in value.items():
                walk(item, f"{key}.{name}" if key else name)
        elif key not in RUN_SETTINGS:
            flat[key] = value

    walk(to_dict(config), "")
    return flat


def _finished_evaluations(run_dir: Path) -> dict[str, dict[str, Any]]:
    """Every `eval/...` stage record of a seed's run, verified (finished, naming its own stage, its files as it
    recorded them): {stage: settings}."""
    out = {}
    for path in sorted((run_dir / "stages" / "eval").glob("*/*.json")):
        stage = path.relative_to(run_dir / "stages").with_suffix("").as_posix()
        record = read_record(run_dir, stage)
        if record.get("status") != "finished" or record.get("stage") != stage:
            raise InputError(f"{path}: not the finished record of stage {stage}")
        manifest = record.get("outputs") or {}
        problems = manifest_problems(manifest, [run_dir / key for key in manifest], run_dir) if manifest else \
            ["no output files recorded"]
        if problems:
            raise InputError(f"{run_dir}: stage {stage} changed since it finished ({'; '.join(problems)})")
        out[stage] = record.get("settings")
    if not out:
        raise InputError(f"{run_dir}: no finished evaluation (not a finished run?)")
    return out


def pool_recipe_runs(sources: list[tuple[Path, tuple[int, ...]]], out: Path) -> dict[str, Any]:
    """Pool the seeds of `sources` ([(run folder, seeds taken or () for all)]) into the new folder `out`
    (written by the caller's work folder: `out` must not exist); the pooled results."""
    owner: dict[int, Path] = {}
    for run_dir, chosen in sources:
        for seed, folder in seed_runs(run_dir, chosen).items():
            if seed in owner:
                raise InputError(f"seed {seed} is taken from both {owner[seed]} and {folder}: each seed once")
            owner[seed] = folder
    seeds = sorted(owner)
    if len(seeds) < 2:
        raise InputError(f"{len(seeds)} seed to pool: pooling needs two seeds or more")
    configs = {seed: _config(owner[seed]) for seed in seeds}
    first = seeds[0]
    reference, evaluations = _trained(configs[first]), _finished_evaluations(owner[first])
    for seed in seeds[1:]:
        mine = _trained(configs[seed])
        key = next((k for k in sorted(set(reference) | set(mine)) if reference.get(k) != mine.get(k)), None)
        if key is not None:
            raise InputError(f"{owner[seed]}: setting {key} differs from {owner[first]} (only "
                             f"{', '.join(RUN_SETTINGS)} may differ between pooled runs)")
        found = _finished_evaluations(owner[seed])
        if set(found) != set(evaluations):
            raise InputError(f"{owner[seed]}: evaluated {sorted(found)}, {owner[first]} {sorted(evaluations)}")
        stage = next((s for s in evaluations if found[s] != evaluations[s]), None)
        if stage is not None:
            raise InputError(f"{owner[seed]}: stage {stage} was evaluated with other settings than in {owner[first]}")
    per_image = {seed: read_per_image(owner[seed]) for seed in seeds}
    for seed in seeds[1:]:
        for key, values in per_image[first].items():
            other = per_image[seed].get(key)
            if other is None or list(other["image_ids"]) != list(values["image_ids"]):
                raise InputError(f"{owner[seed]}: {key[0]} on {key[1]} is not scored on the test images of "
                                 f"{owner[first]}")
    rows_by_seed = {seed: json.loads((owner[seed] / "eval" / "results.json").read_text(encoding="utf-8"))["rows"]
                    for seed in seeds}
    config = configs[first]
    boot = config.evaluation.bootstrap
    baseline = captioner_kind(config).start  # xe, or a transformers run's init
    rows = pool_rows(rows_by_seed, per_image, boot, config.seed, baseline)
    columns = ["model", "test_set", *row_columns(rows)]
    results = {"columns": columns, "rows": rows, "seeds": seeds,
               "seed_rows": [dict(row, seed=seed) for seed, rows_of in rows_by_seed.items() for row in rows_of],
               "bootstrap": {"method": METHOD, "resamples": boot, "seeds": len(seeds), "point": point_name(len(seeds)),
                             "level": LEVEL},
               **reward_findings(per_image, reward_rows(config), boot, config.seed, baseline,
                                 normalisation_pairs(config))}
    write_results(out, results, columns)
    write_json_atomic(out / "pooled.json", {"seeds": {str(seed): str(owner[seed]) for seed in seeds}})
    return results
