"""The main recipe: data → vocabulary → grid features → XE → SCST (chosen reward) → evaluation, from one YAML.

Every stage writes its output under `run_dir` (vocab.json, features/<set>/, xe/, scst-<reward>/,
eval/<model>/<test set>.json) and records its fingerprint in `run_dir/stages/<stage>.json` (`pacs.captioner.orchestration.stages`):
re-running a run directory skips the stages whose settings, inputs and upstream stages are unchanged, re-runs
the changed ones and everything below them (logging what changed), resumes an interrupted XE / SCST from its
checkpoints when its fingerprint matches and refuses otherwise; `force` (`--force STAGE`) re-runs a stage.
A YAML with a top-level `demo:` section is handed to `pacs.captioner.demo.run_demo`.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pacs.captioner.modeling.train_scst import SCSTConfig, guard_settings
from pacs.captioner.modeling.train_xe import XEConfig
from pacs.captioner.modeling.training import process_state
from pacs.captioner.orchestration.backbone_source import load_source_backbone, resolve_device
from pacs.captioner.orchestration.pipeline_config import (
    REWARD_MODEL_SLOTS,
    DataConfig,
    EvalConfig,
    FeaturesConfig,
    PipelineConfig,
    RewardModelConfig,
    VocabConfig,
    default_config_path,
    reward_slug,
)
from pacs.captioner.orchestration.pipeline_rewards import (
    build_pipeline_reward,
    check_reward_models,
    guard_reward_settings,
    reward_context,
    reward_scorers,
)
from pacs.captioner.orchestration.stages import StageRunner, check_force
from pacs.metric.common.config import dump_yaml, from_dict, to_dict
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import nonfinite_to_none, write_json_atomic, write_text_atomic

logger = logging.getLogger(__name__)

__all__ = ["REWARD_MODEL_SLOTS", "DataConfig", "EvalConfig", "FeaturesConfig", "PipelineConfig", "RewardModelConfig",
           "VocabConfig", "build_pipeline_reward", "check_reward_models", "default_config_path", "evaluate_models",
           "evaluation_rows", "prepare_test_sets", "reward_context", "reward_scorers", "reward_slug", "run_pipeline",
           "stage_names", "write_results"]


class _Run:
    """State of one pipeline run (loaded data, feature caches) shared by the stages."""

    def __init__(self, config: PipelineConfig) -> None:
        self.config = config
        self.dir = Path(config.run_dir)
        self._backbone = None
        self.stages = StageRunner(self.dir, config.force, process_state())

    def backbone(self) -> Any:
        """The feature backbone (loaded once, on first use)."""
        if self._backbone is None:
            self._backbone = load_source_backbone(self.config.features.source)
        return self._backbone

    def dataset(self, data: DataConfig | dict[str, Any]) -> Any:
        """Load a data set described by a DataConfig (or a test-set mapping with an extra `split`)."""
        from pacs.captioner.data import load_dataset

        if isinstance(data, dict):
            data = from_dict(DataConfig, {k: v for k, v in data.items() if k != "split"}, "evaluation.test_sets")
        if not data.path:
            raise InputError(f"data set {data.name!r}: no path given (set data.path)")
        return load_dataset(data.name, data.path, data.image_root, data.missing_images, **data.options)

    def features(self, name: str, image_paths: dict[str, Any]) -> Any:
        """The feature cache of set `name`, extracting (split over processes) only the ids it lacks."""
        from pacs.captioner.modeling.features import FeatureCache, extract_features
        from pacs.captioner.modeling.training import process_state

        folder = self.dir / "features" / name
        if (folder / "meta.json").is_file():
            cache = FeatureCache(folder)
            if not cache.missing(image_paths):
                return cache
        f = self.config.features
        return extract_features(self.backbone(), image_paths, folder, f.batch_size, f.shard_size, f.dtype,
                                accelerator=process_state(), mixed_precision=f.mixed_precision, workers=f.workers)

    def feature_stage(self, name: str, image_paths: dict[str, Any], selection: dict[str, Any],
                      inputs: dict[str, Any]) -> Any:
        """Stage `features/<name>` (all processes, resumable): the feature cache of `image_paths`.

        `selection` / `inputs`: the settings and annotation inputs that decide which images the set holds.
        """
        from pacs.captioner.modeling.features import FeatureCache
        from pacs.captioner.orchestration.recipe_stages import settings_of, source_inputs

        stage = f"features/{name}"
        f = self.config.features
        if f.cache_dir:
            from pacs.captioner.orchestration.precomputed_features import precomputed_feature_stage

            return precomputed_feature_stage(self.stages, f, self.backbone, name, image_paths, selection, inputs)
        self.stages.run(stage, lambda: {"images": len(self.features(name, image_paths))},
                        {"source": settings_of(f.source), "dtype": f.dtype, "images": selection,
                         **({"mixed_precision": f.mixed_precision} if f.mixed_precision != "no" else {})},
                        {**inputs, **source_inputs(self.stages, f.source)}, resumable=True, distributed=True)
        return FeatureCache(self.dir / stage)


def _take(items: list, limit: int) -> list:
    return items[:limit] if limit else items


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
    from pacs.captioner.modeling.training import micro_batch_for
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
    from pacs.captioner.orchestration.recipe_stages import (
        data_inputs,
        reward_model_inputs,
        reward_model_settings,
        settings_of,
        trainer_settings,
    )
    from pacs.eval.text_metrics import TextMetricSession

    run = _open_run(config, state)
    if not config.data.path:
        raise InputError(f"data set {config.data.name!r}: no path given (set data.path)")
    train_store, images, val_references, test_items = _read_data(config, run)
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
    xe_config = _trainer_config(XEConfig, config.xe, xe_dir, xe_micro, "xe")
    stages.run("xe", lambda: _summary(train_xe(xe_config, config.model, vocab, features,
                                               train_store.pairs(),
                                               val_references, feature_source=source)),
               {"xe": trainer_settings(config.xe), "model": settings_of(config.model), "data": data_settings,
                "seed": config.seed},
               upstream=["vocab", "features/train"], resumable=True, distributed=True,
               progress=xe_dir / "checkpoints")
    models = {"xe": xe_dir / "best"}
    model_stages = {"xe": "xe"}
    reward_settings = reward_model_settings(config.reward_models)
    scst_stages = _scst_stages(
        run, scst_micro, train_store, images,
        lambda scst, reward: train_scst(scst, xe_dir / "best", features, train_store.reference_sets(), reward,
                                        validation=val_references),
        xe_dir / "best", {}, {}, ["xe", "features/train"])
    for spec, (name, selected) in scst_stages.items():
        models[spec], model_stages[spec] = selected, name
    test_sets = prepare_test_sets(run, test_items)
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
    return result


def _open_run(config: PipelineConfig, state: Any) -> _Run:
    """The run directory (every process, once all are here); the main process writes its `config.yaml`."""
    state.wait_for_everyone()
    run = _Run(config)
    if state.is_main_process:
        dump_yaml(dataclasses.replace(config, force=[]), run.dir / "config.yaml")  # --force is not sticky
    return run


def _read_data(config: PipelineConfig, run: _Run) -> tuple[Any, Any, dict[str, list[str]], dict[str, list]]:
    """The data read once, one item at a time: (training store and image paths on disk, validation references,
    test items in memory; `pacs.captioner.orchestration.training_data.TrainingData`'s fields)."""
    from pacs.captioner.orchestration.training_data import read_training_data

    data = read_training_data(config, run.dir, _same_file_test_sets(config))
    return data.store, data.image_paths, data.val_references, data.test_items


def _trainer_config(kind: type, section: Any, out: Path, micro_batch_size: int, name: str, **fields: Any) -> Any:
    """The `kind` (XEConfig / SCSTConfig) of stage section `name`: the recipe's `section` with the stage's output
    folder, the derived micro-batch size and `fields`."""
    return from_dict(kind, dict(to_dict(section), output_dir=str(out), micro_batch_size=micro_batch_size, **fields),
                     name)


def _scst_stages(run: _Run, scst_micro: int, train_store: Any, images: Any,
                 train: Callable[[SCSTConfig, Any], Any], init: Path, settings: dict[str, Any],
                 inputs: dict[str, Any], upstream: list[str]) -> dict[str, tuple[str, Path]]:
    """Stage `scst-<reward>` of every reward of the recipe (every process): `train(scst, reward)` trains one from
    the model folder `init`; `settings` and `inputs` are added to the stage's own (reward, guards, reward models,
    data, seed; its starting model, reward models, KL reference). {reward spec: (stage name, the model
    `scst.select_by` chose)}."""
    from pacs.captioner.orchestration.recipe_stages import (
        reward_model_inputs,
        reward_model_settings,
        settings_of,
        trainer_settings,
    )

    config, stages = run.config, run.stages
    reward_settings = reward_model_settings(config.reward_models)
    chosen: dict[str, tuple[str, Path]] = {}
    for spec in config.rewards:
        name = f"scst-{reward_slug(spec)}"
        out = run.dir / name
        scst = _trainer_config(SCSTConfig, config.scst, out, scst_micro, "scst", reward=spec)

        def body(scst: SCSTConfig = scst, spec: str = spec) -> dict[str, Any]:
            """Stage `scst-<reward>` (every process)."""
            reward = build_pipeline_reward(spec, config, dataset_references=train_store.reference_map(),
                                           image_paths=images)
            return _summary(train(scst, reward))

        stages.run(name, body, {"scst": guard_settings(trainer_settings(config.scst)), "reward": spec, **settings,
                                "reward_models": reward_settings, "data": settings_of(config.data),
                                "seed": config.seed, **guard_reward_settings(config, spec)},
                   {"init_checkpoint": stages.checkpoint(init), **inputs,
                    **reward_model_inputs(stages, config.reward_models), **_kl_reference_input(stages, scst)},
                   upstream=upstream, resumable=True, distributed=True, progress=out / "checkpoints")
        chosen[spec] = (name, out / ("final" if scst.select_by == "last" else "best"))
    return chosen


def _summary(result: Any) -> dict[str, Any]:
    """What a stage record keeps of an XE / SCST result (steps and last loss; SCST's selected checkpoint)."""
    losses = list(getattr(result, "losses", []) or [])
    summary = {"steps": getattr(result, "steps", None), "loss_last": losses[-1] if losses else None}
    if hasattr(result, "zero_spread_fraction"):  # SCST: did the reward vary within the k samples?
        fraction = result.zero_spread_fraction
        summary.update(zero_spread_fraction=None if fraction is None else round(fraction, 4),
                       degenerate_reward=result.degenerate_warning is not None,
                       warnings=[result.degenerate_warning] if result.degenerate_warning else [])
    if getattr(result, "select_by", "last") != "last":  # SCST with select_by cider / reward
        summary.update(select_by=result.select_by, best_step=result.best_step, best_score=result.best_score,
                       selected=str(result.best_dir))
    return summary


def _kl_reference_input(stages: StageRunner, scst: SCSTConfig) -> dict[str, Any]:
    """The KL guard's reference captioner as a checkpoint input, when `scst.kl_reference` names one."""
    return {"kl_reference": stages.checkpoint(scst.kl_reference)} if scst.kl_coef and scst.kl_reference else {}


def _loads_like(set_config: dict[str, Any], data: DataConfig) -> bool:
    """Whether test set `set_config` is read from the same file with the same loading settings as `data`."""
    loaded = from_dict(DataConfig, {k: v for k, v in set_config.items() if k != "split"}, "evaluation.test_sets")
    fields = ("name", "image_root", "missing_images", "options")
    return (bool(data.path) and all(getattr(loaded, f) == getattr(data, f) for f in fields)
            and Path(loaded.path).resolve() == Path(data.path).resolve())


def _test_set_items(dataset: Any, set_config: dict[str, Any], max_images: int) -> list:
    """The items of a test set (its `split`, default 'test'; '' for the whole file) from its loaded data set."""
    split = set_config.get("split", "test")
    return _take(dataset.split(split).items if split else dataset.items, max_images)


def _same_file_test_sets(config: PipelineConfig) -> dict[str, dict[str, Any]]:
    """The test sets read from the training data's file with its settings (their items are taken while it is read).

    A test set whose settings do not parse is left out: `prepare_test_sets` loads it and reports the error there.
    """
    same = {}
    for set_name, set_config in config.evaluation.test_sets.items():
        try:
            if _loads_like(set_config, config.data):
                same[set_name] = set_config
        except InputError:
            continue
    return same


def prepare_test_sets(run: _Run, loaded: dict[str, list] | None = None) -> list[tuple[str, list, Any]]:
    """Every test set and its features (stage `features/<set>`, split over the processes): [(name, items, cache)].

    `loaded`: the items of test sets already taken from a loaded data set (`{set name: items}`); the others are
    loaded from their files.
    """
    from pacs.captioner.orchestration.recipe_stages import data_inputs

    config = run.config
    prepared = []
    for set_name, set_config in config.evaluation.test_sets.items():
        if loaded is not None and set_name in loaded:
            items = loaded[set_name]
        else:
            items = _test_set_items(run.dataset(set_config), set_config, config.evaluation.max_images)
        selection = {"test_set": set_config, "max_images": config.evaluation.max_images}
        prepared.append((set_name, items, run.feature_stage(set_name, {i.image_id: i.image_path for i in items},
                                                             selection, data_inputs(set_config))))
    return prepared


def evaluate_models(run: _Run, models: dict[str, Path], test_sets: list[tuple[str, list, Any]]) -> dict[str, Any]:
    """Caption every test set with every model, score, and write eval/results.{json,csv,md}.

    Call it on every process: captioning and contrastive scoring are split over the processes
    (`pacs.captioner.orchestration.eval_processes`, identical to one process); corpus metrics, paired bootstrap intervals against
    the XE row (`evaluation.bootstrap` resamples) and the files are computed on the main process, which returns
    the rows (the others return no rows).
    """
    from pacs.captioner.modeling.checkpoints import load_captioner
    from pacs.captioner.modeling.training import process_state
    from pacs.captioner.orchestration.eval_intervals import add_intervals
    from pacs.captioner.orchestration.eval_processes import caption_and_score
    from pacs.captioner.orchestration.evaluation import TABLE_COLUMNS, results_json

    config = run.config
    state = process_state()
    todo = [(set_name, model_name) for set_name, _, _ in test_sets for model_name in models
             if not (run.dir / "eval" / reward_slug(model_name) / f"{set_name}.json").is_file()]
    if state.num_processes > 1:  # every process follows the main process's view of what is left to do
        from accelerate.utils import broadcast_object_list

        todo = broadcast_object_list([todo])[0]
    rows: list[dict[str, Any]] = []
    per_image: dict[tuple[str, str], dict[str, Any]] = {}
    scorers = None
    for set_name, items, features in test_sets:
        paths = {i.image_id: i.image_path for i in items}
        references = {i.image_id: i.captions for i in items}
        for model_name, folder in models.items():
            out = run.dir / "eval" / reward_slug(model_name) / f"{set_name}.json"
            if (set_name, model_name) not in todo:
                if state.is_main_process:
                    _collect(json.loads(out.read_text(encoding="utf-8")), rows, per_image)
                continue
            if scorers is None:
                from pacs.captioner.orchestration.preflight import evaluation_slots

                scorers = reward_scorers(config, evaluation_slots(config))  # only the columns' models
            device = resolve_device(config.device)
            model, vocab, _ = load_captioner(folder, device)
            result = caption_and_score(model, vocab, features, list(paths), paths, references, scorers,
                                       config.evaluation.beam_size, config.evaluation.batch_size, device, state)
            if not state.is_main_process:
                continue
            detailed = evaluation_rows(set_name, result.captions, items, None, config.evaluation.text_metrics,
                                       contrastive=result.contrastive, per_image=True)
            record = nonfinite_to_none({"rows": [{"model": model_name, **row} for row, _ in detailed],  # NaN: null
                                        "per_image": {row["test_set"]: values for row, values in detailed}})
            write_json_atomic(out.with_name(f"{set_name}.results.json"), results_json(result.captions))
            write_json_atomic(out, record)
            _collect(record, rows, per_image)
    if not state.is_main_process:
        return {"rows": []}
    add_intervals(rows, per_image, "xe", config.evaluation.bootstrap, config.seed)
    columns = ["model", "test_set", *TABLE_COLUMNS]
    write_results(run.dir / "eval", rows, columns)
    return {"rows": rows}


def _collect(record: dict[str, Any], rows: list[dict[str, Any]], per_image: dict[tuple[str, str], Any]) -> None:
    """Add the rows of one eval/<model>/<set>.json (and its per-image values, when it has them)."""
    for row in record["rows"]:
        row.pop("ci", None)
        rows.append(row)
        values = record.get("per_image", {}).get(row["test_set"])
        if values is not None:
            per_image[(row["model"], row["test_set"])] = values


def evaluation_rows(set_name: str, captions: dict[str, str], items: list, scorers: dict[str, Any] | None,
                    text_metrics: list[str], contrastive: dict[str, Any] | None = None,
                    per_image: bool = False) -> list[Any]:
    """One row for the whole test set, then one per `extra["domain"]` (nocaps in/near/out-domain).

    `contrastive`: per-image contrastive scores in caption order (from `caption_and_score`) instead of
    `scorers`. With `per_image=True` each entry is `(row, {"image_ids", "values": {column: [...]}})`.
    """
    import numpy as np

    from pacs.captioner.orchestration.evaluation import evaluate_captions_detailed

    references = {i.image_id: i.captions for i in items}
    paths = {i.image_id: i.image_path for i in items}
    order = list(captions)
    position = {image_id: index for index, image_id in enumerate(order)}
    subsets: list[tuple[str, list[str]]] = [(set_name, order)]
    for domain in sorted({i.extra.get("domain") for i in items if i.extra.get("domain")}):
        members = {i.image_id for i in items if i.extra.get("domain") == domain}
        subsets.append((f"{set_name}/{domain}", [k for k in order if k in members]))
    out: list[Any] = []
    for name, ids in subsets:
        subset_scores = None
        if contrastive is not None:
            index = np.asarray([position[k] for k in ids], dtype=np.int64)
            subset_scores = {column: np.asarray(values)[index] for column, values in contrastive.items()}
        row, values = evaluate_captions_detailed({k: captions[k] for k in ids}, references, paths,
                                                 scorers, text_metrics, contrastive=subset_scores)
        row = {"test_set": name, **row}
        out.append((row, {"image_ids": [str(k) for k in ids],
                          "values": {c: np.asarray(v).tolist() for c, v in values.items()}}) if per_image else row)
    return out


def write_results(folder: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    """results.json, results.csv and results.md (the Table 9/10 layout) in `folder`.

    Rows with paired bootstrap intervals (`row["ci"] = {column: [low, high]}`, see `pacs.captioner.orchestration.eval_intervals`)
    keep them in results.json, get `Δ<column> low` / `Δ<column> high` columns in results.csv, and a second
    table in results.md.
    """
    from pacs.captioner.orchestration.evaluation import TABLE_COLUMNS, interval_table, markdown_table

    write_json_atomic(folder / "results.json", {"columns": columns, "rows": rows})
    ci_columns = [c for c in columns if any(c in row.get("ci", {}) for row in rows)]
    csv_columns = columns + [f"Δ{c} {end}" for c in ci_columns for end in ("low", "high")]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=csv_columns, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        flat = dict(row)
        for column, (low, high) in row.get("ci", {}).items():
            flat[f"Δ{column} low"], flat[f"Δ{column} high"] = low, high
        writer.writerow(flat)
    write_text_atomic(folder / "results.csv", buffer.getvalue())
    text = markdown_table(rows, columns)
    if ci_columns:
        labels = [c for c in columns if c not in TABLE_COLUMNS]
        text += "\n" + interval_table(rows, labels, ci_columns)
    write_text_atomic(folder / "results.md", text)
