"""`pacs train --dry-run` of the embedded demo: its stages in order, each reused, run or resumed and why, from the
fingerprints its run computes (`pacs.captioner.demo.pipeline`), with nothing written: no lock, config.yaml, logs,
images or stage records (`StageRunner.plan`)."""
from __future__ import annotations

import os
from typing import Any

from pacs.captioner.demo.captioning import normalised_label
from pacs.captioner.demo.pipeline import (
    expand_force,
    load_demo_config,
    metric_stage_parts,
    scst_stage_settings,
    seed_prefix,
    stage_names,
    xe_stage_settings,
)
from pacs.captioner.modeling.training_setup import micro_batch_for
from pacs.captioner.orchestration.stages import StageRunner, check_force, upstream_reason
from pacs.metric.common.device import accelerator_state
from pacs.rewards.slug import reward_slug

NOT_PLANNED = "unplanned"


def plan_demo(config_path: str | os.PathLike | None, overrides: list[str],
              force: list[str] | None = None) -> tuple[str, list[tuple[str, str, str]], list[str]]:
    """(run folder, [(stage, verdict, why)], [check]) of the demo run `run_demo` would make; writes nothing.

    The guarded SCST stages and `evaluate` are planned only as far as their upstream decides (a stage below one that
    runs runs too); their own fingerprints are computed while they run, so otherwise they say 'unplanned'.
    """
    config = load_demo_config(config_path, list(overrides))
    config.force = [*config.force, *(force or [])]
    state = accelerator_state(config.device)
    micro_batch_for(config.xe.batch_size, config.xe.micro_batch_size, state.num_processes, "demo.xe")
    micro_batch_for(config.scst.batch_size, config.scst.micro_batch_size, state.num_processes, "demo.scst")
    config.force = expand_force(config)
    names = stage_names(config)
    check_force(config.force, names)
    checks = ["config read and validated (every section, key and value)",
              f"micro-batch split of xe and scst over {state.num_processes} process(es)",
              f"--force names ({', '.join(config.force) or 'none'}) among the {len(names)} stages (check_force)"]
    run_dir = config.run_path()
    runner = StageRunner(run_dir, config.force, state, planning=True)
    for name, (settings, upstream) in metric_stage_parts(config).items():
        runner.plan(name, settings, upstream=upstream)
    if config.captioning:
        _plan_captioning(config, runner)
    planned = {name for name, _, _ in runner.planned}
    for name in names:
        if name not in planned:
            _plan_upstream_only(config, runner, name)
    runner.planned.sort(key=lambda entry: names.index(entry[0]))  # the order they run in
    return str(run_dir), runner.planned, checks


def _plan_captioning(config: Any, runner: StageRunner) -> None:
    """The features, XE and SCST stages of every seed (pacs' captioner; a transformers one is not planned)."""
    hf = config.captioner.transformers
    if not hf:
        runner.plan("features", {}, upstream=["clip"], resumable=True)
    for seed in config.seed_list():
        prefix = seed_prefix(config, seed)
        if hf:
            return
        xe = f"{prefix}xe"
        runner.plan(xe, xe_stage_settings(config, seed), upstream=["features"])
        for spec in config.scst.rewards:
            runner.plan(f"{prefix}scst-{reward_slug(spec)}", scst_stage_settings(config, seed, spec, {}),
                        upstream=[xe, "pacs"])
        for spec in config.scst.normalised_rewards:
            runner.plan(f"{prefix}scst-{normalised_label(spec)}",
                        scst_stage_settings(config, seed, spec, {}, normalised=True), upstream=[xe, "pacs"])


def _plan_upstream_only(config: Any, runner: StageRunner, name: str) -> None:
    """A stage whose fingerprint is computed while the run goes: 'run' when a stage it reads from would run."""
    if name == "evaluate":
        upstream = [n for n, _, _ in runner.planned if n not in ("data", "clip", "correlation", "features")]
    else:  # a guarded SCST stage, or a transformers captioner's init / xe: below its seed's xe and pacs
        prefix = name.split("/")[0] + "/" if "/" in name else ""
        upstream = [f"{prefix}xe", "pacs"]
    rerun = [u for u in upstream if u in runner.ran + runner.resumed]
    if config.captioner.transformers and name.rsplit("/", 1)[-1] in ("init", "xe"):
        runner.planned.append((name, NOT_PLANNED, "a transformers captioner's stages are not planned yet"))
        runner.ran.append(name)  # what reads from it cannot be known either
    elif rerun:
        runner.plan_unknown(name, upstream_reason(rerun))
    else:
        why = ("its settings come from the guarded runs' results, read when it runs" if name == "evaluate" else
               "its fingerprint is computed when it runs (guarded SCST / transformers captioner stages)")
        runner.planned.append((name, NOT_PLANNED, why))
