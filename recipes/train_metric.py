"""Train PAC-S++ (LoRA, default) or PAC-S (projections) on a positives manifest.

    accelerate launch recipes/train_metric.py --config recipes/configs/train_metric.yaml [key=value ...]
    accelerate launch recipes/train_metric.py --config recipes/configs/train_metric_pacs.yaml data.manifest=...

The same as `pacs train-metric` (see `pacs train-metric --help` for the shortcut options); multi-GPU and
mixed precision come from `accelerate launch` / `mixed_precision=bf16`, resuming from `resume=latest`.
"""
from __future__ import annotations

import sys

from pacs import cli as pacs_cli

if __name__ == "__main__":
    sys.exit(pacs_cli.main(["train-metric", *sys.argv[1:]]))
