"""The one entry point of `pacs train` and recipes/scst_pacs.py: the recipe pipeline or the embedded demo.

A config with a top-level `demo:` section runs the demo (`pacs.captioner.demo`); any other runs the recipe pipeline
(`pacs.captioner.orchestration.pipeline`). Sitting above both, it keeps the pipeline free of the demo.
"""
from __future__ import annotations

from typing import Any

from pacs.captioner import demo
from pacs.captioner.demo import world_source  # noqa: F401  (registers the data set demo-world and its judge)
from pacs.captioner.orchestration.pipeline import PipelineConfig, default_config_path, plan_stages, run_pipeline
from pacs.captioner.orchestration.pipeline_config import made_checkpoints
from pacs.metric.common.config import config_data, deep_merge, from_dict, load_yaml, parse_overrides
from pacs.metric.common.config_files import resolve_config
from pacs.metric.scoring import decode_pool


def run_from_config(config_path: str | None, overrides: list[str], force: list[str] | None = None) -> dict[str, Any]:
    """Run the recipe of `config_path` (default: recipes/configs/demo.yaml) with `key=value` overrides.

    `force` names stages to re-run from scratch (added to the config's `force` list).
    """
    try:
        return _run_config(config_path, overrides, force)
    finally:  # a launched process exits when its run ends: no decoding workers left behind (decode_pool._stop)
        decode_pool.close_all()


def _run_config(config_path: str | None, overrides: list[str], force: list[str] | None) -> dict[str, Any]:
    """`run_from_config`'s run, the decoding pools left to the caller to close."""
    import time

    started = time.time()  # the report's provenance: this invocation's wall time
    path = resolve_config(config_path) if config_path else default_config_path()
    data = deep_merge(load_yaml(path), parse_overrides(overrides))
    if "demo" in data:
        result = demo.run_demo(str(path), list(overrides), force=list(force or []))
        if _record_provenance(result.get("run_dir"), started, {k: result[k] for k in ("ran", "skipped")
                                                               if isinstance(result.get(k), list)}):
            from pacs.eval.report import write_report

            result["report"] = str(write_report(result["run_dir"], reuse=True))  # with the provenance on it
        return result
    config = from_dict(PipelineConfig, config_data(PipelineConfig, path, overrides), str(path))
    config.force = [*config.force, *(force or [])]
    if len(config.seeds) > 1:  # once per seed into run_dir/seed-<s>, the rows pooled into run_dir/seeds/
        from pacs.captioner.orchestration.seed_runs import run_seeds

        return {**run_seeds(config), **_recipe_outputs(config, started, "seeds")}
    if config.seeds:
        config.seed = config.seeds[0]
    result = run_pipeline(config)
    sources = result.pop("gallery_sources", None)
    return {**result, **_recipe_outputs(config, started, sources=sources)}


def plan_from_config(config_path: str | None, overrides: list[str], force: list[str] | None = None) -> str:
    """`pacs train --dry-run`: the stages of the run `run_from_config` would make, in order, each reused, run,
    resumed or refused and why, and the checks that ran; nothing is written (no run folder, lock, log or record)."""
    path = resolve_config(config_path) if config_path else default_config_path()
    data = deep_merge(load_yaml(path), parse_overrides(overrides))
    if "demo" in data:
        from pacs.captioner.demo.plan import plan_demo

        run_dir, planned, checks = plan_demo(str(path), list(overrides), force=list(force or []))
        return format_plan(run_dir, planned, checks)
    config = from_dict(PipelineConfig, config_data(PipelineConfig, path, overrides), str(path))
    config.force = [*config.force, *(force or [])]
    if len(config.seeds) > 1:
        from pacs.captioner.orchestration.seed_runs import seed_configs

        parts, pending, made = [], "", []
        for index, (seed, seed_config) in enumerate(seed_configs(config)):
            planned, checks = plan_stages(seed_config, pending, made)
            parts.append(format_plan(seed_config.run_dir, planned, checks, f"seed {seed}: "))
            features = [name for name, verdict, _ in planned if name.startswith("features/") and verdict != "reuse"]
            if index == 0 and features and not config.features.cache_dir:  # the other seeds read the first's features
                pending = f"its features are seed {seed}'s, which this run makes first ({', '.join(features)})"
            if index == 0:  # and its metric_training checkpoints, made before the others start
                made = [*made_checkpoints(seed_config)]
        return "\n".join(parts)
    if config.seeds:
        config.seed = config.seeds[0]
    planned, checks = plan_stages(config)
    return format_plan(config.run_dir, planned, checks)


