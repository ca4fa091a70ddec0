"""The embedded demo, end to end: world → tiny CLIP → PAC-S++ → correlation with the judge → grid features →
XE captioner → SCST per reward → evaluation → results table and report.html, each stage a fingerprinted
`pacs.captioner.orchestration.stages` stage of the run dir."""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pacs.captioner.demo import captioning, correlation, metric_stages
from pacs.captioner.demo.captioning import DEMO_COLUMNS, guarded_label, normalised_label
from pacs.captioner.demo.config import (
    DemoConfig,
    migrate_scst_monitors,
    migrate_xe_layout,
    recorded_settings,
    recorded_xe,
)
from pacs.captioner.demo.data import DemoData, write_images
from pacs.captioner.modeling.training_setup import micro_batch_for, process_state
from pacs.captioner.orchestration import findings, judge_correlation, results_files, run_records
from pacs.captioner.orchestration import guard_choice as guard_menu
from pacs.captioner.orchestration.seed_evidence import SeedEvidence, single_seed
from pacs.captioner.orchestration.seed_processes import each_seed, parallel_seed_count, threads_per_seed
from pacs.captioner.orchestration.stage_fingerprints import NOT_DETERMINING
from pacs.captioner.orchestration.stages import StageRunner, check_force
from pacs.eval.report import write_report
from pacs.eval.system_inputs import HUMAN_ROW
from pacs.metric.common.config import (
    deep_merge,
    dump_yaml,
    from_dict,
    load_yaml,
    parse_overrides,
    rename_deprecated,
    to_dict,
)
from pacs.metric.common.device import accelerator_state
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import write_json_atomic
from pacs.metric.common.provenance import provenance
from pacs.metric.common.run_lock import hold_run_directory
from pacs.metric.common.seeding import seed_everything
from pacs.metric.common.terminal import run_log
from pacs.metric.models.factory import load_backbone
from pacs.metric.scoring.registry import METRICS
from pacs.metric.scoring.scorer import Scorer
from pacs.rewards import build_reward
from pacs.rewards.registry import parse_reward_spec
from pacs.rewards.slug import reward_slug

logger = logging.getLogger(__name__)

REPO_CONFIGS = Path(__file__).resolve().parents[2] / "recipes" / "configs"


def load_demo_config(config_path: str | os.PathLike | None, overrides: list[str]) -> DemoConfig:
    """DemoConfig from the `demo:` section of a YAML (default recipes/configs/demo.yaml) plus overrides.

    Overrides may be written with or without the `demo.` prefix (`xe.max_steps=10` == `demo.xe.max_steps=10`).
    Deprecated keys (`DEPRECATED_ALIASES` of the sections, `xe.steps`) are renamed in each file on its own, before
    the `_base_` merge, and in the overrides, before they merge over the files: one warning per key, naming the file
    (or `override`); a file or override list giving both names of a setting is an InputError.
    """
    path = Path(config_path) if config_path else REPO_CONFIGS / "demo.yaml"
    data = load_yaml(path, normalize=_renamed_demo)
    if "demo" not in data:
        raise InputError(f"{path}: no top-level 'demo:' section")
    prefixed = [item if item.startswith("demo.") else f"demo.{item}" for item in overrides]
    merged = deep_merge(data, _renamed_demo(parse_overrides(prefixed), "override"))
    return from_dict(DemoConfig, merged["demo"], f"{path}:demo")


def _renamed_demo(data: dict[str, Any], source: str) -> dict[str, Any]:
    """`data` (a file's or the overrides' keys) with the deprecated keys of its `demo:` section renamed."""
    section = data.get("demo")
    if not isinstance(section, dict):
        return data
    where = source if source == "override" else f"{source}:demo"
    if "scst" in section:
        section = {**section, "scst": migrate_scst_monitors(section["scst"], where)}
    section = migrate_xe_layout(section, where)
    return {**data, "demo": rename_deprecated(DemoConfig, section, where)}


def run_demo(config_path: str | os.PathLike | None = None, overrides: list[str] | None = None,
             force: list[str] | None = None) -> dict[str, Any]:
    """Run (or resume) the demo of `config_path`; print the results table; return rows, run dir and stage info.

    `force` names stages to re-run from scratch (added to the config's `force` list).
    """
    config = load_demo_config(config_path, list(overrides or []))
    config.force = [*config.force, *(force or [])]
    return run_demo_config(config)


def _scorers(run_dir: Path, device: str = "cpu") -> dict[str, Any]:

    return {family: Scorer(load_backbone(checkpoint=str(run_dir / stage / "checkpoint.safetensors"), device=device),
                           device=device, progress=False) for family, stage in (("clip", "clip"), ("pac-s++", "pacs"))}


def stage_names(config: DemoConfig) -> list[str]:
    """The demo's stages, in the order they run."""

    if not config.captioning:
        return ["data", "clip", "pacs", "correlation"]
    hf = config.captioner.transformers  # a transformers captioner reads the images: no grid features; built in `init`
    per_seed = [*(["init"] if hf else []), "xe", *[f"scst-{reward_slug(spec)}" for spec in config.scst.rewards],
                *[f"scst-{normalised_label(spec)}" for spec in config.scst.normalised_rewards],
                *guarded_stage_names(config)]
    return ["data", "clip", "pacs", "correlation", *([] if hf else ["features"]),
            *[f"{seed_prefix(config, seed)}{name}" for seed in config.seed_list() for name in per_seed], "evaluate"]


