"""A recipe's guarded SCST runs (`guarded:`, `pacs.captioner.orchestration.guard_choice.GuardedConfig`): per guarded
reward, every candidate setting of every guard trained from the same starting model as the reward's own SCST run
(stages `scst-<reward>-kl<coef>`, `scst-<reward>-<guard><setting>`; the recipe's SCSTConfig keys, `scst_keys`), each
guard's setting chosen on validation (`guard_choice.choose`: the hacking monitor's CIDEr-D of the run's selected
checkpoint, ties: fewest gaming signatures; never a test value), and with two guards or more the best combination
(`scst-<reward>-guards`). The chosen runs become table rows `<reward> +KL`, `<reward> +<guard>`, `<reward> +guards`,
evaluated like every other model; the record of each choice is `guard_choice-<reward>.json` and `guarded` in
results.json. The same menu, record and criterion as the demo's guards (docs/demo.md "Guards").
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pacs.captioner.modeling.hacking_monitor import read_monitor_rows
from pacs.captioner.modeling.train_scst import SCSTConfig, gaming_thresholds
from pacs.captioner.orchestration import guard_choice as menu_of
from pacs.captioner.orchestration import run_records
from pacs.captioner.orchestration.pipeline_config import PipelineConfig, normalised_row
from pacs.captioner.orchestration.pipeline_rewards import build_pipeline_reward
from pacs.captioner.orchestration.reward_record import announce_reward
from pacs.captioner.orchestration.shared_stages import (
    RecipeRun,
    scst_inputs,
    scst_settings,
    trainer_config,
    training_summary,
)
from pacs.captioner.orchestration.stages import upstream_reason
from pacs.metric.common.io import write_json_atomic
from pacs.rewards.slug import reward_slug


def row_name(reward: str, key: str) -> str:
    """The table row of `reward` under guard `key` at its chosen setting (`pac-s++ +KL`, `pac-s++ +length mask`)."""
    return f"{reward} +{menu_of.GUARDS[key].row}"


def combination_row(reward: str) -> str:
    """The table row of `reward` under every guard at its chosen setting (`pac-s++ +guards`)."""
    return f"{reward} +{menu_of.COMBINATION}"


def stage_name(config: PipelineConfig, reward: str, key: str, value: Any) -> str:
    """The stage of `reward`'s guarded run at one setting of guard `key`."""
    return f"scst-{reward_slug(config.guarded.reward_spec(reward))}-{menu_of.setting_label(key, value)}"


def combination_stage(config: PipelineConfig, reward: str) -> str:
    """The stage of `reward`'s best-combination run."""
    return f"scst-{reward_slug(config.guarded.reward_spec(reward))}-{menu_of.COMBINATION}"


def guarded_stage_names(config: PipelineConfig) -> list[str]:
    """Every guarded SCST stage of the recipe, in training order."""
    names = []
    for reward in config.guarded.rewards:
        names += [stage_name(config, reward, key, value) for key, values in config.guarded.guards().items()
                  for value in values]
        names += [combination_stage(config, reward)] if config.guarded.combines() else []
    return names


def guarded_rows(config: PipelineConfig) -> dict[str, str]:
    """Every guarded table row -> its reward."""
    rows = {}
    for reward in config.guarded.rewards:
        rows.update({row_name(reward, key): reward for key in config.guarded.guards()})
        if config.guarded.combines():
            rows[combination_row(reward)] = reward
    return rows


def reward_rows(config: PipelineConfig) -> list[tuple[str, str]]:
    """(reward spec, table row) of every SCST row of a recipe: each reward's own run, each `normalised_rewards` run,
    then each guarded row (whose gain is its reward's)."""
    return [*((spec, spec) for spec in config.rewards),
            *((spec, normalised_row(spec)) for spec in config.normalised_rewards),
            *((reward, row) for row, reward in guarded_rows(config).items())]


def _guarded_scst(run: RecipeRun, reward: str, guard: dict[str, Any], name: str,
                  scst_micro: int) -> tuple[str, Path, SCSTConfig]:
    """One guarded run's reward spec, output folder and trainer config (the recipe's `scst` plus the guard's keys)."""
    spec = run.config.guarded.reward_spec(reward, guard)
    out = run.dir / name
    return spec, out, trainer_config(SCSTConfig, run.config.scst, out, scst_micro, "scst", reward=spec,
                                     **menu_of.scst_keys(guard))


def _stage_settings(config: PipelineConfig, spec: str, guard: dict[str, Any], settings: dict[str, Any]) -> dict:
    """A guarded stage's settings: an SCST stage's, plus the guard's own SCSTConfig keys."""
    return {**scst_settings(config, spec, settings), "guard": menu_of.scst_keys(guard)}