def format_plan(run_dir: str, planned: list[tuple[str, str, str]], checks: list[str], label: str = "") -> str:
    """The dry run's text: the checks, then one line per stage (verdict, name, why), then the counts."""
    from collections import Counter

    from pacs.metric.common.terminal import escape_control

    width = max((len(name) for name, _, _ in planned), default=0)
    lines = [f"{label}dry run of {run_dir} (nothing written)", "checks passed:",
             *[f"  - {check}" for check in checks], "stages, in order:"]
    verdicts = max([len("refused"), *(len(verdict) for _, verdict, _ in planned)])
    lines += [f"  {verdict:<{verdicts}} {name:<{width}}  {why}" for name, verdict, why in planned]
    counts = Counter(verdict for _, verdict, _ in planned)
    lines.append("would " + ", ".join(f"{verb} {counts[key]}" for key, verb in
                                      (("run", "run"), ("resume", "resume"), ("reuse", "reuse"),
                                       ("refused", "refuse"), ("unplanned", "leave unplanned")) if counts[key]))
    return "\n".join(escape_control(line) for line in lines)  # a stage or path name prints no control character


def _record_provenance(run_dir: str | None, started: float, stages: dict[str, Any] | None = None) -> bool:
    """Write the run's provenance.json (main process; `pacs.eval.report_provenance`); whether it was written."""
    from pacs.captioner.modeling.training_setup import process_state
    from pacs.eval.report_provenance import record_provenance

    if not run_dir or not process_state().is_main_process:
        return False
    record_provenance(run_dir, started, stages=stages)
    return True


def _recipe_outputs(config: PipelineConfig, started: float, folder: str = "eval",
                    sources: dict[str, Any] | None = None) -> dict[str, Any]:
    """The finished recipe's files (main process): its results table and results.json (in `folder`: `eval`, or
    `seeds` for a run over several seeds), the gallery and provenance the report shows, and report.html (written
    now, or kept when its inputs did not change)."""
    from pathlib import Path

    from pacs.captioner.modeling.training_setup import process_state
    from pacs.captioner.orchestration.recipe_gallery import write_recipe_gallery
    from pacs.eval.report import write_report

    if not process_state().is_main_process:
        return {}
    run_dir = Path(config.run_dir)
    write_recipe_gallery(config, folder, sources)
    _record_provenance(str(run_dir), started)
    results = run_dir / folder / "results.json"
    table = results.with_name("results.md")
    report = write_report(run_dir, reuse=True)
    return {"run_dir": str(run_dir), "results": str(results), "report": str(report),
            "table": table.read_text(encoding="utf-8") if table.is_file() else ""}


def run_summary(result: dict[str, Any]) -> str:
    """What `pacs train` prints when a run finishes: the recipe's results table (the demo printed its own), then
    the paths of results.json and report.html (empty on the processes other than the main one)."""
    from pathlib import Path

    from pacs.captioner.modeling.training_setup import process_state

    if not result.get("report") or not process_state().is_main_process:
        return ""
    if "table" not in result:  # the demo printed its table and report path
        return f"results: {Path(result['run_dir']) / 'results.json'}"
    lines = [result["table"].rstrip()] if result["table"] else []
    return "\n".join([*lines, f"results: {result['results']}", f"report: {result['report']}"])