def seed_prefix(config: DemoConfig, seed: int) -> str:
    """The folder of one seed's XE and SCST stages: `seed-<s>/` with several seeds, none with one (the layout of
    a single-seed run is unchanged)."""
    return f"seed-{seed}/" if len(config.seed_list()) > 1 else ""


def expand_force(config: DemoConfig) -> list[str]:
    """`force` with every name of a per-seed stage (`xe`, `scst-cider`) expanded to that stage of every seed."""
    stages = stage_names(config)
    out = []
    for name in config.force:
        seeded = [f"{seed_prefix(config, seed)}{name}" for seed in config.seed_list()]
        known = any(stage == name or stage.startswith(name.rstrip("/") + "/") for stage in stages)
        out.extend([name] if known or not all(stage in stages for stage in seeded) else seeded)
    return out


def guarded_stage_names(config: DemoConfig) -> list[str]:
    """The guarded SCST stages: one per guarded reward and KL coefficient (`scst-<reward>-kl<coef>`), per setting of
    each `guarded.grid` guard (`scst-<reward>-<guard><setting>`) and, with two guards or more, the best combination
    (`scst-<reward>-guards`)."""

    names = []
    for reward in config.guarded.rewards:
        spec = config.guarded.reward_spec(reward)
        names += [f"scst-{guarded_label(spec, coef)}" for coef in config.guarded.kl_coefs]
        names += [f"scst-{reward_slug(spec)}-{guard_menu.setting_label(key, value)}"
                  for key, values in config.guarded.grid.items() for value in values]
        names += [f"scst-{reward_slug(spec)}-{guard_menu.COMBINATION}"] if config.guarded.combines() else []
    return names


def run_demo_config(config: DemoConfig) -> dict[str, Any]:
    """Run every stage of the demo whose recorded fingerprint is missing or stale (see `pacs.captioner.orchestration.stages`).

    Process-aware: under `accelerate launch --num_processes N` the main process owns the run directory; the
    metric training, feature extraction, XE and SCST stages run on every process (each splits its work), the
    others (data, correlation, evaluation, report) on the main process while the rest wait.
    """

    state = accelerator_state(config.device)  # set up here (demo.device cpu: on the CPU); every stage runs on it
    world = state.num_processes
    xe_micro = micro_batch_for(config.xe.batch_size, config.xe.micro_batch_size, world, "demo.xe")
    scst_micro = micro_batch_for(config.scst.batch_size, config.scst.micro_batch_size, world, "demo.scst")
    config.force = expand_force(config)
    check_force(config.force, stage_names(config))
    run_dir = config.run_path()
    with hold_run_directory(run_dir, state):  # one run at a time: a second one stops here, naming this one
        log = run_log(run_dir / "logs" / RUN_LOG) if state.is_main_process else contextlib.nullcontext()
        with log:  # what the terminal leaves out (checkpoint chatter, repeated warnings) is kept there
            return _run_stages(config, state, run_dir, xe_micro, scst_micro)


RUN_LOG = "run.log"
"""The run's log file in `logs/` (every record at INFO and above; a seed process's own: `seed-<s>.log`)."""


