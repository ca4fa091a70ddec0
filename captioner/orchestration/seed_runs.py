"""`seeds:` of a recipe (`pacs train`, `recipes/compare_rewards.py --seeds`): the whole pipeline once per training
seed into `<run_dir>/seed-<s>/`, the features extracted once (every later seed reads the first seed's through
`features.cache_dir`, unless the recipe already names one), then every row pooled over the seeds into
`<run_dir>/seeds/results.{json,csv,md}`: each column's mean over seeds (the interquartile mean from 5 seeds) and,
for every row but XE, the paired stratified bootstrap over seeds and images (`pacs.eval.intervals.StratifiedBootstrap`) of
(row − XE) on the columns that are means of per-image values (C, S and the contrastive ones)."""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pacs.captioner.modeling.training_setup import process_state
from pacs.captioner.orchestration.captioner_stages import captioner_kind
from pacs.captioner.orchestration.evaluation import row_columns
from pacs.captioner.orchestration.guarded_stages import reward_rows
from pacs.captioner.orchestration.metric_training import with_metric_models
from pacs.captioner.orchestration.pipeline import run_pipeline
from pacs.captioner.orchestration.pipeline_config import PipelineConfig, normalisation_pairs
from pacs.captioner.orchestration.recipe_findings import reward_findings
from pacs.captioner.orchestration.results_files import write_results
from pacs.captioner.orchestration.seed_processes import each_seed, parallel_seed_count, threads_per_seed
from pacs.eval.intervals import LEVEL, METHOD, StratifiedBootstrap, aggregate, point_name
from pacs.metric.common.device import accelerator_state

logger = logging.getLogger(__name__)


def seed_configs(config: PipelineConfig) -> list[tuple[int, PipelineConfig]]:
    """One config per seed of `config.seeds`: its own run directory `<run_dir>/seed-<s>`, the first seed's features
    (and its `metric_training` models: the later seeds read them, as the demo's seeds share its metric stages)."""
    first = Path(config.run_dir) / f"seed-{config.seeds[0]}"
    shared = with_metric_models(dataclasses.replace(config, run_dir=str(first)))  # the first seed's metric models
    out = []
    for index, seed in enumerate(config.seeds):
        seeded = dataclasses.replace(config, seed=seed, seeds=[], run_dir=str(Path(config.run_dir) / f"seed-{seed}"))
        if index and config.metric_training is not None:  # metric_training: trained once, by the first seed
            seeded = dataclasses.replace(seeded, metric_training=None, features=shared.features,
                                         reward_models=shared.reward_models)
        if index and not seeded.features.cache_dir:
            seeded = dataclasses.replace(seeded, features=dataclasses.replace(seeded.features,
                                                                              cache_dir=str(first / "features")))
        out.append((seed, seeded))
    return out


def run_seeds(config: PipelineConfig, run: Callable[[PipelineConfig], dict[str, Any]] | None = None
              ) -> dict[str, Any]:
    """Run the pipeline once per seed, in turn or `parallel_seeds` at once (`pacs.captioner.orchestration.seed_processes`;
    `run`, a stand-in for the pipeline: in turn), and pool the rows (main process: the pooled rows; others: none)."""
    configs = dict(seed_configs(config))
    parallel = 1 if run is not None else parallel_seed_count(config.parallel_seeds, config.seeds,
                                                             accelerator_state(config.device))
    if parallel > 1 and not config.features.cache_dir:  # the other seeds read the first's features: made first
        logger.info("seed %d: the features every seed reads", config.seeds[0])
        run_pipeline(configs[config.seeds[0]], features_only=True)

    def in_turn(seed: int) -> list[dict[str, Any]]:
        logger.info("seed %d: %s", seed, configs[seed].run_dir)
        return (run or run_pipeline)(configs[seed])["rows"]

    rows_by_seed = each_seed(config.seeds, in_turn, functools.partial(_seed_rows, configs), parallel,
                             threads_per_seed(None, parallel),
                             lambda seed: Path(config.run_dir) / "logs" / f"seed-{seed}.log")
    if not process_state().is_main_process:
        return {"rows": [], "seed_rows": []}
    per_image = {seed: read_per_image(Path(config.run_dir) / f"seed-{seed}") for seed in config.seeds}
    boot = config.evaluation.bootstrap
    baseline = captioner_kind(config).start  # xe, or a transformers run's init
    rows = pool_rows(rows_by_seed, per_image, boot, config.seed, baseline)
    seed_rows = [dict(row, seed=seed) for seed, rows_of in rows_by_seed.items() for row in rows_of]
    write_seed_results(Path(config.run_dir) / "seeds", rows, seed_rows, list(config.seeds), boot,
                       reward_findings(per_image, reward_rows(config), boot, config.seed, baseline,
                                       normalisation_pairs(config)))
    return {"rows": rows, "seed_rows": seed_rows, "seeds": list(config.seeds)}


