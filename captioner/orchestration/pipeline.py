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


def _run_stages(config: PipelineConfig, state: Any, xe_micro: int, scst_micro: int) -> dict[str, Any]:
    """Every stage of `config` in its run directory, whose lock the caller holds; the evaluation rows."""
    from pacs.captioner.modeling.train_scst import train_scst
    from pacs.captioner.modeling.train_xe import train_xe
    from pacs.captioner.modeling.vocab import build_vocab, load_vocab
    from pacs.captioner.orchestration.stage_fingerprints import (
        data_inputs,
        reward_model_inputs,
        reward_model_settings,
        settings_of,
        trainer_settings,
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

    stages.run("vocab", make_vocab, {"vocab": settings_of(config.vocab), "data": data_settings}, data_files,
               outputs=[vocab_path])  # main process; the others wait, then read it
    vocab = load_vocab(vocab_path)
    features = run.feature_stage("train", images, {"data": data_settings}, data_files)
    source = config.features.source.to_record()

    xe_dir = run.dir / "xe"
    xe_config = trainer_config(XEConfig, config.xe, xe_dir, xe_micro, "xe")
    stages.run("xe", lambda: training_summary(train_xe(xe_config, config.model, vocab, features,
                                               train_store.pairs(),
                                               val_references, feature_source=source)),
               {"xe": trainer_settings(config.xe), "model": settings_of(config.model), "data": data_settings,
                "seed": config.seed},
               upstream=["vocab", "features/train"], resumable=True, distributed=True,
               progress=xe_dir / "checkpoints")
    models = {"xe": xe_dir / "best"}
    model_stages = {"xe": "xe"}
    reward_settings = reward_model_settings(config.reward_models)
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
        set_config = config.evaluation.test_sets[set_name]
        for model_name in models:
            out = run.dir / "eval" / reward_slug(model_name) / f"{set_name}.json"
            name = f"eval/{reward_slug(model_name)}/{set_name}"
            e = config.evaluation
            chosen = {} if e.contrastive_models is None else {"contrastive_models": e.contrastive_models}
            action = stages.begin(name, {"test_set": set_config, "beam_size": e.beam_size,
                                         "text_metrics": e.text_metrics, "max_images": e.max_images,
                                         "reward_models": reward_settings, **chosen},
                                  {**data_inputs(set_config), **reward_model_inputs(stages, config.reward_models)},
                                  upstream=[model_stages[model_name], f"features/{set_name}"],
                                  outputs=[out, out.with_name(f"{set_name}.results.json")])
            if action != "skipped":
                eval_stages.append(name)
    with TextMetricSession():  # one METEOR process and PTB memo for every evaluation of the run
        result = evaluate_models(run, models, test_sets)  # split over the processes; rows on the main process
    for name in eval_stages:
        stages.finish(name)
    state.wait_for_everyone()
    return {**result, "gallery_sources": sources}