def _run_stages(config: DemoConfig, state: Any, run_dir: Path, xe_micro: int, scst_micro: int) -> dict[str, Any]:
    """Every stage of the demo in `run_dir` (whose lock the caller holds), then the table and the report."""

    started = time.monotonic()
    torch.set_num_threads(max(1, config.threads))
    seed_everything(config.seed)
    logs = run_dir / "logs"
    if state.is_main_process:
        logs.mkdir(parents=True, exist_ok=True)
        dump_yaml(dataclasses.replace(config, force=[]), run_dir / "config.yaml")  # --force is not sticky
    state.wait_for_everyone()
    data = DemoData.build(config.world, run_dir / "data" / "images")
    runner = StageRunner(run_dir, config.force, state)
    features = _features_opener(config, runner.folder("features"))

    def scorers() -> dict[str, Any]:
        """New scorers for one stage: a stage starts from empty embedding caches, whatever ran before it in this
        process, so `--force STAGE` and a run from scratch compute it in the same batches (same floats)."""
        return _scorers(run_dir, str(state.device))

    parts = metric_stage_parts(config)
    runner.run("data", lambda: write_images(data, runner.folder("data")), parts["data"][0])
    runner.run("clip", lambda: metric_stages.pretrain_clip(config.clip, data, config.seed, config.prompt,
                                                           runner.folder("clip"), logs / "clip.csv"),
               parts["clip"][0], upstream=parts["clip"][1], distributed=True)
    runner.run("pacs", lambda: metric_stages.train_pacs(config.pacs, data, config.seed, config.prompt,
                                                        runner.folder("clip"), runner.folder("pacs"),
                                                        logs / "pacs.csv"),
               parts["pacs"][0], upstream=parts["pacs"][1], distributed=True)
    runner.run("correlation", lambda: correlation.run_correlation(config, data, scorers(),
                                                                  runner.folder("correlation")),
               parts["correlation"][0], upstream=parts["correlation"][1])

    if not config.captioning:  # a metric-only preset (e.g. demo_siglip.yaml): the correlation is the result
        return _finish_metrics_only(run_dir, runner, state)

    def extract() -> dict:

        backbone = load_backbone(checkpoint=str(runner.folder("clip") / "checkpoint.safetensors"),
                                 device=str(state.device))
        return captioning.extract_all_features(data, backbone, runner.folder("features"), accelerator=state)

    if not config.captioner.transformers:
        runner.run("features", extract, {}, upstream=["clip"], resumable=True, distributed=True)
    seeds = config.seed_list()
    parallel = parallel_seed_count(config.parallel_seeds, seeds, state)

    def in_turn(seed: int) -> tuple[dict[str, Path], dict[str, Any]]:
        """XE and every SCST of one seed, on the same data and models as every other seed."""
        seed_logs = _seed_logs(run_dir, seeds, seed)
        if state.is_main_process:
            seed_logs.mkdir(parents=True, exist_ok=True)
        return _run_seed(config, seed, data, runner, features, scorers, seed_logs, xe_micro, scst_micro)

    shared = {name: runner.ids[name] for name in SHARED_STAGES if name in runner.ids}
    worker = functools.partial(_seed_worker_stages, config, seeds, shared, xe_micro, scst_micro)
    done = each_seed(seeds, in_turn, worker, parallel, threads_per_seed(config.threads, parallel),
                     lambda seed: run_dir / "logs" / f"seed-{seed}.log")
    if parallel > 1:  # the stage records the seed processes wrote are this runner's as if it had run them
        done = {seed: _merge_seed_process(runner, result) for seed, result in done.items()}
    models = {seed: models_of for seed, (models_of, _) in done.items()}
    guard_choices = {seed: choices for seed, (_, choices) in done.items()}
    per_seed = [name for name in stage_names(config) if name not in SHARED_STAGES]
    runner.run("evaluate", lambda: _evaluate(config, data, models, _test_captioner(config, data, features),
                                             scorers(), run_dir, runner.folder("evaluate"), guard_choices),
               {"evaluate": to_dict(config.evaluate), "guarded": guard_choices if len(seeds) > 1
                else guard_choices[seeds[0]]},
               upstream=["pacs", *per_seed])
    report = run_dir / "report.html"
    if state.is_main_process:
        rows = _publish(run_dir, runner, config)
        report = write_report(run_dir, reuse=True)  # rebuilt only when its inputs changed
        print(results_markdown(json.loads((run_dir / "results.json").read_text(encoding="utf-8"))))
        print(stages_summary(runner, time.monotonic() - started))
        print(f"report: {report}")
    state.wait_for_everyone()
    rows = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))["rows"]
    return {"run_dir": str(run_dir), "rows": rows, "ran": runner.ran + runner.resumed, "skipped": runner.skipped,
            "seconds": runner.seconds, "report": str(report)}


def metric_stage_parts(config: DemoConfig) -> dict[str, tuple[dict[str, Any], list[str]]]:
    """{stage: (settings, upstream)} of the demo's first stages, data -> clip -> pacs -> correlation (their run and
    their plan, `pacs.captioner.demo.plan`)."""
    common = {"seed": config.seed, "prompt": config.prompt}
    return {"data": ({"world": to_dict(config.world)}, []),
            "clip": ({**common, "clip": recorded_settings(config.clip)}, ["data"]),
            "pacs": ({**common, "pacs": recorded_settings(config.pacs)}, ["clip"]),
            "correlation": ({**common, "correlation": to_dict(config.correlation)}, ["pacs"])}


def xe_stage_settings(config: DemoConfig, seed: int) -> dict[str, Any]:
    """The settings of one seed's XE stage of pacs' captioner (upstream: features); its run and its plan."""
    return {"seed": seed, "xe": recorded_xe(config)}


def scst_stage_settings(config: DemoConfig, seed: int, spec: str, extra: dict[str, Any],
                        normalised: bool = False) -> dict[str, Any]:
    """The settings of one seed's SCST stage of reward `spec` (`normalised`: each component normalised within
    the k samples); `extra`: what a transformers captioner adds. Its run and its plan."""
    scst = recorded_settings(config.scst, NOT_DETERMINING | {"rewards", "normalised_rewards"})
    return {"seed": seed, "scst": scst, "reward": spec,
            **({"mix_normalisation": "normalize_then_sum"} if normalised else {}), **extra}


SHARED_STAGES = ("data", "clip", "pacs", "correlation", "features", "evaluate")
"""The stages run once whatever the seeds (the others: once per seed)."""


def _features_opener(config: DemoConfig, folder: Path) -> Callable[[], Any]:
    """The grid features of a `features` stage's `folder`, opened on first use (None for a transformers captioner,
    which reads the images)."""

    lazy: dict[str, Any] = {}

    def features() -> Any:
        if config.captioner.transformers:
            return None
        if "features" not in lazy:
            lazy["features"] = captioning.open_features(folder)
        return lazy["features"]

    return features


def _test_captioner(config: DemoConfig, data: Any, features: Callable[[], Any]) -> Callable[[Path], dict[str, str]]:
    """model folder -> its captions of every test image (`evaluate.beam_size`): pacs' captioner over the grid
    features, or a transformers model's own `generate`."""

    if config.captioner.transformers:
        from pacs.captioner.demo import hf_captioner

        return lambda folder: hf_captioner.caption_test_set(folder, data, config)
    cache = features()
    return lambda folder: captioning.caption_test_set(folder, data, cache, config.evaluate.beam_size)


