"""The main recipe: data → vocabulary → grid features → XE → SCST (chosen reward) → evaluation, from one YAML.

Every stage writes its output under `run_dir` (vocab.json, features/<set>/, xe/, scst-<reward>/,
eval/<model>/<test set>.json) and records its fingerprint in `run_dir/stages/<stage>.json` (`pacs.captioner.orchestration.stages`):
re-running a run directory skips the stages whose settings, inputs and upstream stages are unchanged, re-runs
the changed ones and everything below them (logging what changed), resumes an interrupted XE / SCST from its
checkpoints when its fingerprint matches and refuses otherwise; `force` (`--force STAGE`) re-runs a stage.
A YAML with a top-level `demo:` section is handed to `pacs.captioner.demo.run_demo`.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pacs.captioner.modeling.train_xe import XEConfig
from pacs.captioner.orchestration.pipeline_config import (
    REWARD_MODEL_SLOTS,
    DataConfig,
    EvalConfig,
    FeaturesConfig,
    PipelineConfig,
    RewardModelConfig,
    VocabConfig,
    default_config_path,
)
from pacs.captioner.orchestration.pipeline_rewards import (
    build_pipeline_reward,
    check_reward_models,
    reward_context,
    reward_scorers,
)
from pacs.captioner.orchestration.recipe_gallery import gallery_sources
from pacs.captioner.orchestration.shared_stages import (
    evaluate_models,
    evaluation_rows,
    open_run,
    prepare_test_sets,
    read_data,
    run_scst_stages,
    trainer_config,
    training_summary,
    write_results,
)
from pacs.captioner.orchestration.stages import check_force
from pacs.metric.common.errors import InputError
from pacs.rewards.slug import reward_slug

logger = logging.getLogger(__name__)

__all__ = ["REWARD_MODEL_SLOTS", "DataConfig", "EvalConfig", "FeaturesConfig", "PipelineConfig", "RewardModelConfig",
           "VocabConfig", "build_pipeline_reward", "check_reward_models", "default_config_path", "evaluate_models",
           "evaluation_rows", "prepare_test_sets", "reward_context", "reward_scorers", "run_pipeline",
           "stage_names", "write_results"]


def stage_names(config: PipelineConfig) -> list[str]:
    """The stages of a pipeline run, in order (the names `--force` accepts; `features` / `eval` name groups)."""
    if config.captioner.kind == "transformers":
        from pacs.captioner.orchestration.hf_stages import hf_stage_names

        return hf_stage_names(config)
    models = ["xe", *[f"scst-{reward_slug(spec)}" for spec in config.rewards]]
    sets = list(config.evaluation.test_sets)
    return ["vocab", "features/train", *models, *[f"features/{name}" for name in sets],
            *[f"eval/{reward_slug(model)}/{name}" for name in sets for model in ["xe", *config.rewards]]]


def run_pipeline(config: PipelineConfig) -> dict[str, Any]:
    """Run every stage of `config` that is not already done with the same fingerprint; return the evaluation rows.

    Stages are `pacs.captioner.orchestration.stages` stages: a stage re-runs (and everything below it) when its settings, inputs
    or upstream stages changed, resumes when interrupted with the same fingerprint, and `config.force` re-runs
    the named ones. Every process calls this; the main process owns the run directory.
    """
    from pacs.captioner.modeling.training_setup import micro_batch_for
    from pacs.captioner.orchestration.preflight import check_before_start
    from pacs.metric.common.device import accelerator_state
    from pacs.metric.common.run_lock import hold_run_directory

    state = accelerator_state(config.device)  # set up here (device cpu: on the CPU); every stage runs on it
    xe_micro = micro_batch_for(config.xe.batch_size, config.xe.micro_batch_size, state.num_processes, "xe")
    scst_micro = micro_batch_for(config.scst.batch_size, config.scst.micro_batch_size, state.num_processes,
                                   "scst")
    check_force(config.force, stage_names(config))
    if config.captioner.kind == "transformers":  # a transformers folder: refused before any work when unusable
        from pacs.captioner.modeling.hf_captioning import check_folder

        check_folder(config.captioner.checkpoint, config.captioner.prompt)
    check_before_start(config, f"run {config.run_dir}")  # every model, file, tool and folder, before any work
    with hold_run_directory(config.run_dir, state):  # one run at a time: a second one stops here, naming this one
        if config.captioner.kind == "transformers":  # pacs.captioner.orchestration.hf_stages: the same stage machinery
            from pacs.captioner.orchestration.hf_stages import run_hf_stages

            return run_hf_stages(config, state, xe_micro, scst_micro)
        return _run_stages(config, state, xe_micro, scst_micro)


def vocab_parts(config: PipelineConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings and inputs of stage `vocab` (its run and its plan)."""
    from pacs.captioner.orchestration.stage_fingerprints import data_inputs, settings_of

    return {"vocab": settings_of(config.vocab), "data": settings_of(config.data)}, data_inputs(config.data)


