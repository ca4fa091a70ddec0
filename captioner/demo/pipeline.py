"""The embedded demo, end to end: world → tiny CLIP → PAC-S++ → correlation with the judge → grid features →
XE captioner → SCST per reward → evaluation → results table and report.html, each stage cached in the run dir."""
from __future__ import annotations

import csv
import io
import logging
import os
from pathlib import Path
from typing import Any

import torch

from captioner.demo.config import DemoConfig
from metric.common.config import deep_merge, dump_yaml, from_dict, load_yaml, parse_overrides, to_dict
from metric.common.errors import InputError
from metric.common.io import write_json_atomic, write_text_atomic
from metric.common.provenance import provenance
from metric.common.seeding import seed_everything

logger = logging.getLogger(__name__)

TABLE_COLUMNS = ["B-4", "C", "CLIP-S", "PAC-S++", "RefCLIP-S", "RefPAC-S++", "Rep-1", "Rep-2", "Rep-3", "Rep-4",
                 "%Incorrect", "Judge-acc", "Judge", "Halluc.", "Length"]
REPO_CONFIGS = Path(__file__).resolve().parents[2] / "recipes" / "configs"


def load_demo_config(config_path: str | os.PathLike | None, overrides: list[str]) -> DemoConfig:
    """DemoConfig from the `demo:` section of a YAML (default recipes/configs/demo.yaml) plus overrides.

    Overrides may be written with or without the `demo.` prefix (`xe.steps=10` == `demo.xe.steps=10`).
    """
    path = Path(config_path) if config_path else REPO_CONFIGS / "demo.yaml"
    data = load_yaml(path)
    if "demo" not in data:
        raise InputError(f"{path}: no top-level 'demo:' section")
    prefixed = [item if item.startswith("demo.") else f"demo.{item}" for item in overrides]
    merged = deep_merge(data, parse_overrides(prefixed))
    return from_dict(DemoConfig, merged["demo"], f"{path}:demo")