def run_guarded_stages(run: RecipeRun, scst_micro: int, train_store: Any, images: Any,
                       train: Callable[[SCSTConfig, Any], Any], init: Path, settings: dict[str, Any],
                       inputs: dict[str, Any], upstream: list[str]
                       ) -> tuple[dict[str, tuple[str, Path]], dict[str, dict[str, Any]]]:
    """Every guarded stage (every process; `train`, `settings`, `inputs`, `upstream` as `run_scst_stages`'), each
    guard's choice and the combination: ({row: (stage, model folder)}, {reward: choice record})."""
    config, stages = run.config, run.stages

    def train_one(reward: str, guard: dict[str, Any], name: str) -> dict[str, Any]:
        spec, out, scst = _guarded_scst(run, reward, guard, name, scst_micro)

        def body() -> dict[str, Any]:
            """A guarded SCST stage (every process)."""
            exact = announce_reward(name, spec, scst.mix_normalisation, scst.kl_coef, stages.state.is_main_process)
            result = train(scst, build_pipeline_reward(spec, config, dataset_references=train_store.reference_map(),
                                                       image_paths=images))
            step = result.best_step if result.best_dir is not None else \
                result.kept_step if result.kept_dir is not None else result.steps
            return {**training_summary(result), "reward": exact, "guard": dict(guard),
                    "model": str(Path(result.selected_dir).relative_to(out)),
                    **menu_of.evidence(read_monitor_rows(out / "monitor.csv"), step, gaming_thresholds(scst))}

        stages.run(name, body, _stage_settings(config, spec, guard, settings),
                   scst_inputs(stages, config, scst, init, inputs), upstream=upstream, resumable=True,
                   distributed=True, progress=out / "checkpoints")
        return run_records.section(stages.record(name), "summary", stages.record_path(name))

    rows: dict[str, tuple[str, Path]] = {}
    records: dict[str, dict[str, Any]] = {}
    for reward in config.guarded.rewards:
        record: dict[str, Any] = {"reward": reward, "spec": config.guarded.reward_spec(reward), "seed": config.seed,
                                  "criterion": menu_of.CRITERION, "choices": {}, "rows": {}}
        for key, values in config.guarded.guards().items():
            candidates = []
            for value in values:
                name = stage_name(config, reward, key, value)
                summary = train_one(reward, {key: value}, name)
                candidates.append({"setting": value, "stage": name,
                                   **{k: summary.get(k) for k in ("selected_step", "val_cider", "signatures",
                                                                  "zero_spread_fraction")}})
            record["choices"][key] = menu_of.choice_record(reward, config.seed, key, candidates)
            record["rows"][row_name(reward, key)] = record["choices"][key]["chosen_stage"]
        if config.guarded.combines():
            combined, name = menu_of.combination(record["choices"]), combination_stage(config, reward)
            summary = train_one(reward, combined, name)
            record["combination"] = {"rule": "every guard at its chosen setting (a setting that turns it off left "
                                              "out)", "settings": combined, "stage": name,
                                     **{k: summary.get(k) for k in ("selected_step", "val_cider", "signatures")}}
            record["rows"][combination_row(reward)] = name
        if stages.state.is_main_process:
            write_json_atomic(run.dir / f"guard_choice-{reward_slug(record['spec'])}.json", record)
        for row, stage in record["rows"].items():  # the record's `summary.model`: inside the stage's folder
            rows[row] = (stage, run_records.recorded_model(run.dir, stage, stages.record(stage),
                                                           stages.record_path(stage)))
        records[reward] = record
    return rows, records


def plan_guarded_stages(run: RecipeRun, scst_micro: int, init: Path, settings: dict[str, Any],
                        inputs: dict[str, Any], upstream: list[str]) -> dict[str, tuple[str, Path] | list[str]]:
    """`pacs train --dry-run` of the guarded stages, planned as they would run: each candidate from its settings;
    when every candidate of a reward is reused, the choices are made again from their records and the combination
    planned from its settings. {row: (stage, model folder) when known, else the stages that would run first}."""
    config, stages = run.config, run.stages
    rows: dict[str, tuple[str, Path] | list[str]] = {}

    def plan_one(reward: str, guard: dict[str, Any], name: str) -> str:
        spec, out, scst = _guarded_scst(run, reward, guard, name, scst_micro)
        return stages.plan(name, _stage_settings(config, spec, guard, settings),
                           lambda: scst_inputs(stages, config, scst, init, inputs), upstream=upstream,
                           resumable=True, progress=out / "checkpoints")

    def summary(name: str) -> dict[str, Any]:
        return run_records.section(stages.record(name), "summary", stages.record_path(name))

    def known(name: str) -> tuple[str, Path]:
        return name, run_records.recorded_model(run.dir, name, stages.record(name), stages.record_path(name))

    for reward in config.guarded.rewards:
        verdicts = {stage_name(config, reward, key, value): plan_one(reward, {key: value},
                                                                      stage_name(config, reward, key, value))
                    for key, values in config.guarded.guards().items() for value in values}
        pending = [name for name, verdict in verdicts.items() if verdict != "reuse"]
        names = [row_name(reward, key) for key in config.guarded.guards()]
        if config.guarded.combines():
            names.append(combination_row(reward))
        if pending:
            if config.guarded.combines():
                stages.plan_unknown(combination_stage(config, reward), upstream_reason(pending))
            rows.update(dict.fromkeys(names, pending))
            continue
        choices = {key: menu_of.choice_record(reward, config.seed, key, [
            {"setting": value, "stage": stage_name(config, reward, key, value),
             **{k: summary(stage_name(config, reward, key, value)).get(k) for k in ("val_cider", "signatures")}}
            for value in values]) for key, values in config.guarded.guards().items()}
        for key, record in choices.items():
            rows[row_name(reward, key)] = known(record["chosen_stage"])
        if config.guarded.combines():
            name = combination_stage(config, reward)
            verdict = plan_one(reward, menu_of.combination(choices), name)
            rows[combination_row(reward)] = known(name) if verdict == "reuse" else [name]
    return rows