def xe_settings(config: PipelineConfig) -> dict[str, Any]:
    """The settings of stage `xe` (its run and its plan; its upstream: vocab and features/train)."""
    from pacs.captioner.orchestration.stage_fingerprints import settings_of, trainer_settings

    return {"xe": trainer_settings(config.xe), "model": settings_of(config.model), "data": settings_of(config.data),
            "seed": config.seed}


def eval_stage(config: PipelineConfig, set_name: str, model_name: str) -> tuple[str, list[Any]]:
    """Stage `eval/<model>/<set>`: its name and its two output files."""
    out = Path(config.run_dir) / "eval" / reward_slug(model_name) / f"{set_name}.json"
    return f"eval/{reward_slug(model_name)}/{set_name}", [out, out.with_name(f"{set_name}.results.json")]


def eval_parts(config: PipelineConfig, stages: Any, set_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings and inputs of stage `eval/<model>/<set>` (its run and its plan; its upstream: the model's
    stage and features/<set>)."""
    from pacs.captioner.orchestration.stage_fingerprints import data_inputs, reward_model_inputs, reward_model_settings

    e, set_config = config.evaluation, config.evaluation.test_sets[set_name]
    chosen = {} if e.contrastive_models is None else {"contrastive_models": e.contrastive_models}
    return ({"test_set": set_config, "beam_size": e.beam_size, "text_metrics": e.text_metrics,
             "max_images": e.max_images, "reward_models": reward_model_settings(config.reward_models), **chosen},
            {**data_inputs(set_config), **reward_model_inputs(stages, config.reward_models)})


def plan_stages(config: PipelineConfig, features_pending: str = "") -> tuple[list[tuple[str, str, str]], list[str]]:
    """`pacs train --dry-run` of a recipe: every stage's verdict (reuse / run / resume / refused, and why), from the
    fingerprints the run would compute, and the checks that ran; nothing is written. ([(stage, verdict, why)],
    [check]). `features_pending`: why the features its `features.cache_dir` names are made earlier in the same run
    (another seed's), so its feature stages run and that folder is not checked yet."""
    import dataclasses

    from pacs.captioner.modeling.training_setup import micro_batch_for
    from pacs.captioner.orchestration.preflight import check_before_start
    from pacs.captioner.orchestration.shared_stages import scst_inputs, scst_settings, scst_stage, test_set_selection
    from pacs.captioner.orchestration.stage_fingerprints import data_inputs, settings_of
    from pacs.metric.common.device import accelerator_state

    state = accelerator_state(config.device)
    micro_batch_for(config.xe.batch_size, config.xe.micro_batch_size, state.num_processes, "xe")
    scst_micro = micro_batch_for(config.scst.batch_size, config.scst.micro_batch_size, state.num_processes, "scst")
    names = stage_names(config)
    check_force(config.force, names)
    checks = ["config read and validated (every section, key and value)",
              f"micro-batch split of xe and scst over {state.num_processes} process(es)",
              f"--force names ({', '.join(config.force) or 'none'}) among the {len(names)} stages (check_force)"]
    if config.captioner.kind == "transformers":
        from pacs.captioner.modeling.hf_captioning import check_folder

        check_folder(config.captioner.checkpoint, config.captioner.prompt)
        checks.append("transformers captioner folder (check_folder)")
    checked = dataclasses.replace(config, features=dataclasses.replace(config.features, cache_dir="")) \
        if features_pending else config
    check_before_start(checked, f"run {config.run_dir}")
    checks.append("preflight: every model, file, tool and folder (check_before_start)")
    if config.captioner.kind == "transformers":
        from pacs.captioner.orchestration.hf_stages import plan_hf_stages

        return plan_hf_stages(config, open_run(config, state, planning=True), scst_micro), checks
    if not config.data.path:
        raise InputError(f"data set {config.data.name!r}: no path given (set data.path)")
    run = open_run(config, state, planning=True)
    stages = run.stages
    stages.plan("vocab", *vocab_parts(config), outputs=[run.dir / "vocab.json"])
    def plan_features(name: str, selection: dict[str, Any], inputs: dict[str, Any]) -> None:
        if features_pending:
            stages.plan_unknown(f"features/{name}", features_pending)
        else:
            run.plan_feature_stage(name, selection, inputs)

    plan_features("train", {"data": settings_of(config.data)}, data_inputs(config.data))
    stages.plan("xe", xe_settings(config), upstream=["vocab", "features/train"], resumable=True,
                progress=run.dir / "xe" / "checkpoints")
    model_stages = {"xe": "xe"}
    for spec in config.rewards:
        name, out, scst = scst_stage(run, spec, scst_micro)
        stages.plan(name, scst_settings(config, spec, {}),
                    lambda scst=scst: scst_inputs(stages, config, scst, run.dir / "xe" / "best", {}),
                    upstream=["xe", "features/train"], resumable=True, progress=out / "checkpoints")
        model_stages[spec] = name
    for set_name, set_config in config.evaluation.test_sets.items():
        plan_features(set_name, test_set_selection(config, set_config), data_inputs(set_config))
    for set_name in config.evaluation.test_sets:
        for model_name, model_stage in model_stages.items():
            name, outputs = eval_stage(config, set_name, model_name)
            stages.plan(name, *eval_parts(config, stages, set_name), upstream=[model_stage, f"features/{set_name}"],
                        outputs=outputs)
    return stages.planned, checks


def _run_stages(config: PipelineConfig, state: Any, xe_micro: int, scst_micro: int) -> dict[str, Any]:
    """Every stage of `config` in its run directory, whose lock the caller holds; the evaluation rows."""
    from pacs.captioner.modeling.train_scst import train_scst
    from pacs.captioner.modeling.train_xe import train_xe
    from pacs.captioner.modeling.vocab import build_vocab, load_vocab
    from pacs.captioner.orchestration.stage_fingerprints import (
        data_inputs,
        settings_of,
    )
    from pacs.eval.text_metrics import TextMetricSession

    run = open_run(config, state)
    if not config.data.path:
        raise InputError(f"data set {config.data.name!r}: no path given (set data.path)")
    train_store, images, val_references, test_items = read_data(config, run)
    logger.info("pipeline: %d training images, %d validation images", train_store.num_images, len(val_references))
    stages = run.stages
    data_settings, data_files = settings_of(config.data), data_inputs(config.data)

    vocab_path = run.dir / "vocab.json"

    def make_vocab() -> dict[str, Any]:
        """Stage `vocab` (main process)."""
        v = config.vocab
        vocab = build_vocab(v.kind, train_store.captions(), v.min_count, v.vocab_size, v.max_length)
        vocab.save(vocab_path)
        return {"size": len(vocab)}

    stages.run("vocab", make_vocab, *vocab_parts(config), outputs=[vocab_path])  # main process; the others wait
    vocab = load_vocab(vocab_path)
    features = run.feature_stage("train", images, {"data": data_settings}, data_files)
    source = config.features.source.to_record()

    xe_dir = run.dir / "xe"
    xe_config = trainer_config(XEConfig, config.xe, xe_dir, xe_micro, "xe")
    stages.run("xe", lambda: training_summary(train_xe(xe_config, config.model, vocab, features,
                                               train_store.pairs(),
                                               val_references, feature_source=source)),
               xe_settings(config), upstream=["vocab", "features/train"], resumable=True, distributed=True,
               progress=xe_dir / "checkpoints")
    models = {"xe": xe_dir / "best"}
    model_stages = {"xe": "xe"}
    scst_stages = run_scst_stages(
        run, scst_micro, train_store, images,
        lambda scst, reward: train_scst(scst, xe_dir / "best", features, train_store.reference_sets(), reward,
                                        validation=val_references),
        xe_dir / "best", {}, {}, ["xe", "features/train"])
    for spec, (name, selected) in scst_stages.items():
        models[spec], model_stages[spec] = selected, name
    test_sets = prepare_test_sets(run, test_items)
    # the report's gallery, from the items read here (not the data set again)
    sources = gallery_sources(config, {name: items for name, items, _ in test_sets})
    del test_items
    eval_stages = []
    for set_name, _, _ in test_sets:
        for model_name in models:
            name, outputs = eval_stage(config, set_name, model_name)
            action = stages.begin(name, *eval_parts(config, stages, set_name),
                                  upstream=[model_stages[model_name], f"features/{set_name}"], outputs=outputs)
            if action != "skipped":
                eval_stages.append(name)
    with TextMetricSession():  # one METEOR process and PTB memo for every evaluation of the run
        result = evaluate_models(run, models, test_sets)  # split over the processes; rows on the main process
    for name in eval_stages:
        stages.finish(name)
    state.wait_for_everyone()
    return {**result, "gallery_sources": sources}


