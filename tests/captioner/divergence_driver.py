"""Subprocess driver for the multi-process divergence test: XE, SCST and metric training with lr=1e308.

usage: ACCELERATE_USE_CPU=1 python -m torch.distributed.run --standalone --nproc_per_node 2 divergence_driver.py OUT
Prints `DIVERGED <stage> rank=<rank> <message>` for every stage that stopped with TrainingDivergedError (and
`FINISHED <stage> rank=<rank>` for one that did not); exits 0 once every stage is done on this process.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

torch.set_num_threads(1)

from captioner_testkit import overlap_reward, print_line, tiny_checkpoint, tiny_data, tiny_model_config

from pacs.captioner.modeling.train_scst import SCSTConfig, train_scst
from pacs.captioner.modeling.train_xe import XEConfig, train_xe
from pacs.captioner.modeling.training_setup import ScheduleConfig, process_state
from pacs.captioner.modeling.vocab import build_vocab
from pacs.metric.common.errors import TrainingDivergedError
from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
from pacs.metric.training.data import TensorPositivesDataset
from pacs.metric.training.trainer import MetricTrainConfig, train_metric

HUGE_LR = 1e308


def run_xe(out: Path, data: Path) -> None:
    """Four XE steps of 16 captions (2 processes x 1 micro-batch of 8), validated and saved at the end only."""
    cache, train, val = tiny_data(data)
    vocab = build_vocab("word", [c for _, c in train], min_count=1, max_length=8)
    config = XEConfig(output_dir=str(out), max_steps=4, batch_size=16, micro_batch_size=8,
                      schedule=ScheduleConfig(warmup_steps=0, constant_until=4, decay_until=4, peak_lr=HUGE_LR,
                                              final_lr=1.0),
                      eval_every=0, val_beam_size=1, val_max_images=2, save_every=0, trackers=[])
    train_xe(config, tiny_model_config(), vocab, cache, train, val)


def run_scst(out: Path, data: Path) -> None:
    """Three SCST steps of 8 images (2 processes x 1 micro-batch of 4)."""
    cache, train, _ = tiny_data(data)
    config = SCSTConfig(output_dir=str(out), reward="overlap", lr=HUGE_LR, batch_size=8, micro_batch_size=4,
                        max_steps=3, k=3, save_every=0, trackers=[])
    items = list({image_id: [caption] for image_id, caption in train}.items())
    train_scst(config, data / "init", cache, items, overlap_reward)


def _positives(n: int, seed: int) -> TensorPositivesDataset:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, 32, 32, generator=generator)
    captions = [f"a photo of thing {i % 5}" for i in range(n)]
    return TensorPositivesDataset(images, captions, images + 0.1, [c.upper() for c in captions])


def run_metric(out: Path, data: Path) -> None:
    """Four LoRA metric-training steps of 4 pairs (2 processes x 2)."""
    backbone = build_backbone_from_config(
        tiny_clip_config(vision_cfg={"image_size": 32, "patch_size": 8}, text_cfg={"context_length": 16}), seed=0)
    config = MetricTrainConfig(mode="lora", random_init=True, batch_size=4, max_steps=4, eval_every=0, log_every=0,
                               lr=HUGE_LR, cpu=True, seed=0, output_dir=str(out))
    train_metric(config, _positives(16, 0), _positives(8, 1), backbone=backbone)


def main() -> None:
    """Run every stage on this process; report how each ended."""
    out = Path(sys.argv[1])
    state = process_state()
    data = out / "data"
    with state.main_process_first():
        tiny_data(data)
        if not (data / "init" / "captioner.json").is_file():
            tiny_checkpoint(data, dropout=0.0)
    for name, run in (("xe", run_xe), ("scst", run_scst), ("metric", run_metric)):
        try:
            run(out / name, data)
            print_line(f"FINISHED {name} rank={state.process_index}")
        except TrainingDivergedError as error:
            print_line(f"DIVERGED {name} rank={state.process_index} {error}")
        state.wait_for_everyone()


if __name__ == "__main__":
    main()
