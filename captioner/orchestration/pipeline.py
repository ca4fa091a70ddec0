"""The main recipe: data → vocabulary → grid features → XE → SCST (chosen reward) → evaluation, from one YAML.

Every stage writes its output under `run_dir` (vocab.json, features/<set>/, xe/, scst-<reward>/,
eval/<model>/<test set>.json) and records its fingerprint in `run_dir/stages/<stage>.json` (`pacs.captioner.orchestration.stages`):
re-running a run directory skips the stages whose settings, inputs and upstream stages are unchanged, re-runs
the changed ones and everything below them (logging what changed), resumes an interrupted XE / SCST from its
checkpoints when its fingerprint matches and refuses otherwise; `force` (`--force STAGE`) re-runs a stage.
The captioner kind (`captioner.kind`: pacs' captioner, or a transformers folder without vocabulary and features)
is chosen once per run (`pacs.captioner.orchestration.captioner_stages`) and asked what differs by the one runner.
A YAML with a top-level `demo:` section is handed to `pacs.captioner.demo.run_demo`.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pacs.captioner.modeling.policy import PacsPolicy
from pacs.captioner.modeling.train_xe import XEConfig
from pacs.captioner.orchestration.captioner_stages import CaptionerKind, captioner_kind
from pacs.captioner.orchestration.correlation_stage import (
    check_correlation,
    correlation_sets,
    correlation_stage_parts,
    run_correlation_stage,
)
from pacs.captioner.orchestration.guarded_stages import (
    guarded_rows,
    guarded_stage_names,
    plan_guarded_stages,
    reward_rows,
    run_guarded_stages,
)
from pacs.captioner.orchestration.human_row import HUMAN_ROW, check_human_rows, human_stage_parts
from pacs.captioner.orchestration.judge_correlation import read_correlation
from pacs.captioner.orchestration.judge_monitor import policy_captioner, recipe_judge_monitor
from pacs.captioner.orchestration.metric_training import (
    METRIC_STAGES,
    plan_metric_stages,
    run_metric_stages,
    with_metric_models,
)
from pacs.captioner.orchestration.pipeline_config import (
    REWARD_MODEL_SLOTS,
    DataConfig,
    EvalConfig,
    FeaturesConfig,
    PipelineConfig,
    RewardModelConfig,
    VocabConfig,
    default_config_path,
    normalised_row,
)
from pacs.captioner.orchestration.pipeline_rewards import (
    build_pipeline_reward,
    check_reward_models,
    reward_context,
    reward_scorers,
)
from pacs.captioner.orchestration.preflight import check_before_start, evaluation_slots
from pacs.captioner.orchestration.recipe_gallery import gallery_sources
from pacs.captioner.orchestration.results_files import write_results
from pacs.captioner.orchestration.shared_stages import (
    evaluate_models,
    evaluation_rows,
    open_run,
    prepare_test_sets,
    read_data,
    run_scst_stages,
    scst_inputs,
    scst_runs,
    scst_settings,
    scst_stage,
    selected_model,
    test_set_items,
    trainer_config,
    training_summary,
)
from pacs.captioner.orchestration.stages import check_force, upstream_reason
from pacs.metric.common.errors import InputError
from pacs.rewards.slug import reward_slug

logger = logging.getLogger(__name__)

__all__ = ["REWARD_MODEL_SLOTS", "DataConfig", "EvalConfig", "FeaturesConfig", "PipelineConfig", "RewardModelConfig",
           "VocabConfig", "build_pipeline_reward", "check_reward_models", "default_config_path", "evaluate_models",
           "evaluation_rows", "prepare_test_sets", "reward_context", "reward_scorers", "run_pipeline",
           "stage_names", "write_results"]


def stage_names(config: PipelineConfig) -> list[str]:
    """The stages of a pipeline run, in order (the names `--force` accepts; `features` / `eval` name groups)."""
    kind = captioner_kind(config)
    trained = [*(["xe"] if kind.trains_xe else []), *[f"scst-{reward_slug(spec)}" for spec in config.rewards],
               *[f"scst-{reward_slug(spec)}-norm" for spec in config.normalised_rewards],
               *guarded_stage_names(config)]
    sets = list(config.evaluation.test_sets)
    models = [kind.start, *config.rewards, *map(normalised_row, config.normalised_rewards), *guarded_rows(config)]
    models += [HUMAN_ROW] if config.evaluation.human_baseline else []
    metrics = list(METRIC_STAGES) if config.metric_training is not None else []
    return [*metrics, *kind.before_xe(), *trained, *[stage for name in sets for stage in kind.feature_stages(name)],
            *[f"correlation/{name}" for name in correlation_sets(config)],
            *[f"eval/{reward_slug(model)}/{name}" for name in sets for model in models]]


def run_pipeline(config: PipelineConfig, features_only: bool = False) -> dict[str, Any]:
    """Run every stage of `config` that is not already done with the same fingerprint; return the evaluation rows.
    `features_only`: the stages before XE and the test sets' features, no rows (what parallel seeds read).

    Stages are `pacs.captioner.orchestration.stages` stages: a stage re-runs (and everything below it) when its settings, inputs
    or upstream stages changed, resumes when interrupted with the same fingerprint, and `config.force` re-runs
    the named ones. Every process calls this; the main process owns the run directory.
    """
    from pacs.captioner.modeling.training_setup import micro_batch_for
    from pacs.metric.common.device import accelerator_state
    from pacs.metric.common.run_lock import hold_run_directory

    config = with_metric_models(config)  # the models its own metric_training stages make
    state = accelerator_state(config.device)  # set up here (device cpu: on the CPU); every stage runs on it
    xe_micro = micro_batch_for(config.xe.batch_size, config.xe.micro_batch_size, state.num_processes, "xe")
    scst_micro = micro_batch_for(config.scst.batch_size, config.scst.micro_batch_size, state.num_processes,
                                   "scst")
    check_force(config.force, stage_names(config))
    check_correlation(config)
    kind = captioner_kind(config)
    kind.check()  # the kind's own inputs (a transformers folder): refused before any work when unusable
    check_before_start(config, f"run {config.run_dir}")  # every model, file, tool and folder, before any work
    with hold_run_directory(config.run_dir, state):  # one run at a time: a second one stops here, naming this one
        return _run_stages(config, kind, state, xe_micro, scst_micro, features_only)


def eval_stage(config: PipelineConfig, set_name: str, model_name: str) -> tuple[str, list[Any]]:
    """Stage `eval/<model>/<set>`: its name and its two output files."""
    out = Path(config.run_dir) / "eval" / reward_slug(model_name) / f"{set_name}.json"
    return f"eval/{reward_slug(model_name)}/{set_name}", [out, out.with_name(f"{set_name}.results.json")]


def plan_stages(config: PipelineConfig, features_pending: str = "", made_earlier: Sequence[Path] = ()
                ) -> tuple[list[tuple[str, str, str]], list[str]]:
    """`pacs train --dry-run` of a recipe: every stage's verdict (reuse / run / resume / refused, and why), from the
    fingerprints the run would compute, and the checks that ran; nothing is written. ([(stage, verdict, why)],
    [check]). `features_pending`: why the features its `features.cache_dir` names are made earlier in the same run
    (another seed's), so its feature stages run and that folder is not checked yet; `made_earlier`: model files
    made earlier in the same run (another seed's metric_training checkpoints), not checked yet either."""
    import dataclasses

    from pacs.captioner.modeling.training_setup import micro_batch_for
    from pacs.metric.common.device import accelerator_state

    config = with_metric_models(config)
    state = accelerator_state(config.device)
    micro_batch_for(config.xe.batch_size, config.xe.micro_batch_size, state.num_processes, "xe")
    scst_micro = micro_batch_for(config.scst.batch_size, config.scst.micro_batch_size, state.num_processes, "scst")
    names = stage_names(config)
    check_force(config.force, names)
    check_correlation(config)
    checks = ["config read and validated (every section, key and value)",
              f"micro-batch split of xe and scst over {state.num_processes} process(es)",
              f"--force names ({', '.join(config.force) or 'none'}) among the {len(names)} stages (check_force)"]
    kind = captioner_kind(config)
    checks += kind.check()
    checked = dataclasses.replace(config, features=dataclasses.replace(config.features, cache_dir="")) \
        if features_pending else config
    check_before_start(checked, f"run {config.run_dir}", made_earlier)
    checks.append("preflight: every model, file, tool and folder (check_before_start)")
    if not config.data.path:
        raise InputError(f"data set {config.data.name!r}: no path given (set data.path)")
    run = open_run(config, state, planning=True)
    stages = run.stages

    def plan_features(name: str, selection: dict[str, Any], inputs: dict[str, Any]) -> None:
        if features_pending:
            stages.plan_unknown(f"features/{name}", features_pending)
        else:
            run.plan_feature_stage(name, selection, inputs)

    plan_metric_stages(run)
    kind.plan_prepare(run, plan_features)
    init_inputs = kind.init_inputs(stages)
    models, model_stages = _first_model(run, kind)
    if kind.trains_xe:
        stages.plan("xe", *kind.xe_parts(stages, init_inputs), upstream=kind.before_xe(), resumable=True,
                    progress=run.dir / "xe" / "checkpoints")
    init = models[kind.start]
    for spec, normalised in scst_runs(config):
        name, out, scst = scst_stage(run, spec, scst_micro, normalised)
        stages.plan(name, scst_settings(config, spec, kind.scst_settings(), normalised),
                    lambda scst=scst: scst_inputs(stages, config, scst, init, init_inputs),
                    upstream=[*model_stages[kind.start], *kind.feature_stages("train")], resumable=True,
                    progress=out / "checkpoints")
        row = normalised_row(spec) if normalised else spec
        models[row], model_stages[row] = selected_model(out, scst), [name]
    guarded = plan_guarded_stages(run, scst_micro, init, kind.scst_settings(), init_inputs,
                                  [*model_stages[kind.start], *kind.feature_stages("train")])
    for row, found in guarded.items():  # a row whose chosen run is known (every candidate reused) plans its eval
        if isinstance(found, tuple):
            models[row], model_stages[row] = found[1], [found[0]]
    for set_name, set_config in config.evaluation.test_sets.items():
        kind.plan_test_features(set_name, set_config, plan_features)
    for set_name in correlation_sets(config):
        stages.plan(f"correlation/{set_name}", *correlation_stage_parts(config, stages, set_name))
    for set_name in config.evaluation.test_sets:
        for model_name, folder in models.items():
            name, outputs = eval_stage(config, set_name, model_name)
            stages.plan(name, *kind.eval_parts(stages, set_name, folder, not model_stages[model_name]),
                        upstream=[*model_stages[model_name], *kind.feature_stages(set_name)], outputs=outputs)
        for row, found in guarded.items():  # the others: known once the guarded runs before them have trained
            if not isinstance(found, tuple):
                stages.plan_unknown(eval_stage(config, set_name, row)[0], upstream_reason(found))
        if config.evaluation.human_baseline:
            name, outputs = eval_stage(config, set_name, HUMAN_ROW)
            stages.plan(name, *human_stage_parts(config, stages, set_name), outputs=outputs)
    return stages.planned, checks


def _first_model(run: Any, kind: CaptionerKind) -> tuple[dict[str, Path], dict[str, list[str]]]:
    """The run's first model (XE's, or the kind's starting folder) and the stages that made it."""
    if kind.trains_xe:
        return {"xe": run.dir / "xe" / "best"}, {"xe": ["xe"]}
    return {"init": kind.init_model()}, {"init": kind.init_stages()}


def _run_stages(config: PipelineConfig, kind: CaptionerKind, state: Any, xe_micro: int, scst_micro: int,
                features_only: bool = False) -> dict[str, Any]:
    """Every stage of `config` in its run directory, whose lock the caller holds; the evaluation rows
    (`features_only`: the stages before XE and the test sets' features, then no rows)."""
    from pacs.captioner.modeling.train_scst import train_scst
    from pacs.eval.text_metrics import TextMetricSession

    run = open_run(config, state)
    if not config.data.path:
        raise InputError(f"data set {config.data.name!r}: no path given (set data.path)")
    train_store, images, val_references, test_items = read_data(config, run)
    if config.evaluation.human_baseline:  # refused before any training when a test set cannot give one
        check_human_rows({name: test_set_items(run, name, test_items) for name in config.evaluation.test_sets},
                         config.seed)
    logger.info("pipeline: %d training images, %d validation images", train_store.num_images, len(val_references))
    stages = run.stages
    run_metric_stages(run)  # the data set's own CLIP and PAC-S++ (metric_training), before the features
    kind.prepare(run, train_store, images)
    if features_only:
        prepare_test_sets(run, test_items, kind.test_features)
        state.wait_for_everyone()
        return {"rows": []}
    init_inputs = kind.init_inputs(stages)
    if kind.trains_xe:
        xe_dir = run.dir / "xe"
        xe_config = trainer_config(XEConfig, config.xe, xe_dir, xe_micro, "xe")
        stages.run("xe", lambda: training_summary(kind.train_xe(xe_config, train_store, images, val_references,
                                                                 state)),
                   *kind.xe_parts(stages, init_inputs), upstream=kind.before_xe(), resumable=True, distributed=True,
                   progress=xe_dir / "checkpoints")
    models, model_stages = _first_model(run, kind)
    init = models[kind.start]

    # the judge's curves score with their own models: the evaluation's start from empty caches, as without curves
    monitor_scorers = functools.cache(lambda: reward_scorers(config, evaluation_slots(config)))

    def train(scst: Any, reward: Any) -> Any:
        """One SCST run from the kind's starting model (every process), with the judge's curve when asked."""
        policy = kind.scst_policy(init, images, scst, state)
        monitor = None
        if config.scst.judge_monitor_every:
            caption = policy_captioner(policy or PacsPolicy.load(init, kind.train_features))
            monitor = recipe_judge_monitor(config, scst, train_store.num_images, caption, val_references, images,
                                           monitor_scorers() if state.is_main_process else {},
                                           state.is_main_process)
        return train_scst(scst, init, kind.train_features, train_store.reference_sets(), reward, on_step=monitor,
                          validation=val_references, policy=policy)

    scst_upstream = [*model_stages[kind.start], *kind.feature_stages("train")]
    scst_stages = run_scst_stages(run, scst_micro, train_store, images, train, init, kind.scst_settings(),
                                  init_inputs, scst_upstream)
    guarded, choices = run_guarded_stages(run, scst_micro, train_store, images, train, init, kind.scst_settings(),
                                          init_inputs, scst_upstream)
    for spec, (name, selected) in {**scst_stages, **guarded}.items():
        models[spec], model_stages[spec] = selected, [name]
    test_sets = prepare_test_sets(run, test_items, kind.test_features)
    # the report's gallery, from the items read here (not the data set again)
    sources = gallery_sources(config, {name: items for name, items, _ in test_sets})
    del test_items
    scorers = functools.cache(lambda: reward_scorers(config, evaluation_slots(config)))  # the columns' models, once
    correlations = {}
    for set_name, items, _ in test_sets:
        if set_name in correlation_sets(config):
            name = f"correlation/{set_name}"
            stages.run(name, lambda s=set_name, i=items, n=name: run_correlation_stage(config, s, i, scorers,
                                                                                       stages.folder(n)),
                       *correlation_stage_parts(config, stages, set_name))
            correlations[set_name] = read_correlation(stages.folder(name)) if state.is_main_process else {}
    eval_stages = []
    for set_name, _, _ in test_sets:
        for model_name, folder in models.items():
            name, outputs = eval_stage(config, set_name, model_name)
            action = stages.begin(name, *kind.eval_parts(stages, set_name, folder, not model_stages[model_name]),
                                  upstream=[*model_stages[model_name], *kind.feature_stages(set_name)],
                                  outputs=outputs)
            if action != "skipped":
                eval_stages.append(name)
        if config.evaluation.human_baseline:
            name, outputs = eval_stage(config, set_name, HUMAN_ROW)
            if stages.begin(name, *human_stage_parts(config, stages, set_name), outputs=outputs) != "skipped":
                eval_stages.append(name)
    with TextMetricSession():  # one METEOR process and PTB memo for every evaluation of the run
        # split over the processes as the kind captions; rows on the main process
        result = evaluate_models(run, models, test_sets, kind.caption, kind.start, choices, reward_rows(config),
                                 scorers, {"correlation": correlations} if correlations else None)
    for name in eval_stages:
        stages.finish(name)
    state.wait_for_everyone()
    return {**result, "gallery_sources": sources}