def _seed_logs(run_dir: Path, seeds: list[int], seed: int) -> Path:
    """Where a seed's training curves go: `logs/` for the first seed (the report draws them), else
    `seed-<s>/logs/`."""
    return run_dir / "logs" if seed == seeds[0] else run_dir / f"seed-{seed}" / "logs"


def _merge_seed_process(runner: Any, result: dict[str, Any]) -> tuple[dict[str, Path], dict[str, Any]]:
    """What one seed process's runner did (`_seed_worker_stages`), added to this runner; its models and choices."""
    runner.ids.update(result["ids"])
    runner.ran += result["ran"]
    runner.resumed += result["resumed"]
    runner.skipped += result["skipped"]
    runner.seconds.update(result["seconds"])
    return {name: Path(folder) for name, folder in result["models"].items()}, result["choices"]


def _seed_worker_stages(config: DemoConfig, seeds: list[int], shared: dict[str, str], xe_micro: int,
                        scst_micro: int, seed: int) -> dict[str, Any]:
    """One seed's stages in a process of its own (`pacs.captioner.orchestration.seed_processes`); what its runner
    did."""
    run_dir = config.run_path()
    data = DemoData.build(config.world, run_dir / "data" / "images")
    runner = StageRunner(run_dir, config.force)
    runner.ids.update(shared)
    features = _features_opener(config, runner.folder("features"))
    logs = _seed_logs(run_dir, seeds, seed)
    logs.mkdir(parents=True, exist_ok=True)
    models, choices = _run_seed(config, seed, data, runner, features, lambda: _scorers(run_dir), logs, xe_micro,
                                scst_micro)
    return {"models": {name: str(folder) for name, folder in models.items()}, "choices": choices,
            "ids": {name: value for name, value in runner.ids.items() if name not in shared},
            "ran": runner.ran, "resumed": runner.resumed, "skipped": runner.skipped, "seconds": runner.seconds}


def stages_summary(runner: Any, seconds: float | None = None) -> str:
    """The run's closing line: the stages that ran (named when a few did: a re-run), resumed and were reused,
    and the wall time; every stage's own line is in `logs/run.log`."""
    ran, resumed, reused = runner.ran, runner.resumed, runner.skipped
    named = f" ({', '.join(ran)})" if 0 < len(ran) <= SUMMARY_NAMES else ""
    parts = [f"stages: {len(ran)} run{named}", *([f"{len(resumed)} resumed"] if resumed else []),
             f"{len(reused)} reused"]
    return ", ".join(parts) + ("" if seconds is None else f" in {_duration(seconds)}")


SUMMARY_NAMES = 6
"""Up to this many stages run, `stages_summary` names them (a re-run after a change); more: a count."""


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes else f"{rest} s"


def _run_seed(config: DemoConfig, seed: int, data: Any, runner: Any, features: Any, scorers: Any, logs: Path,
              xe_micro: int, scst_micro: int) -> tuple[dict[str, Path], dict[str, Any]]:
    """One seed's XE, SCST and guarded SCST stages (`seed_prefix` folders); its models and guard choices."""

    prefix = seed_prefix(config, seed)
    xe = f"{prefix}xe"
    extra: dict[str, Any] = {}  # what a transformers captioner adds to every SCST stage's settings
    if config.captioner.transformers:  # stages `init` (random weights) and `xe` of a transformers model
        from pacs.captioner.demo import hf_captioner

        xe = hf_captioner.run_model_stages(config, seed, prefix, data, runner, logs, xe_micro)
        extra = hf_captioner.captioner_settings(config)
    else:
        runner.run(xe, lambda: captioning.run_xe(config, data, features(), runner.folder(xe), logs,
                                                 runner.folder("clip") / "checkpoint.safetensors", xe_micro,
                                                 seed=seed),
                   xe_stage_settings(config, seed), upstream=["features"], distributed=True)
    models = {"xe": runner.folder(xe) / "best"}
    scst_settings = recorded_settings(config.scst, NOT_DETERMINING | {"rewards", "normalised_rewards"})
    for spec in config.scst.rewards:
        name = f"{prefix}scst-{reward_slug(spec)}"
        runner.run(name, lambda spec=spec, name=name, fresh=scorers: captioning.run_scst(
                       config, data, features(), _reward(spec, data, fresh()), spec, runner.folder(xe),
                       runner.folder(name), logs, scst_micro, fresh(), seed=seed),
                   scst_stage_settings(config, seed, spec, extra), upstream=[xe, "pacs"], distributed=True)
        models[f"scst {spec}"] = runner.folder(name) / "final"
    for spec in config.scst.normalised_rewards:  # the same SCST, each component normalised within the k samples
        name = f"{prefix}scst-{captioning.normalised_label(spec)}"
        runner.run(name, lambda spec=spec, name=name, fresh=scorers: captioning.run_scst(
                       config, data, features(), _reward(spec, data, fresh()), spec, runner.folder(xe),
                       runner.folder(name), logs, scst_micro, fresh(), seed=seed,
                       mix_normalisation="normalize_then_sum"),
                   scst_stage_settings(config, seed, spec, extra, normalised=True), upstream=[xe, "pacs"],
                   distributed=True)
        models[captioning.normalised_model_name(spec)] = runner.folder(name) / "final"
    choices = _run_guarded(config, seed, data, runner, features, scorers, logs, scst_micro,
                           {"scst": scst_settings, **extra}, models)
    return models, choices


