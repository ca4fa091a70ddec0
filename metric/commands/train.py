"""`pacs train-metric` and `pacs generate-positives`: YAML config + ``key=value`` overrides, a few shortcuts."""
from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from pacs.metric.common.device import DEVICE_HELP
from pacs.metric.common.terminal import escape_control


def _shortcuts(args: argparse.Namespace, pairs: Sequence[tuple[str, str]]) -> list[str]:
    """Turn set shortcut options into ``key=value`` overrides (they win over the config file)."""
    overrides = []
    for attribute, key in pairs:
        value = getattr(args, attribute, None)
        if value is None or value is False:
            continue
        overrides.append(f"{key}={json.dumps(value) if not isinstance(value, str) else value}")
    return overrides


def run_train_metric(args: argparse.Namespace) -> int:
    """Train PAC-S++ / PAC-S from a positives manifest; print where the checkpoint went."""
    from pacs.eval.training_hook import correlation_hook_from_config  # the CLI layer joins metric and eval
    from pacs.metric.common.config import load_config
    from pacs.metric.training.trainer import MetricTrainConfig, train_metric

    overrides = list(args.overrides) + _shortcuts(args, [
        ("manifest", "data.manifest"), ("image_root", "data.image_root"), ("skip_missing", "data.skip_missing"),
        ("output_dir", "output_dir"), ("resume", "resume"), ("mode", "mode"), ("device", "device")])
    config = load_config(MetricTrainConfig, args.config, overrides)
    out = train_metric(config, correlation_hook=correlation_hook_from_config(config.correlation))
    log = json.loads((out / "train_log.json").read_text(encoding="utf-8"))
    print(f"train-metric: {config.mode} run of {log['steps']} steps, best step {log['best_step']} "
          f"(val loss {log['best_val_total']:.4f}); checkpoint {out / 'checkpoint.safetensors'}"
          + (f", adapter {out / 'adapter'}" if "adapter" in log["files"] else ""))
    return 0


def run_generate_positives(args: argparse.Namespace) -> int:
    """Generate synthetic positives and write the manifest; print its path."""
    from pacs.metric.common.config import load_config
    from pacs.metric.training.positives import PositivesConfig, generate_positives

    overrides = list(args.overrides) + _shortcuts(args, [
        ("dataset", "dataset"), ("image_root", "image_root"), ("output_dir", "output_dir"),
        ("skip_missing", "skip_missing"), ("device", "device")])
    config = load_config(PositivesConfig, args.config, overrides)
    manifest = generate_positives(config)
    n_lines = sum(1 for line in Path(manifest).read_text(encoding="utf-8").splitlines() if line.strip())
    print(escape_control(f"generate-positives: {n_lines} pairs in {manifest}"))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add these sub-commands to the `pacs` parser."""
    train = subparsers.add_parser(
        "train-metric", help="train PAC-S++ (LoRA) or PAC-S (projections) on positive-augmented pairs",
        description="Train the metric. Every MetricTrainConfig key can be set in --config YAML or as key=value "
                    "(e.g. mode=projection loss.lambda_v=0.05 batch_size=64 micro_batch_size=16). batch_size is "
                    "the global batch of every step and loss, whatever the number of processes; micro_batch_size "
                    "(pairs a process encodes at once) only trades memory for time.")
    train.add_argument("--config", help="YAML file or packaged config name (e.g. train_metric, train_metric_pacs: "
                                        "recipes/configs/); _base_ inheritance")
    train.add_argument("--manifest", help="positives manifest JSONL (sets data.manifest)")
    train.add_argument("--image-root", help="folder that relative manifest paths start from (data.image_root)")
    train.add_argument("--skip-missing", action="store_true",
                       help="skip (and count) manifest lines whose image files are missing instead of failing")
    train.add_argument("--output-dir", help="where checkpoint.safetensors, adapter/ and train_log.json go")
    train.add_argument("--mode", choices=("lora", "projection", "full"), help="what is trained")
    train.add_argument("--resume", help="a saved state folder, or 'latest' (under OUTPUT_DIR/state)")
    train.add_argument("--device", help=f"{DEVICE_HELP} (sets device; an explicit one must be accelerate's)")
    train.add_argument("overrides", nargs="*", help="key=value overrides of the config")
    train.set_defaults(func=run_train_metric)

    generate = subparsers.add_parser(
        "generate-positives", help="generate t' (BLIP) per image and v' (Stable Diffusion) per caption",
        description="Write gen_images/ and manifest.jsonl for a Karpathy-split or COCO captions dataset. Every "
                    "PositivesConfig key can be set in --config YAML or as key=value (e.g. captioner=PATH "
                    "text_to_image=PATH num_inference_steps=30 limit=100).")
    generate.add_argument("--config",
                          help="YAML file or packaged config name (e.g. generate_positives: recipes/configs/)")
    generate.add_argument("--dataset", help="dataset_coco.json (Karpathy) or COCO captions JSON")
    generate.add_argument("--image-root", help="folder holding the dataset's images")
    generate.add_argument("--output-dir", help="where gen_images/ and manifest.jsonl go")
    generate.add_argument("--skip-missing", action="store_true", help="skip (and count) images whose files are missing")
    generate.add_argument("--device", help=f"{DEVICE_HELP} (sets device)")
    generate.add_argument("overrides", nargs="*", help="key=value overrides of the config")
    generate.set_defaults(func=run_generate_positives)
