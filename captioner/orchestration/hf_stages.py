"""The recipe's stages on a transformers captioner (`captioner: {kind: transformers, checkpoint: FOLDER}`).

The same stage machinery as pacs' captioner (`pacs.captioner.orchestration.stages`: fingerprints, skip / resume /
re-run, `--force`, the run-directory lock held by `run_pipeline`), with the stages a transformers model needs:

- `xe` (when `captioner.xe`): `pacs.captioner.modeling.hf_train_xe.train_hf_xe` on the training references, from
  `captioner.checkpoint`; its `best/` starts SCST (without it, SCST starts from the checkpoint itself);
- `scst-<reward>`: `train_scst` with a `pacs.captioner.modeling.hf_policy.HFPolicy` (any reward or mix, the baselines,
  the KL guard to the starting model, the hacking monitor, selection by validation CIDEr-D);
- `eval/<model>/<set>`: captions by the model's own `generate` (`pacs caption`'s rules, beam
  `evaluation.beam_size`) scored like pacs' rows (`evaluation_rows`), bootstrap intervals against the starting
  row, `eval/results.{json,csv,md}`.

No vocabulary and no grid features: the model reads the images. The starting model is evaluated too, as row
`init` (`xe` when XE ran: the table's reference row). The stage settings hold the `captioner` section, the
inputs the checkpoint folder's sha256.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from pacs.captioner.modeling.train_scst import SCSTConfig
from pacs.captioner.modeling.train_xe import XEConfig
from pacs.captioner.orchestration.shared_stages import (
    collect,
    evaluation_rows,
    open_run,
    read_data,
    run_scst_stages,
    select_test_items,
    trainer_config,
    training_summary,
    write_results,
)
from pacs.metric.common.io import nonfinite_to_none, write_json_atomic

logger = logging.getLogger(__name__)


def hf_stage_names(config: Any) -> list[str]:
    """The stages of a transformers run, in order."""
    from pacs.rewards.slug import reward_slug

    start = "xe" if config.captioner.xe else "init"
    trained = ["xe"] if config.captioner.xe else []
    trained += [f"scst-{reward_slug(spec)}" for spec in config.rewards]
    sets = list(config.evaluation.test_sets)
    return [*trained, *[f"eval/{reward_slug(m)}/{name}" for name in sets for m in [start, *config.rewards]]]


def _start_model(stages: Any, section: Any) -> tuple[Path, str, dict[str, Path], dict[str, list[str]], dict[str, Any]]:
    """The run's first model (the given folder, or XE's when `captioner.xe`): its folder, stage name, the models and
    their stages so far, and the folder's fingerprint input."""
    checkpoint = Path(section.checkpoint)
    start_name = "xe" if section.xe else "init"
    return (checkpoint, start_name, {start_name: checkpoint}, {start_name: []},
            {"checkpoint": stages.checkpoint(checkpoint)})


def run_hf_stages(config: Any, state: Any, xe_micro: int, scst_micro: int) -> dict[str, Any]:
    """Every stage of a transformers run (the caller holds the run-directory lock); the evaluation rows."""
    from pacs.captioner.modeling.hf_policy import HFPolicy
    from pacs.captioner.modeling.hf_train_xe import train_hf_xe
    from pacs.captioner.modeling.train_scst import train_scst
    from pacs.captioner.orchestration.stage_fingerprints import settings_of

    run = open_run(config, state)
    train_store, images, val_references, test_items = read_data(config, run)
    stages = run.stages
    section = config.captioner
    options = section.options()
    captioner_settings = settings_of(section)
    checkpoint, start_name, models, model_stages, init_inputs = _start_model(stages, section)
    if section.xe:
        xe_dir = run.dir / "xe"
        xe_config = trainer_config(XEConfig, config.xe, xe_dir, xe_micro, "xe")

        def xe_body() -> dict[str, Any]:
            """Stage `xe` (every process)."""
            policy = HFPolicy.load(checkpoint, images, options, config.scst.max_length, device=state.device,
                                   seed=config.seed)
            return training_summary(train_hf_xe(xe_config, policy, train_store.pairs(), val_references))

        stages.run("xe", xe_body, *hf_xe_parts(config, init_inputs), resumable=True, distributed=True,
                   progress=xe_dir / "checkpoints")
        models["xe"] = xe_dir / "best"
        model_stages["xe"] = ["xe"]
    init = models[start_name]

    def train(scst: SCSTConfig, reward: Any) -> Any:
        """SCST of the starting model (its `HFPolicy`) with `reward`."""
        policy = HFPolicy.load(init, images, options, scst.max_length, device=state.device, seed=scst.seed)
        return train_scst(scst, init, None, train_store.reference_sets(), reward, validation=val_references,
                          policy=policy)

    scst_stages = run_scst_stages(run, scst_micro, train_store, images, train, init, {"captioner": captioner_settings},
                               init_inputs, model_stages[start_name])
    for spec, (name, selected) in scst_stages.items():
        models[spec], model_stages[spec] = selected, [name]
    return _evaluate(run, models, model_stages, test_items, start_name)