def correlation_markdown(run_dir: Path) -> str:
    """Kendall tau of every metric against the judge, the paired comparisons, and the long-caption subset."""
    return judge_correlation.correlation_markdown(judge_correlation.read_correlation(run_dir / "correlation"),
                                                  "correlation")


def _finish_metrics_only(run_dir: Path, runner: Any, state: Any) -> dict[str, Any]:
    """End of a metric-only run: print the correlation tables and findings, write the report."""

    report = run_dir / "report.html"
    if state.is_main_process:
        report = write_report(run_dir, reuse=True)
        print(correlation_markdown(run_dir))
        print(stages_summary(runner))
        print(f"report: {report}")
    state.wait_for_everyone()
    return {"run_dir": str(run_dir), "rows": [], "ran": runner.ran + runner.resumed, "skipped": runner.skipped,
            "seconds": runner.seconds, "report": str(report)}


def _run_guarded(config: DemoConfig, seed: int, data: Any, runner: Any, features: Any, scorers: Any, logs: Path,
                 scst_micro: int, settings: dict[str, Any], models: dict[str, Path]) -> dict[str, Any]:
    """One seed's guarded SCST stages (`settings`: what every SCST stage of the seed records, its `scst` section
    first); adds each guarded reward's chosen runs (`guard_choice`: best validation CIDEr-D) to `models`."""

    choices: dict[str, Any] = {}
    xe = f"{seed_prefix(config, seed)}xe"
    for reward in config.guarded.rewards:
        spec = config.guarded.reward_spec(reward)

        def train(guard: dict[str, Any], name: str, reward: str = reward) -> dict[str, Any]:
            run_spec, label = config.guarded.reward_spec(reward, guard), name.rsplit("/", 1)[-1].removeprefix("scst-")
            runner.run(name, lambda fresh=scorers: captioning.run_scst(
                           config, data, features(), _reward(run_spec, data, fresh()), run_spec, runner.folder(xe),
                           runner.folder(name), logs, scst_micro, fresh(), seed=seed, guard=guard, label=label),
                       {"seed": seed, **settings, "reward": run_spec, "guard": guard_menu.scst_keys(guard)},
                       upstream=[xe, "pacs"], distributed=True)
            return run_records.section(runner.record(name), "summary", runner.record_path(name))

        choices[reward], menu = seed_guard_choice(config, seed, reward, train, runner.folder)
        if process_state().is_main_process:  # the record of the choice (the KL grid alone too)
            write_json_atomic(runner.run_dir / f"{seed_prefix(config, seed)}guard_choice-{reward_slug(spec)}.json",
                              menu)
        for model, stage in guarded_row_stages(config, seed, reward, choices[reward]).items():
            # the record's `summary.model` is data: inside the stage's folder, and the model that stage wrote
            models[model] = run_records.recorded_model(runner.run_dir, stage, runner.record(stage),
                                                       runner.record_path(stage))
    return choices


def guarded_stage_name(config: DemoConfig, seed: int, spec: str, coef: float) -> str:
    """The stage of one seed's guarded SCST run of reward `spec` at KL coefficient `coef`."""

    return f"{seed_prefix(config, seed)}scst-{captioning.guarded_label(spec, coef)}"


def guard_choice(spec: str, summaries: dict[float, dict[str, Any]]) -> dict[str, Any]:
    """The choice among one guarded reward's runs (`summaries[kl_coef]`: their stage summaries) by validation
    CIDEr-D, as the `evaluate` stage records it."""

    chosen = captioning.choose_guarded(summaries)
    return {"spec": spec, "chosen_kl_coef": chosen,
            "val_cider": {f"{coef:g}": s.get("best_val_cider") for coef, s in summaries.items()},
            "best_step": {f"{coef:g}": s.get("best_step") for coef, s in summaries.items()},
            # the chosen run's share of steps whose reward had no spread within the k samples
            "zero_spread_fraction": summaries[chosen].get("zero_spread_fraction")}


def seed_guard_choice(config: DemoConfig, seed: int, reward: str, summary_of: Callable[[dict[str, Any], str], dict],
                      folder_of: Callable[[str], Path]) -> tuple[dict[str, Any], dict[str, Any]]:
    """One seed's choice among the guarded runs of `reward` and the record of it (`guard_choice-<reward>.json`).

    `summary_of(guard, stage)` gives a guarded run's stage summary (a run trains it, pooling reads its verified
    record); `folder_of(stage)` its folder. The same choice whether the seed is trained or pooled.
    """
    spec = config.guarded.reward_spec(reward)
    summaries = {coef: summary_of({"kl_coef": coef}, guarded_stage_name(config, seed, spec, coef))
                 for coef in config.guarded.kl_coefs}
    choice = guard_choice(spec, summaries) if summaries else {"spec": spec}
    menu = _guard_menu(config, seed, reward, spec, summaries, summary_of, folder_of)
    if summaries:  # one rule for every guard: the KL row too follows the record (ties: fewest signatures)
        choice["chosen_kl_coef"] = menu["choices"]["kl_coef"]["chosen"]
    if config.guarded.grid:  # (the KL grid alone keeps the choices, and the evaluate fingerprint, of before)
        choice["guards"] = menu
    return choice, menu