def _seed_rows(configs: Mapping[int, PipelineConfig], seed: int) -> list[dict[str, Any]]:
    """One seed's pipeline in a seed process of its own; its rows."""
    return run_pipeline(configs[seed])["rows"]


def read_per_image(run_dir: Path) -> dict[tuple[str, str], Mapping[str, Any]]:
    """`{(model, test set): {"image_ids", "values"}}` from a run's `eval/<model>/<set>.json` records."""
    out: dict[tuple[str, str], Mapping[str, Any]] = {}
    for path in sorted((run_dir / "eval").glob("*/*.json")):
        if path.name.endswith(".results.json"):
            continue
        record = json.loads(path.read_text(encoding="utf-8"))
        for row in record.get("rows", []):
            values = (record.get("per_image") or {}).get(row.get("test_set"))
            if values is not None:
                out[(row["model"], row["test_set"])] = values
    return out


def pool_rows(rows_by_seed: Mapping[int, Sequence[Mapping[str, Any]]],
              per_image: Mapping[int, Mapping[tuple[str, str], Mapping[str, Any]]], n_resamples: int,
              seed: int, baseline: str = "xe") -> list[dict[str, Any]]:
    """One row per (model, test set) of the first seed found in every seed: each numeric column aggregated over the
    seeds (`pacs.eval.intervals.aggregate`), `per_seed` values, and for every other row than `baseline` (`xe`, or a
    transformers run's `init`) `delta` / `ci` / `delta_per_seed` of its per-image columns against the baseline row
    of the same test set."""
    seeds = list(rows_by_seed)
    keyed = {s: {(r["model"], r["test_set"]): r for r in rows} for s, rows in rows_by_seed.items()}
    pooled = []
    for first in rows_by_seed[seeds[0]]:
        key = (first["model"], first["test_set"])
        if not all(key in keyed[s] for s in seeds):
            logger.warning("%s on %s is missing in some seed: left out of the pooled table", *key)
            continue
        row: dict[str, Any] = {"model": key[0], "test_set": key[1], "seeds": len(seeds), "per_seed": {}}
        for column in first:
            values = [keyed[s][key].get(column) for s in seeds]
            if column in ("model", "test_set", "ci") or not all(isinstance(v, (int, float)) for v in values):
                continue
            row[column] = float(aggregate(np.asarray(values, dtype=np.float64)))
            row["per_seed"][column] = [float(v) for v in values]
        base_key = (baseline, key[1])
        if key[0] != baseline and n_resamples > 0:
            _add_intervals(row, [per_image[s].get(key) for s in seeds], [per_image[s].get(base_key) for s in seeds],
                           n_resamples, seed, StratifiedBootstrap)
        pooled.append(row)
    return pooled


def _add_intervals(row: dict[str, Any], mine: list[Any], base: list[Any], n_resamples: int, seed: int,
                   bootstrap: Any) -> None:
    """`delta`, `ci` and `delta_per_seed` of the columns every seed has per-image values of, paired by image."""
    if any(m is None or b is None or list(m["image_ids"]) != list(b["image_ids"]) for m, b in zip(mine, base)):
        logger.warning("no interval for %s on %s: per-image values missing or on other images", row["model"],
                       row["test_set"])
        return
    if len({tuple(m["image_ids"]) for m in mine}) != 1:
        logger.warning("no interval for %s on %s: the seeds' test images differ", row["model"], row["test_set"])
        return
    columns = [c for c in mine[0]["values"] if all(c in m["values"] and c in b["values"] for m, b in zip(mine, base))]
    boot = bootstrap(len(mine), len(mine[0]["image_ids"]), n_resamples, seed)
    delta, ci, per_seed = {}, {}, {}
    for column in columns:
        model = np.asarray([m["values"][column] for m in mine], dtype=np.float64)
        xe = np.asarray([b["values"][column] for b in base], dtype=np.float64)
        if not (np.isfinite(model).all() and np.isfinite(xe).all()):
            continue
        found = boot.mean_difference(model, xe)
        delta[column], ci[column], per_seed[column] = found.point, found.interval, found.per_seed
    if ci:
        row.update(delta=delta, ci=ci, delta_per_seed=per_seed)


def write_seed_results(folder: Path, rows: list[dict[str, Any]], seed_rows: list[dict[str, Any]], seeds: list[int],
                       n_resamples: int, found: Mapping[str, Any] | None = None) -> None:
    """`folder/results.{json,csv,md}` of the pooled rows; results.json also keeps every seed's row, the method and
    `found` (`pacs.captioner.orchestration.recipe_findings.reward_findings`: the reward gains and findings)."""
    columns = ["model", "test_set", *row_columns(rows)]
    write_results(folder, {"columns": columns, "rows": rows, "seeds": seeds, "seed_rows": seed_rows,
                           "bootstrap": {"method": METHOD, "resamples": n_resamples, "seeds": len(seeds),
                                         "point": point_name(len(seeds)), "level": LEVEL}, **(found or {})},
                  columns)