def run_demo(config_path: str | os.PathLike | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """Run (or resume) the demo of `config_path`; print the results table; return rows, run dir and stage info."""
    config = load_demo_config(config_path, list(overrides or []))
    return run_demo_config(config)


def _scorers(run_dir: Path) -> dict[str, Any]:
    from metric.backbones import load_backbone
    from metric.scorer import Scorer

    return {"clip": Scorer(load_backbone(checkpoint=str(run_dir / "clip" / "checkpoint.safetensors")), progress=False),
            "pac-s++": Scorer(load_backbone(checkpoint=str(run_dir / "pacs" / "checkpoint.safetensors")),
                              progress=False)}


def run_demo_config(config: DemoConfig) -> dict[str, Any]:
    """Run every stage of the demo whose cached output is missing or stale."""
    from captioner.demo import captioning, correlation, metric_stages
    from captioner.demo.data import DemoData, write_images
    from captioner.demo.stages import StageRunner
    from eval.report import write_report

    torch.set_num_threads(max(1, config.threads))
    seed_everything(config.seed)
    run_dir = Path(config.runs_dir) / config.name
    logs = run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    dump_yaml(config, run_dir / "config.yaml")
    data = DemoData.build(config.world, run_dir / "data" / "images")
    runner = StageRunner(run_dir)
    lazy: dict[str, Any] = {}

    def scorers() -> dict[str, Any]:
        if "scorers" not in lazy:
            lazy["scorers"] = _scorers(run_dir)
        return lazy["scorers"]

    def features():
        if "features" not in lazy:
            lazy["features"] = captioning.open_features(runner.folder("features"))
        return lazy["features"]

    common = {"seed": config.seed, "prompt": config.prompt}
    runner.run("data", {"world": to_dict(config.world)}, [], lambda out: write_images(data, out))
    runner.run("clip", {**common, "clip": to_dict(config.clip)}, ["data"],
               lambda out: metric_stages.pretrain_clip(config, data, out, logs))
    runner.run("pacs", {**common, "pacs": to_dict(config.pacs)}, ["clip"],
               lambda out: metric_stages.train_pacs(config, data, runner.folder("clip"), out, logs))
    runner.run("correlation", {**common, "correlation": to_dict(config.correlation)}, ["pacs"],
               lambda out: correlation.run_correlation(config, data, scorers(), out))

    def extract(out: Path) -> dict:
        from metric.backbones import load_backbone

        backbone = load_backbone(checkpoint=str(runner.folder("clip") / "checkpoint.safetensors"))
        return captioning.extract_all_features(data, backbone, out)

    runner.run("features", {}, ["clip"], extract)
    runner.run("xe", {"seed": config.seed, "xe": to_dict(config.xe)}, ["features"],
               lambda out: captioning.run_xe(config, data, features(), out, logs,
                                             runner.folder("clip") / "checkpoint.safetensors"))
    models = {"xe": runner.folder("xe") / "best"}
    for spec in config.scst.rewards:
        name = f"scst-{captioning.reward_slug(spec)}"
        scst_config = {"seed": config.seed, "scst": {k: v for k, v in to_dict(config.scst).items() if k != "rewards"},
                       "reward": spec}
        runner.run(name, scst_config, ["xe", "pacs"],
                   lambda out, spec=spec: captioning.run_scst(config, data, features(), _reward(spec, data, scorers()),
                                                              spec, runner.folder("xe"), out, logs))
        models[f"scst {spec}"] = runner.folder(name) / "final"
    scst_stages = [f"scst-{captioning.reward_slug(spec)}" for spec in config.scst.rewards]
    runner.run("evaluate", {"evaluate": to_dict(config.evaluate)}, ["xe", "pacs", *scst_stages],
               lambda out: _evaluate(config, data, models, features(), scorers(), run_dir, out))
    rows = _publish(run_dir, runner, config)
    report = write_report(run_dir)
    print(_markdown(rows))
    print(f"stages run: {', '.join(runner.ran) or 'none'}; cached: {', '.join(runner.skipped) or 'none'}")
    print(f"report: {report}")
    return {"run_dir": str(run_dir), "rows": rows, "ran": runner.ran, "skipped": runner.skipped,
            "seconds": runner.seconds, "report": str(report)}


def _reward(spec: str, data: Any, scorers: dict[str, Any]) -> Any:
    from rewards import build_reward

    train = {item.image_id: item.references for item in data.splits["train"]}
    paths = {image_id: str(data.image_path(image_id)) for image_id in train}
    family = {"clip-s": "clip", "ref-clip-s": "clip", "pac-s++": "pac-s++", "ref-pac-s++": "pac-s++"}
    return build_reward(spec, train_references=train, image_paths=paths,
                        scorers={name: scorers[f] for name, f in family.items()})


def _evaluate(config: DemoConfig, data: Any, models: dict[str, Path], features: Any, scorers: dict[str, Any],
              run_dir: Path, out: Path) -> dict:
    from captioner.demo import captioning

    rows, all_captions, per_caption = [], {}, {}
    for name, folder in models.items():
        captions = captioning.caption_test_set(folder, data, features, config.evaluate.beam_size)
        row, details = captioning.evaluate_model(captions, data, scorers)
        rows.append({"model": name, **row})
        all_captions[name], per_caption[name] = captions, details
    write_json_atomic(out / "captions.json", all_captions)
    write_json_atomic(out / "results.json", {"columns": TABLE_COLUMNS, "rows": rows,
                                             "provenance": provenance(config=to_dict(config), seed=config.seed)})
    captioning.write_gallery(run_dir, data, all_captions, per_caption, scorers, config.evaluate.gallery_size)
    return {"models": list(models)}


def _publish(run_dir: Path, runner: Any, config: DemoConfig) -> list[dict[str, Any]]:
    """Copy the evaluation table to the run dir as results.{json,csv,md} (+ stage timings)."""
    import json

    results = json.loads((run_dir / "evaluate" / "results.json").read_text(encoding="utf-8"))
    rows = results["rows"]
    write_json_atomic(run_dir / "results.json", results)
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=["model", *TABLE_COLUMNS], extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(run_dir / "results.csv", buffer.getvalue())
    write_text_atomic(run_dir / "results.md", _markdown(rows))
    write_json_atomic(run_dir / "stages.json", {"ran": runner.ran, "skipped": runner.skipped,
                                                "seconds": {k: round(v, 1) for k, v in runner.seconds.items()},
                                                "keys": runner.keys})
    return rows


def _markdown(rows: list[dict[str, Any]]) -> str:
    header = "| model | " + " | ".join(TABLE_COLUMNS) + " |"
    lines = [header, "|---" * (len(TABLE_COLUMNS) + 1) + "|"]
    for row in rows:
        cells = [f"{row[c]:.2f}" if isinstance(row.get(c), (int, float)) else "" for c in TABLE_COLUMNS]
        lines.append(f"| {row['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
