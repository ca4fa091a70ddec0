"""The one entry point of `pacs train` and recipes/scst_pacs.py: the recipe pipeline or the embedded demo.

A config with a top-level `demo:` section runs the demo (`captioner.demo`); any other runs the recipe pipeline
(`captioner.orchestration.pipeline`). Sitting above both, it keeps the pipeline free of the demo.
"""
from __future__ import annotations

from typing import Any

from captioner import demo
from captioner.orchestration.pipeline import PipelineConfig, default_config_path, run_pipeline
from metric.common.config import config_data, deep_merge, from_dict, load_yaml, parse_overrides
from metric.common.config_files import resolve_config


def run_from_config(config_path: str | None, overrides: list[str], force: list[str] | None = None) -> dict[str, Any]:
    """Run the recipe of `config_path` (default: recipes/configs/demo.yaml) with `key=value` overrides.

    `force` names stages to re-run from scratch (added to the config's `force` list).
    """
    path = resolve_config(config_path) if config_path else default_config_path()
    data = deep_merge(load_yaml(path), parse_overrides(overrides))
    if "demo" in data:
        return demo.run_demo(str(path), list(overrides), force=list(force or []))
    config = from_dict(PipelineConfig, config_data(PipelineConfig, path, overrides), str(path))
    config.force = [*config.force, *(force or [])]
    if len(config.seeds) > 1:  # once per seed into run_dir/seed-<s>, the rows pooled into run_dir/seeds/
        from captioner.orchestration.seed_runs import run_seeds

        return run_seeds(config)
    if config.seeds:
        config.seed = config.seeds[0]
    return run_pipeline(config)