def hf_xe_parts(config: Any, init_inputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings and inputs of a transformers run's stage `xe` (its run and its plan)."""
    from pacs.captioner.orchestration.stage_fingerprints import data_inputs, settings_of, trainer_settings

    return ({"xe": trainer_settings(config.xe), "captioner": settings_of(config.captioner),
             "data": settings_of(config.data), "seed": config.seed, "max_length": config.scst.max_length},
            {**data_inputs(config.data), **init_inputs})


def hf_eval_parts(config: Any, stages: Any, set_name: str, folder: Path,
                  starting: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings and inputs of a transformers run's stage `eval/<model>/<set>` (its run and its plan);
    `starting`: the model is the starting checkpoint itself, whose files are an input."""
    from pacs.captioner.orchestration.stage_fingerprints import data_inputs, reward_model_inputs, reward_model_settings

    e, set_config = config.evaluation, config.evaluation.test_sets[set_name]
    inputs = {**data_inputs(set_config), **reward_model_inputs(stages, config.reward_models)}
    if starting:
        inputs["checkpoint"] = stages.checkpoint(folder)
    return ({"test_set": set_config, "beam_size": e.beam_size, "text_metrics": e.text_metrics,
             "max_images": e.max_images, "captioner": {"prompt": config.captioner.prompt},
             "max_length": config.scst.max_length, "reward_models": reward_model_settings(config.reward_models)},
            inputs)


def plan_hf_stages(config: Any, run: Any, scst_micro: int) -> list[tuple[str, str, str]]:
    """`StageRunner.plan` of every stage of a transformers run (what `run_hf_stages` would decide)."""
    from pacs.captioner.orchestration.shared_stages import scst_inputs, scst_settings, scst_stage
    from pacs.captioner.orchestration.stage_fingerprints import settings_of
    from pacs.rewards.slug import reward_slug

    stages, section = run.stages, config.captioner
    _, start_name, models, model_stages, init_inputs = _start_model(stages, section)
    if section.xe:
        stages.plan("xe", *hf_xe_parts(config, init_inputs), resumable=True, progress=run.dir / "xe" / "checkpoints")
        models["xe"], model_stages["xe"] = run.dir / "xe" / "best", ["xe"]
    init = models[start_name]
    for spec in config.rewards:
        name, out, scst = scst_stage(run, spec, scst_micro)
        stages.plan(name, scst_settings(config, spec, {"captioner": settings_of(section)}),
                    lambda scst=scst: scst_inputs(stages, config, scst, init, init_inputs),
                    upstream=model_stages[start_name], resumable=True, progress=out / "checkpoints")
        models[spec], model_stages[spec] = out / ("final" if scst.select_by == "last" else "best"), [name]
    for set_name in config.evaluation.test_sets:
        for model_name, folder in models.items():
            out = run.dir / "eval" / reward_slug(model_name) / f"{set_name}.json"
            stages.plan(f"eval/{reward_slug(model_name)}/{set_name}",
                        *hf_eval_parts(config, stages, set_name, folder, not model_stages[model_name]),
                        upstream=model_stages[model_name], outputs=[out, out.with_name(f"{set_name}.results.json")])
    return stages.planned


def _evaluate(run: Any, models: dict[str, Path], model_stages: dict[str, list[str]],
              loaded: dict[str, list], reference_row: str) -> dict[str, Any]:
    """Caption every test set with every model (main process), score, write eval/results.*; the rows."""
    from pacs.captioner.modeling.hf_captioning import HFCaptionOptions, generate_captions, load_hf_captioner
    from pacs.captioner.orchestration.eval_intervals import add_intervals
    from pacs.captioner.orchestration.evaluation import TABLE_COLUMNS, results_json
    from pacs.captioner.orchestration.pipeline_rewards import reward_scorers
    from pacs.captioner.orchestration.preflight import evaluation_slots
    from pacs.eval.text_metrics import TextMetricSession
    from pacs.rewards.slug import reward_slug

    config, stages = run.config, run.stages
    e = config.evaluation
    section = config.captioner
    rows: list[dict[str, Any]] = []
    per_image: dict[tuple[str, str], Any] = {}
    scorers = None
    with TextMetricSession():
        for set_name, set_config in e.test_sets.items():
            items = loaded[set_name] if set_name in loaded else select_test_items(run.dataset(set_config), set_config,
                                                                                e.max_images)
            paths = {i.image_id: i.image_path for i in items}
            for model_name, folder in models.items():
                out = run.dir / "eval" / reward_slug(model_name) / f"{set_name}.json"
                name = f"eval/{reward_slug(model_name)}/{set_name}"
                action = stages.begin(name, *hf_eval_parts(config, stages, set_name, folder,
                                                           not model_stages[model_name]),
                                      upstream=model_stages[model_name],
                                      outputs=[out, out.with_name(f"{set_name}.results.json")])
                if action == "skipped":
                    if stages.state.is_main_process:
                        collect(json.loads(out.read_text(encoding="utf-8")), rows, per_image)
                    continue
                if stages.state.is_main_process:
                    if scorers is None:
                        scorers = reward_scorers(config, evaluation_slots(config))
                    options = HFCaptionOptions(prompt=section.prompt, beam_size=e.beam_size,
                                               max_new_tokens=config.scst.max_length, batch_size=e.batch_size,
                                               device=str(stages.state.device))
                    captions = generate_captions(load_hf_captioner(folder, str(stages.state.device)), paths, options)
                    detailed = evaluation_rows(set_name, captions, items, scorers, e.text_metrics, per_image=True)
                    record = nonfinite_to_none({"rows": [{"model": model_name, **row} for row, _ in detailed],
                                                "per_image": {row["test_set"]: v for row, v in detailed}})
                    write_json_atomic(out.with_name(f"{set_name}.results.json"), results_json(captions))
                    write_json_atomic(out, record)
                    collect(record, rows, per_image)
                stages.finish(name)
    stages.state.wait_for_everyone()
    if not stages.state.is_main_process:
        return {"rows": []}
    add_intervals(rows, per_image, reference_row, e.bootstrap, config.seed)
    write_results(run.dir / "eval", rows, ["model", "test_set", *TABLE_COLUMNS])
    return {"rows": rows}