def _guard_menu(config: DemoConfig, seed: int, reward: str, spec: str, kl: dict[float, dict[str, Any]],
                train: Callable[..., dict[str, Any]], folder_of: Callable[[str], Path]) -> dict[str, Any]:
    """Every `guarded.grid` guard trained at each setting, each guard's choice on validation and the best
    combination (`guard_choice`): the record of `seed_guard_choice`."""

    prefix, slug = seed_prefix(config, seed), reward_slug(spec)
    stages: dict[str, dict[Any, str]] = {"kl_coef": {coef: guarded_stage_name(config, seed, spec, coef)
                                                     for coef in kl}} if kl else {}
    summaries: dict[str, dict[Any, dict[str, Any]]] = {"kl_coef": kl} if kl else {}
    for key, values in config.guarded.grid.items():
        stages[key] = {value: f"{prefix}scst-{slug}-{guard_menu.setting_label(key, value)}" for value in values}
        summaries[key] = {value: train({key: value}, stages[key][value]) for value in values}
    record: dict[str, Any] = {"reward": reward, "spec": spec, "seed": seed, "criterion": guard_menu.CRITERION,
                              "choices": {}, "rows": {}}
    for key, by_value in summaries.items():
        candidates = [{"setting": value, "stage": stages[key][value],
                       **_candidate_evidence(folder_of(stages[key][value]), summary)}
                      for value, summary in by_value.items()]
        record["choices"][key] = guard_menu.choice_record(reward, seed, key, candidates)
        row = findings.guarded_model_name(reward) if key == "kl_coef" else guard_menu.row_name(reward, key)
        record["rows"][row] = record["choices"][key]["chosen_stage"]
    if config.guarded.combines():
        combined = guard_menu.combination(record["choices"])
        name = f"{prefix}scst-{slug}-{guard_menu.COMBINATION}"
        summary = train(combined, name)
        record["combination"] = {"rule": "every guard at its chosen setting (a setting that turns it off left out)",
                                 "settings": combined, "stage": name,
                                 **_candidate_evidence(folder_of(name), summary)}
        record["rows"][guard_menu.combination_row(reward)] = name
    return record


