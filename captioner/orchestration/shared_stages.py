"""The parts of a recipe run that every captioner kind's stages share: the run directory and its data, the trainer
settings, the SCST stages (one per reward), the test sets, the evaluation rows and the results files.

`pacs.captioner.orchestration.pipeline` runs them for every captioner kind (`pacs.captioner.orchestration.captioner_stages`).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pacs.captioner.data import load_dataset
from pacs.captioner.modeling.checkpoints import load_captioner
from pacs.captioner.modeling.features import FeatureCache, extract_features
from pacs.captioner.modeling.train_scst import SCSTConfig, guard_settings
from pacs.captioner.modeling.training_setup import process_state
from pacs.captioner.orchestration.backbone_source import load_source_backbone, resolve_device
from pacs.captioner.orchestration.data_sources import CaptionJudge, judge_of
from pacs.captioner.orchestration.eval_intervals import add_intervals
from pacs.captioner.orchestration.eval_processes import caption_and_score
from pacs.captioner.orchestration.evaluation import evaluate_captions_detailed, results_json, row_columns
from pacs.captioner.orchestration.human_row import HUMAN_ROW, human_captions
from pacs.captioner.orchestration.pipeline_config import (
    JUDGE_MONITOR_KEYS,
    NORMALISED,
    DataConfig,
    PipelineConfig,
    normalisation_pairs,
    normalised_row,
    trainer_section,
)
from pacs.captioner.orchestration.pipeline_rewards import (
    build_pipeline_reward,
    guard_reward_settings,
    reward_scorers,
)
from pacs.captioner.orchestration.precomputed_features import precomputed_feature_stage, precomputed_parts
from pacs.captioner.orchestration.preflight import evaluation_slots
from pacs.captioner.orchestration.recipe_findings import reward_findings
from pacs.captioner.orchestration.results_files import write_results
from pacs.captioner.orchestration.reward_record import announce_reward
from pacs.captioner.orchestration.stage_fingerprints import (
    data_inputs,
    reward_model_inputs,
    reward_model_settings,
    settings_of,
    source_inputs,
    trainer_settings,
)
from pacs.captioner.orchestration.stages import StageRunner
from pacs.captioner.orchestration.training_data import read_training_data
from pacs.metric.common.config import dump_yaml, from_dict
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import nonfinite_to_none, write_json_atomic
from pacs.rewards.slug import legacy_folders_problem, reward_slug

logger = logging.getLogger(__name__)


class RecipeRun:
    """State of one pipeline run (loaded data, feature caches) shared by the stages."""

    def __init__(self, config: PipelineConfig, planning: bool = False) -> None:
        self.config = config
        self.dir = Path(config.run_dir)
        self._backbone = None
        self.stages = StageRunner(self.dir, config.force, process_state(), planning=planning)

    def backbone(self) -> Any:
        """The feature backbone (loaded once, on first use)."""
        if self._backbone is None:
            self._backbone = load_source_backbone(self.config.features.source)
        return self._backbone

    def dataset(self, data: DataConfig | dict[str, Any]) -> Any:
        """Load a data set described by a DataConfig (or a test-set mapping with an extra `split`)."""
        if isinstance(data, dict):
            data = from_dict(DataConfig, {k: v for k, v in data.items() if k != "split"}, "evaluation.test_sets")
        if not data.path:
            raise InputError(f"data set {data.name!r}: no path given (set data.path)")
        return load_dataset(*data.loader_arguments(), **data.options)

    def features(self, name: str, image_paths: dict[str, Any]) -> Any:
        """The feature cache of set `name`, extracting (split over processes) only the ids it lacks."""
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
        stage = f"features/{name}"
        f = self.config.features
        if f.cache_dir:
            return precomputed_feature_stage(self.stages, f, self.backbone, name, image_paths, selection, inputs)
        self.stages.run(stage, lambda: {"images": len(self.features(name, image_paths))},
                        *self.feature_parts(selection, inputs), resumable=True, distributed=True)
        return FeatureCache(self.dir / stage)

    def feature_parts(self, selection: dict[str, Any], inputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """The settings and inputs of a feature stage extracted here (its run and its plan)."""
        f = self.config.features
        return ({"source": settings_of(f.source), "dtype": f.dtype, "images": selection,
                 **({"mixed_precision": f.mixed_precision} if f.mixed_precision != "no" else {})},
                {**inputs, **source_inputs(self.stages, f.source)})

    def plan_feature_stage(self, name: str, selection: dict[str, Any], inputs: dict[str, Any]) -> str:
        """`plan` of stage `features/<name>` (what `feature_stage` would decide)."""
        f = self.config.features
        if f.cache_dir:
            return self.stages.plan(f"features/{name}", *precomputed_parts(self.stages, f, name, selection, inputs),
                                    outputs=[])
        return self.stages.plan(f"features/{name}", *self.feature_parts(selection, inputs), resumable=True)


def take(items: list, limit: int) -> list:
    """The first `limit` items (all of them when `limit` is 0)."""
    return items[:limit] if limit else items


def open_run(config: PipelineConfig, state: Any, planning: bool = False) -> RecipeRun:
    """The run directory (every process, once all are here); the main process writes its `config.yaml`
    (`planning`: nothing is written, for `StageRunner.plan`)."""
    state.wait_for_everyone()
    run = RecipeRun(config, planning)
    legacy = legacy_folders_problem(run.dir, config.rewards)  # a 0.6 run folder: refused before anything is written
    if legacy:
        raise InputError(legacy)
    if state.is_main_process and not planning:
        dump_yaml(dataclasses.replace(config, force=[]), run.dir / "config.yaml")  # --force is not sticky
    return run


def read_data(config: PipelineConfig, run: RecipeRun) -> tuple[Any, Any, dict[str, list[str]], dict[str, list]]:
    """The data read once, one item at a time: (training store and image paths on disk, validation references,
    test items in memory; `pacs.captioner.orchestration.training_data.TrainingData`'s fields)."""
    data = read_training_data(config, run.dir, same_file_test_sets(config))
    return data.store, data.image_paths, data.val_references, data.test_items


def trainer_config(kind: type, section: Any, out: Path, micro_batch_size: int, name: str, **fields: Any) -> Any:
    """The `kind` (XEConfig / SCSTConfig) of stage section `name`: the recipe's `section` with the stage's output
    folder, the derived micro-batch size and `fields`."""
    return from_dict(kind, dict(trainer_section(section), output_dir=str(out), micro_batch_size=micro_batch_size,
                                **fields), name)


def run_scst_stages(run: RecipeRun, scst_micro: int, train_store: Any, images: Any,
                 train: Callable[[SCSTConfig, Any], Any], init: Path, settings: dict[str, Any],
                 inputs: dict[str, Any], upstream: list[str]) -> dict[str, tuple[str, Path]]:
    """Stage `scst-<reward>` of every reward of the recipe (every process): `train(scst, reward)` trains one from
    the model folder `init`; `settings` and `inputs` are added to the stage's own (reward, guards, reward models,
    data, seed; its starting model, reward models, KL reference). {reward spec: (stage name, the model
    `scst.select_by` chose)}."""
    config, stages = run.config, run.stages
    chosen: dict[str, tuple[str, Path]] = {}
    for spec, normalised in scst_runs(config):
        name, out, scst = scst_stage(run, spec, scst_micro, normalised)

        def body(scst: SCSTConfig = scst, spec: str = spec, name: str = name) -> dict[str, Any]:
            """Stage `scst-<reward>` (every process)."""
            exact = announce_reward(name, spec, scst.mix_normalisation, scst.kl_coef, stages.state.is_main_process)
            reward = build_pipeline_reward(spec, config, dataset_references=train_store.reference_map(),
                                           image_paths=images)
            return {**training_summary(train(scst, reward)), "reward": exact}

        stages.run(name, body, scst_settings(config, spec, settings, normalised),
                   scst_inputs(stages, config, scst, init, inputs),
                   upstream=upstream, resumable=True, distributed=True, progress=out / "checkpoints")
        chosen[normalised_row(spec) if normalised else spec] = (name, selected_model(out, scst))
    return chosen


def scst_runs(config: PipelineConfig) -> list[tuple[str, bool]]:
    """(reward spec, normalised) of every SCST stage of `rewards` and `normalised_rewards`, in order."""
    return [*((spec, False) for spec in config.rewards), *((spec, True) for spec in config.normalised_rewards)]


def selected_model(out: Path, scst: SCSTConfig) -> Path:
    """The model an SCST stage writing to `out` hands on (the one `scst.select_by` chose)."""
    return out / ("final" if scst.select_by == "last" else "best")


def scst_stage(run: RecipeRun, spec: str, scst_micro: int, normalised: bool = False) -> tuple[str, Path, SCSTConfig]:
    """Stage `scst-<reward>` of reward `spec` (`normalised`: its `normalised_rewards` run, `scst-<reward>-norm`):
    its name, output folder and trainer config."""
    name = f"scst-{reward_slug(spec)}{'-norm' if normalised else ''}"
    out = run.dir / name
    extra = {"mix_normalisation": NORMALISED} if normalised else {}
    return name, out, trainer_config(SCSTConfig, run.config.scst, out, scst_micro, "scst", reward=spec, **extra)


def scst_settings(config: PipelineConfig, spec: str, settings: dict[str, Any],
                  normalised: bool = False) -> dict[str, Any]:
    """The settings of stage `scst-<reward>` (its run and its plan; `normalised`: `scst-<reward>-norm`'s):
    `settings` added to its own."""
    scst = guard_settings(trainer_settings(config.scst))
    if not config.scst.judge_monitor_every:  # off: fingerprinted as before the judge's curves (done runs stay done)
        scst = {key: value for key, value in scst.items() if key not in JUDGE_MONITOR_KEYS}
    if normalised:
        scst = {**scst, "mix_normalisation": NORMALISED}
    return {"scst": scst, "reward": spec, **settings,
            "reward_models": reward_model_settings(config.reward_models), "data": settings_of(config.data),
            "seed": config.seed, **guard_reward_settings(config, spec)}


def scst_inputs(stages: StageRunner, config: PipelineConfig, scst: SCSTConfig, init: Path,
                inputs: dict[str, Any]) -> dict[str, Any]:
    """The inputs of an SCST stage starting from model folder `init` (its run and its plan): `inputs` added."""
    return {"init_checkpoint": stages.checkpoint(init), **inputs,
            **reward_model_inputs(stages, config.reward_models), **kl_reference_input(stages, scst)}


def training_summary(result: Any) -> dict[str, Any]:
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


def kl_reference_input(stages: StageRunner, scst: SCSTConfig) -> dict[str, Any]:
    """The KL guard's reference captioner as a checkpoint input, when `scst.kl_reference` names one."""
    return {"kl_reference": stages.checkpoint(scst.kl_reference)} if scst.kl_coef and scst.kl_reference else {}


def loads_like(set_config: dict[str, Any], data: DataConfig) -> bool:
    """Whether test set `set_config` is read from the same file with the same loading settings as `data`."""
    loaded = from_dict(DataConfig, {k: v for k, v in set_config.items() if k != "split"}, "evaluation.test_sets")
    fields = ("name", "image_root", "missing_images", "options")
    return (bool(data.path) and all(getattr(loaded, f) == getattr(data, f) for f in fields)
            and Path(loaded.path).resolve() == Path(data.path).resolve())


def select_test_items(dataset: Any, set_config: dict[str, Any], max_images: int) -> list:
    """The items of a test set (its `split`, default 'test'; '' for the whole file) from its loaded data set."""
    split = set_config.get("split", "test")
    return take(dataset.split(split).items if split else dataset.items, max_images)


def same_file_test_sets(config: PipelineConfig) -> dict[str, dict[str, Any]]:
    """The test sets read from the training data's file with its settings (their items are taken while it is read).

    A test set whose settings do not parse is left out: `prepare_test_sets` loads it and reports the error there.
    """
    same = {}
    for set_name, set_config in config.evaluation.test_sets.items():
        try:
            if loads_like(set_config, config.data):
                same[set_name] = set_config
        except InputError:
            continue
    return same


def prepare_test_sets(run: RecipeRun, loaded: dict[str, list] | None = None,
                      features: Callable[[RecipeRun, str, list, dict[str, Any]], Any] | None = None,
                      ) -> list[tuple[str, list, Any]]:
    """Every test set and what its captioner reads besides the images: [(name, items, features)].

    `loaded`: the items of test sets already taken from a loaded data set (`{set name: items}`); the others are
    loaded from their files. `features(run, name, items, set_config)`: a test set's features (default
    `test_feature_stage`, stage `features/<set>`).
    """
    config = run.config
    prepared = []
    for set_name, set_config in config.evaluation.test_sets.items():
        items = test_set_items(run, set_name, loaded)
        prepared.append((set_name, items, (features or test_feature_stage)(run, set_name, items, set_config)))
    return prepared


def test_set_items(run: RecipeRun, set_name: str, loaded: dict[str, list] | None = None) -> list:
    """The items of test set `set_name`: `loaded[set_name]` when it was taken from a loaded data set, else read
    from its file (`evaluation.max_images` applied)."""
    if loaded is not None and set_name in loaded:
        return loaded[set_name]
    set_config = run.config.evaluation.test_sets[set_name]
    return select_test_items(run.dataset(set_config), set_config, run.config.evaluation.max_images)


def test_feature_stage(run: RecipeRun, set_name: str, items: list, set_config: dict[str, Any]) -> Any:
    """Stage `features/<set>` of a test set's `items` (split over the processes): its feature cache."""
    return run.feature_stage(set_name, {i.image_id: i.image_path for i in items},
                             test_set_selection(run.config, set_config), data_inputs(set_config))


def test_set_selection(config: PipelineConfig, set_config: dict[str, Any]) -> dict[str, Any]:
    """The settings that decide which images stage `features/<test set>` holds (its run and its plan)."""
    return {"test_set": set_config, "max_images": config.evaluation.max_images}


def caption_with_features(run: RecipeRun, folder: Path, items: list, features: Any,
                          scorers: Callable[[], Any]) -> tuple[dict[str, str], dict[str, Any]] | None:
    """pacs' captioner in `folder` on a test set's `items`: beam search over `features` and the contrastive scores
    of `scorers()`, split over the processes (`pacs.captioner.orchestration.eval_processes`); (captions, scores)
    on the main process, None on the others."""
    config, state = run.config, process_state()
    chosen = scorers()
    device = resolve_device(config.device)
    model, vocab, _ = load_captioner(folder, device)
    paths = {i.image_id: i.image_path for i in items}
    references = {i.image_id: i.captions for i in items}
    result = caption_and_score(model, vocab, features, list(paths), paths, references, chosen,
                               config.evaluation.beam_size, config.evaluation.batch_size, device, state)
    return (result.captions, result.contrastive) if state.is_main_process else None


def evaluate_models(run: RecipeRun, models: dict[str, Path], test_sets: list[tuple[str, list, Any]],
                    caption: Callable[..., Any] | None = None, reference_row: str = "xe",
                    guard_choices: dict[str, Any] | None = None,
                    reward_rows: list[tuple[str, str]] | None = None,
                    scorers: Callable[[], dict[str, Any]] | None = None,
                    extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Caption every test set with every model, score, and write eval/results.{json,csv,md}.

    Call it on every process. `caption(run, folder, items, features, scorers)`: a model's captions of a test set
    and their contrastive scores (None: scored from `scorers()` with the rows) on the main process, None on the
    others (default `caption_with_features`: pacs' captioner, split over the processes, identical to one process);
    corpus metrics, paired bootstrap intervals against the `reference_row` row (`evaluation.bootstrap` resamples)
    and the files are computed on the main process, which returns the rows (the others return no rows).
    `reward_rows`: (reward spec, row) of the rows whose reward gain and findings are reported (default: each reward's
    own row); `guard_choices[reward]`: the guarded runs' choice records (`guarded_stages.run_guarded_stages`), kept in
    results.json `guarded` and printed under the table. `scorers()`: the evaluation's contrastive models by family
    (default: loaded here once, `evaluation.contrastive_models`); `extra`: more keys of results.json (the
    correlation stages' tables).
    """
    config = run.config
    state = process_state()
    rows_of = [*models, *([HUMAN_ROW] if config.evaluation.human_baseline else [])]
    todo = [(set_name, model_name) for set_name, _, _ in test_sets for model_name in rows_of
             if not (run.dir / "eval" / reward_slug(model_name) / f"{set_name}.json").is_file()]
    if state.num_processes > 1:  # every process follows the main process's view of what is left to do
        from accelerate.utils import broadcast_object_list

        todo = broadcast_object_list([todo])[0]
    rows: list[dict[str, Any]] = []
    per_image: dict[tuple[str, str], dict[str, Any]] = {}
    if scorers is None:  # the columns' models, loaded once
        scorers = functools.cache(lambda: reward_scorers(config, evaluation_slots(config)))
    judges = {name: judge_of(config.evaluation.test_sets[name]) for name, _, _ in test_sets} \
        if state.is_main_process else {}  # a test set with an exact judge (the demo world): its columns too

    def score(set_name: str, model_name: str, captions: dict[str, str], items: list,
              contrastive: dict[str, Any] | None) -> None:
        """Row `model_name` of test set `set_name` (main process): its record, its captions, collected."""
        out = run.dir / "eval" / reward_slug(model_name) / f"{set_name}.json"
        detailed = evaluation_rows(set_name, captions, items, scorers() if contrastive is None else None,
                                   config.evaluation.text_metrics, contrastive=contrastive, per_image=True,
                                   judge=judges[set_name])
        record = nonfinite_to_none({"rows": [{"model": model_name, **row} for row, _ in detailed],  # NaN: null
                                    "per_image": {row["test_set"]: values for row, values in detailed}})
        write_json_atomic(out.with_name(f"{set_name}.results.json"), results_json(captions))
        write_json_atomic(out, record)
        collect(record, rows, per_image)

    for set_name, items, features in test_sets:
        for model_name in rows_of:
            out = run.dir / "eval" / reward_slug(model_name) / f"{set_name}.json"
            if (set_name, model_name) not in todo:
                if state.is_main_process:
                    collect(json.loads(out.read_text(encoding="utf-8")), rows, per_image)
            elif model_name not in models:  # the human row: held-out references, scored against the others
                if state.is_main_process:
                    score(set_name, model_name, *human_captions(set_name, items, config.seed), None)
            else:
                captioned = (caption or caption_with_features)(run, models[model_name], items, features, scorers)
                if state.is_main_process:
                    score(set_name, model_name, captioned[0], items, captioned[1])
    if not state.is_main_process:
        return {"rows": []}
    add_intervals(rows, per_image, reference_row, config.evaluation.bootstrap, config.seed)
    columns = ["model", "test_set", *row_columns(rows)]
    # each reward's own gain and the findings, by the demo's rules, against the reference row (xe, or init)
    pairs = reward_rows if reward_rows is not None else [(spec, spec) for spec in config.rewards]
    found = reward_findings({config.seed: per_image}, pairs, config.evaluation.bootstrap, config.seed, reference_row,
                            normalisation_pairs(config))
    guarded = {"guarded": {"choices_by_seed": {str(config.seed): {reward: {"guards": record} for reward, record
                                                                  in guard_choices.items()}}}} if guard_choices else {}
    write_results(run.dir / "eval", {"columns": columns, "rows": rows, **found, **guarded, **(extra or {})}, columns)
    return {"rows": rows}


def collect(record: dict[str, Any], rows: list[dict[str, Any]], per_image: dict[tuple[str, str], Any]) -> None:
    """Add the rows of one eval/<model>/<set>.json (and its per-image values, when it has them)."""
    for row in record["rows"]:
        row.pop("ci", None)
        rows.append(row)
        values = record.get("per_image", {}).get(row["test_set"])
        if values is not None:
            per_image[(row["model"], row["test_set"])] = values


def evaluation_rows(set_name: str, captions: dict[str, str], items: list, scorers: dict[str, Any] | None,
                    text_metrics: list[str], contrastive: dict[str, Any] | None = None,
                    per_image: bool = False, judge: CaptionJudge | None = None) -> list[Any]:
    """One row for the whole test set, then one per `extra["domain"]` (nocaps in/near/out-domain).

    `contrastive`: per-image contrastive scores in caption order (from `caption_and_score`) instead of
    `scorers`. With `per_image=True` each entry is `(row, {"image_ids", "values": {column: [...]}})`. `judge`: the
    test set's exact judge (`pacs.captioner.orchestration.data_sources`), whose columns each row adds (the mean of
    its per-caption values).
    """
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
        if judge is not None and ids:
            judged = judge(ids, [captions[k] for k in ids])
            row.update({column: float(np.mean(found)) for column, found in judged.items()})
            values.update(judged)
        row = {"test_set": name, **row}
        out.append((row, {"image_ids": [str(k) for k in ids],
                          "values": {c: np.asarray(v).tolist() for c, v in values.items()}}) if per_image else row)
    return out
