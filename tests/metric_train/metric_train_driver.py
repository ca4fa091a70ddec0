"""A few LoRA metric-training steps on a tiny random CLIP, for the process-count / micro-batch equivalence test.

usage (one process):   python metric_train_driver.py OUT MICRO
       (two processes): ACCELERATE_USE_CPU=1 python -m torch.distributed.run --standalone --nproc_per_node 2 \
                            metric_train_driver.py OUT MICRO
OUT receives the usual run folder (train_log.json with per-step losses, checkpoint.safetensors).
"""
from __future__ import annotations

import sys

import torch

from pacs.metric.models.backbones import Backbone, build_backbone_from_config, tiny_clip_config
from pacs.metric.training.data import TensorPositivesDataset
from pacs.metric.training.trainer import LoraOptions, LossOptions, MetricTrainConfig, train_metric

WORDS = ["dog", "cat", "man", "woman", "red", "blue", "ball", "grass", "water", "snow", "runs", "sits"]
GLOBAL_BATCH = 8
STEPS = 3


def tiny_backbone() -> Backbone:
    """A tiny random CLIP (32 px images, 16-token texts), the same on every call."""
    config = tiny_clip_config(vision_cfg={"image_size": 32, "patch_size": 8}, text_cfg={"context_length": 16})
    return build_backbone_from_config(config, seed=0, name="tiny-equivalence")


def positives(n: int, seed: int) -> TensorPositivesDataset:
    """`n` random (image, caption, noisy image, upper-cased caption) positives."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, 32, 32, generator=generator)
    words = torch.randint(0, len(WORDS), (n, 3), generator=generator).tolist()
    captions = [" ".join(WORDS[i] for i in row) for row in words]
    return TensorPositivesDataset(images, captions, images + 0.1 * torch.randn(images.shape, generator=generator),
                                  [c.upper() for c in captions])


def equivalence_config(out: str, micro: int) -> MetricTrainConfig:
    """LoRA (no dropout) + trained temperature + every loss term, global batch 8, 3 steps, validated at the end."""
    return MetricTrainConfig(
        mode="lora", random_init=True, lora=LoraOptions(dropout=0.0), train_logit_scale=True,
        loss=LossOptions(lambda_v=0.3, lambda_t=0.2, relative_weight=0.5, margin_weight=0.5),
        batch_size=GLOBAL_BATCH, micro_batch_size=micro, max_steps=STEPS, eval_every=0, log_every=0, lr=1e-3,
        cpu=True, seed=0, output_dir=out)


def run(out: str, micro: int) -> None:
    """Train on 24 pairs (3 global batches = one epoch) and validate on the same pairs."""
    train_metric(equivalence_config(out, micro), positives(24, 0), positives(24, 0), backbone=tiny_backbone())


if __name__ == "__main__":
    torch.set_num_threads(1)
    run(sys.argv[1], int(sys.argv[2]))