def _candidate_evidence(folder: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """A guarded run's validation values for the choice: as its summary recorded them, else (a KL run) from its
    own hacking monitor (`folder/monitor.csv`, validation images) at its selected step; and its reward spread."""
    from pacs.captioner.modeling.hacking_monitor import read_monitor_rows
    from pacs.captioner.modeling.train_scst import SCSTConfig, gaming_thresholds

    found = {key: summary[key] for key in ("selected_step", "val_cider", "signatures") if key in summary}
    if not found:
        found = guard_menu.evidence(read_monitor_rows(folder / "monitor.csv"), int(summary.get("best_step") or 0),
                                      gaming_thresholds(SCSTConfig()))
        if summary.get("best_val_cider") is not None:  # the value the run selected its checkpoint by
            found["val_cider"] = summary["best_val_cider"]
    return {**found, "zero_spread_fraction": summary.get("zero_spread_fraction")}


def guarded_row_stages(config: DemoConfig, seed: int, reward: str, choice: dict[str, Any]) -> dict[str, str]:
    """Each guarded row of `reward` (one seed) -> the stage whose model it reports."""

    menu = choice.get("guards")
    if menu is not None:
        return dict(menu["rows"])
    return {findings.guarded_model_name(reward): guarded_stage_name(config, seed, choice["spec"],
                                                                     choice["chosen_kl_coef"])}


def _guarded_rows_of(config: DemoConfig) -> dict[str, tuple[str, str]]:
    """Every guarded row's key (the KL row: its reward; the others: the row's name) -> (reward, row)."""

    rows: dict[str, tuple[str, str]] = {}
    for reward in config.guarded.rewards:
        if config.guarded.kl_coefs:
            rows[reward] = (reward, findings.guarded_model_name(reward))
        for key in config.guarded.grid:
            rows[guard_menu.row_name(reward, key)] = (reward, guard_menu.row_name(reward, key))
        if config.guarded.combines():
            rows[guard_menu.combination_row(reward)] = (reward, guard_menu.combination_row(reward))
    return rows


def _rows_by_reward(config: DemoConfig) -> dict[str, list[str]]:
    """Each guarded reward's guarded rows."""

    rows: dict[str, list[str]] = {}
    for reward, model in _guarded_rows_of(config).values():
        rows.setdefault(reward, []).append(model)
    return rows


def _row_spread(choice: dict[str, Any], model: str) -> float | None:
    """The recorded reward-spread share of the run behind guarded row `model` (None: not recorded)."""

    menu = choice.get("guards")
    if menu is None:
        return choice.get("zero_spread_fraction")
    stage = menu["rows"].get(model)
    runs = [c for record in menu["choices"].values() for c in record["candidates"]]
    runs += [menu["combination"]] if "combination" in menu else []
    return next((run.get("zero_spread_fraction") for run in runs if run["stage"] == stage), None)


def _reward(spec: str, data: Any, scorers: dict[str, Any]) -> Any:

    train = {item.image_id: item.references for item in data.splits["train"]}
    paths = {**data.image_paths("train"), **data.image_paths("val")}  # val: the guarded runs' hacking monitor

    for name, _ in parse_reward_spec(spec):  # each contrastive reward is scored by its own family's model
        if name in METRICS and METRICS[name].family not in scorers:
            raise InputError(f"scst.rewards: {spec!r} needs a {METRICS[name].family} model; the demo trains only "
                             f"{', '.join(sorted(scorers))}")
    return build_reward(spec, train_references=train, image_paths=paths, scenes=data.scenes(),
                        scorers={name: scorers[m.family] for name, m in METRICS.items() if m.family in scorers})


def evaluate_seed_models(config: DemoConfig, data: Any, models: dict[int, dict[str, Path]],
                         guarded: dict[int, dict[str, Any]], metric_run: Path, out: Path) -> dict:
    """The `evaluate` stage's work on finished models (`models[seed][row]`, `guarded[seed]`: the guard choices)
    into `out`, captioning over and scoring with the metric stages of the run `metric_run` (`pacs.captioner.demo.pooling`
    pools several runs' seeds through it)."""
    features = _features_opener(config, metric_run / "features")
    return _evaluate(config, data, models, _test_captioner(config, data, features), _scorers(metric_run), out, out,
                     guarded)  # the gallery too goes to `out`: nothing is written into `metric_run`


def _evaluate(config: DemoConfig, data: Any, models: dict[int, dict[str, Path]],
              caption: Callable[[Path], dict[str, str]], scorers: dict[str, Any], run_dir: Path, out: Path,
              guarded: dict[int, dict[str, Any]]) -> dict:
    """Stage `evaluate`: every seed's models' test captions and the human baseline (one reference per test image,
    drawn with `seed`) scored in one system-level table per seed by `pacs.eval.system_table` (the code path of `pacs
    evaluate --candidates NAME=FILE ... --human-baseline`; `captioning.evaluate_systems`; several seeds:
    `evaluate/seed-<s>/`), the judge's columns per row; then every row, difference against XE and against the
    human row and reward gain over seeds and images (`pacs.captioner.orchestration.seed_evidence`), the findings from those intervals
    (`findings.finding_records`), and the gallery (the first seed's captions)."""

    seeds = list(models)
    resamples = config.evaluate.bootstrap_resamples
    evaluations = []
    for seed in seeds:
        captions = {name: caption(folder) for name, folder in models[seed].items()}  # `_test_captioner`
        folder = out / f"seed-{seed}" if len(seeds) > 1 else out
        evaluations.append(captioning.evaluate_systems(captions, data, scorers, folder, config.seed, resamples))
        if len(seeds) > 1:
            write_json_atomic(folder / "captions.json", evaluations[-1].captions)
    names = list(evaluations[0].scores)  # table order: the models, then the human row
    per_image = {name: [evaluation.per_image(name) for evaluation in evaluations] for name in names}
    bleu = {name: [None if name == HUMAN_ROW else evaluation.scores[name].bleu for evaluation in evaluations]
            for name in names}
    pairs = [(spec, findings.scst_model_name(spec)) for spec in config.scst.rewards]
    pairs += [(spec, captioning.normalised_model_name(spec)) for spec in config.scst.normalised_rewards]
    pairs += list(_guarded_rows_of(config).values())
    evidence = SeedEvidence(per_image, bleu, DEMO_COLUMNS, resamples, config.seed)
    pooled = evidence.view(pairs, HUMAN_ROW)
    views = {seed: pooled} if len(seeds) == 1 else {
        seed: SeedEvidence(*single_seed(per_image, bleu, index), DEMO_COLUMNS, resamples, config.seed).view(
            pairs, HUMAN_ROW) for index, seed in enumerate(seeds)}
    rows = []
    for name in names:
        entry = pooled["rows"][name]
        row: dict[str, Any] = {"model": name, **{c: entry["value"].get(c) for c in DEMO_COLUMNS}}
        if "delta" in entry:
            row.update(delta=entry["delta"], ci=entry["ci"], delta_per_seed=entry["delta_per_seed"])
        row.update(value_ci=entry["value_ci"], per_seed=entry["per_seed"])
        rows.append(row)
    guarded_rows = {key: model for key, (_, model) in _guarded_rows_of(config).items()}
    flat = {key: {str(seed): _flat_share(_row_spread(guarded[seed].get(reward, {}), model), models[seed].get(model))
                  for seed in seeds}
            for key, (reward, model) in _guarded_rows_of(config).items()}
    oracle = pooled["rows"].get(pooled["oracle"] or "", {}).get("ci", {}).get(findings.JUDGE)
    if oracle is not None and findings.direction(oracle) <= 0:  # what SCST reaches when the reward is right
        logger.warning("the oracle %s did not raise judge accuracy beyond noise (%s): the SCST settings (steps, lr, "
                       "samples), not the rewards, bound what any reward can show", pooled["oracle"], oracle)
    inert = {key: unguarded for key, (reward, model) in _guarded_rows_of(config).items()
             for unguarded in [findings.scst_model_name(reward)] if reward in config.scst.rewards
             and all(e.captions.get(model) == e.captions.get(unguarded) for e in evaluations)}
    records = findings.finding_records(pooled, {str(seed): view for seed, view in views.items()}, guarded_rows, flat,
                                       inert=inert)
    normalised = _normalisation_comparisons(config, evidence)
    gains = [gain for gain in pooled["gains"] if gain["model"] not in guarded_rows.values()]
    guarded_gains = [gain for gain in pooled["gains"] if gain["model"] in guarded_rows.values()]
    versus_human = {name: {"delta": entry["versus_human"]["delta"], "ci": entry["versus_human"]["ci"]}
                    for name, entry in pooled["rows"].items() if entry.get("versus_human", {}).get("delta")}
    intervals = {name: {"value_ci": entry["value_ci"], **versus_human.get(name, {})}
                 for name, entry in pooled["rows"].items()}
    first = evaluations[0]
    table = first.table
    write_json_atomic(out / "captions.json", first.captions)
    write_json_atomic(out / "results.json", {
        "columns": DEMO_COLUMNS, "rows": rows, "baseline": findings.BASELINE, "bootstrap_resamples": resamples,
        "seeds": seeds, "bootstrap": evidence.boot.describe(),
        "seed_rows": [{"model": name, "seed": seed, **evaluation.row(name)}
                      for seed, evaluation in zip(seeds, evaluations) for name in names],
        "per_seed": {str(seed): {"rows": {name: {k: v for k, v in entry.items() if k in ("delta", "ci")}
                                          for name, entry in view["rows"].items()},
                                 "reward_gains": view["gains"]} for seed, view in views.items()},
        "reward_gains": gains, "share_of_oracle": pooled["share_of_oracle"], "oracle": pooled["oracle"],
        "guarded": {"choices": guarded[seeds[0]], "choices_by_seed": {str(s): guarded[s] for s in seeds},
                    "reward_gains": guarded_gains, "flat_reward_steps": flat,
                    **({"verdicts": findings.guard_verdicts(records, _rows_by_reward(config))}
                       if config.guarded.grid else {})},
        "findings": records, "replication": findings.replication_summary(records),
        "mix_normalisation": normalised,
        "human_baseline": {**table["human_baseline"], "row": HUMAN_ROW, "header": table["header"],
                           "system_table": "evaluate/system_table.json" if len(seeds) == 1
                           else f"evaluate/seed-{seeds[0]}/system_table.json"},
        "versus_human": versus_human,
        "system_table": captioning.display_table(first, rows, intervals, DEMO_COLUMNS),
        "provenance": provenance(config=to_dict(config), seed=config.seed)})
    captioning.write_gallery(run_dir, data, first, config.evaluate.gallery_size)
    return {"models": list(models[seeds[0]]), "seeds": seeds, "images": len(first.image_ids)}


def _normalisation_comparisons(config: DemoConfig, evidence: Any) -> list[dict[str, Any]]:
    """Judge-acc of each `scst.normalised_rewards` run against the weighted-sum run of the same reward (when
    `scst.rewards` trains it too): the paired difference (normalised − weighted sum) over seeds and images."""

    out = []
    for spec in config.scst.normalised_rewards:
        if spec not in config.scst.rewards:
            continue
        model, versus = captioning.normalised_model_name(spec), findings.scst_model_name(spec)
        found = evidence.estimate(model, findings.JUDGE, versus)
        if found is not None:
            out.append({"reward": spec, "model": model, "versus": versus, "column": findings.JUDGE,
                        "delta": found.point, "ci": list(found.interval), "per_seed": list(found.per_seed)})
    return out


def _flat_share(recorded: float | None, model_folder: Path | None) -> float:
    """The share of an SCST run's steps whose reward had no spread: as its stage recorded it (the spread within
    each image's k samples, `zero_spread_fraction`), else the share of logged steps whose `reward_std` (over the
    whole batch) was 0 in its log.csv."""
    if recorded is not None:
        return float(recorded)
    if model_folder is None:
        return 0.0
    log = model_folder.parent / "log.csv"
    if not log.is_file():
        return 0.0
    with log.open(encoding="utf-8") as handle:
        spreads = [row.get("reward_std") for row in csv.DictReader(handle)]
    values = [float(v) for v in spreads if v not in (None, "")]
    return sum(v == 0.0 for v in values) / len(values) if values else 0.0


def _publish(run_dir: Path, runner: Any, config: DemoConfig) -> list[dict[str, Any]]:
    """Copy the evaluation table to the run dir as results.{json,csv,md} (+ stage timings)."""
    results = json.loads((run_dir / "evaluate" / "results.json").read_text(encoding="utf-8"))
    results_files.write_results(run_dir, results, ["model", *DEMO_COLUMNS], DEMO_DIGITS)
    write_json_atomic(run_dir / "stages.json", {"ran": runner.ran, "resumed": runner.resumed, "skipped": runner.skipped,
                                                "seconds": {k: round(v, 1) for k, v in runner.seconds.items()},
                                                "keys": runner.ids})
    return results["rows"]


DEMO_DIGITS = 2
"""Decimals of the demo table's values in results.md and on the terminal (the README's and docs' blocks)."""


def results_markdown(results: dict[str, Any]) -> str:
    """The demo's printed results (`pacs.captioner.orchestration.results_files.results_markdown`, 2 decimals)."""
    return results_files.results_markdown(results, ["model", *DEMO_COLUMNS], DEMO_DIGITS)
