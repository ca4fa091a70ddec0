"""The metric stages of the demo: pre-train a tiny CLIP on web alt-text, then PAC-S++ (LoRA) with positives."""
from __future__ import annotations

import csv
import json
import logging
import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from pacs.captioner.demo.config import ClipStageConfig, PacsStageConfig
from pacs.captioner.demo.data import DemoData
from pacs.captioner.modeling.training_setup import process_state
from pacs.metric.common.io import atomic_path, csv_cells
from pacs.metric.models.backbones import Backbone, build_backbone_from_config, tiny_clip_config
from pacs.metric.models.factory import load_backbone
from pacs.metric.training.data import TensorPositivesDataset
from pacs.metric.training.trainer import LoraOptions, LossOptions, MetricTrainConfig, train_metric

logger = logging.getLogger(__name__)

CHECKPOINT = "checkpoint.safetensors"


SIGLIP_LOGITS = {"init_logit_scale": math.log(10.0), "init_logit_bias": -10.0}
"""SigLIP's initial temperature and bias (Zhai et al. 2023, the values open_clip's SigLIP configs use)."""


def clip_arch(config: ClipStageConfig, image_size: int) -> dict:
    """The open_clip model config of the demo's tiny CLIP (with `clip.loss: sigmoid`: SigLIP's logit bias and initial
    temperature; the towers stay CLIP's, so the change measured is the loss)."""
    sigmoid = config.loss == "sigmoid"
    return tiny_clip_config(
        embed_dim=config.embed_dim,
        vision_cfg={"image_size": image_size, "patch_size": config.patch_size, "width": config.vision_width,
                    "layers": config.vision_layers, "head_width": 32},
        text_cfg={"context_length": config.context_length, "width": config.text_width, "heads": 2,
                  "layers": config.text_layers},
        **(SIGLIP_LOGITS if sigmoid else {}))


def _pixels(backbone: Backbone, images: list[Image.Image]) -> torch.Tensor:
    return torch.stack([backbone.preprocess(image) for image in images])


def _load_pixels(backbone: Backbone, data: DemoData, split: str) -> torch.Tensor:
    images = []
    for item in data.splits[split]:
        with Image.open(data.image_path(item.image_id)) as image:
            images.append(image.convert("RGB"))
    return _pixels(backbone, images)


def history_to_csv(train_log: Path, out: Path) -> None:
    """Write the trainer's evaluation history (train_log.json) as a curve CSV for the report."""
    history = json.loads(train_log.read_text(encoding="utf-8"))["history"]
    columns = ["step"] + sorted({k for record in history for k in record if k != "step"})
    with atomic_path(out) as tmp, open(tmp, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for record in history:
            writer.writerow(csv_cells({k: record.get(k, "") for k in columns}))


def _trainer_config(mode: str, folder: Path, seed: int, steps: int, batch_size: int, lr: float, weight_decay: float,
                    eval_every: int, loss: LossOptions, lora: LoraOptions | None = None,
                    micro_batch_size: int = 0) -> MetricTrainConfig:
    return MetricTrainConfig(mode=mode, backbone=None, random_init=True, lora=lora or LoraOptions(), loss=loss,
                             lr=lr, weight_decay=weight_decay, batch_size=batch_size,
                             micro_batch_size=micro_batch_size, max_steps=steps,
                             max_epochs=10_000, eval_every=eval_every, patience=10**9, log_every=10,
                             seed=seed, output_dir=str(folder))  # device auto: the process state's, as every stage


def pretrain_clip(stage: ClipStageConfig, data: DemoData, seed: int, prompt: str, folder: Path, curve: Path) -> dict:
    """Stage `clip`: a randomly initialised tiny CLIP trained contrastively on noisy web alt-text (the world's train
    and val splits; `curve`: the validation history as CSV, for the report)."""
    world = data.world.config
    backbone = build_backbone_from_config(clip_arch(stage, world.image_size), seed=seed, name="demo-tiny-clip")
    per_image = world.web_captions_per_image
    datasets = {}
    for split in ("train", "val"):
        items = data.splits[split]
        pixels = _load_pixels(backbone, data, split)
        web = [data.world.web_captions(item, per_image) for item in items]
        rows = [(i, k) for i in range(len(items)) for k in range(per_image)]
        if split == "val":
            rows = [(i, 0) for i in range(len(items))]
        datasets[split] = TensorPositivesDataset(
            [pixels[i] for i, _ in rows], [prompt + web[i][k] for i, k in rows],
            [pixels[i] for i, _ in rows], [prompt + web[i][(k + 1) % per_image] for i, k in rows],
            image_ids=[items[i].image_id for i, _ in rows])
    trainer = _trainer_config("full", folder, seed, stage.max_steps, stage.batch_size, stage.lr,
                              stage.weight_decay, stage.eval_every,
                              LossOptions(lambda_v=0.0, lambda_t=0.0, kind=stage.loss),
                              micro_batch_size=stage.micro_batch_size)
    train_metric(trainer, datasets["train"], datasets["val"], backbone=backbone)
    if process_state().is_main_process:
        history_to_csv(folder / "train_log.json", curve)
    return _summary(folder)


def train_pacs(stage: PacsStageConfig, data: DemoData, seed: int, prompt: str, clip_folder: Path, folder: Path,
               curve: Path) -> dict:
    """Stage `pacs`: LoRA fine-tuning of the tiny CLIP in `clip_folder` on clean captions with synthetic positives
    (v', t'); `curve`: the validation history as CSV."""
    backbone = load_backbone(checkpoint=str(clip_folder / CHECKPOINT))
    n_references = data.world.config.n_references
    datasets = {}
    rng = np.random.default_rng(seed)
    for split in ("train", "val"):
        items = data.splits[split]
        pixels = _load_pixels(backbone, data, split)
        n_captions = min(3, n_references) if split == "train" else 1
        images, captions, gen_images, gen_captions, ids = [], [], [], [], []
        for index, item in enumerate(items):
            for k in (range(n_captions) if split == "train" else [int(rng.integers(n_references))]):
                gen_image, gen_caption = data.world.positive(item, k)
                images.append(pixels[index])
                captions.append(prompt + item.references[k])
                gen_images.append(backbone.preprocess(gen_image))
                gen_captions.append(prompt + gen_caption)
                ids.append(item.image_id)
        datasets[split] = TensorPositivesDataset(images, captions, gen_images, gen_captions, image_ids=ids)
    trainer = _trainer_config("lora", folder, seed, stage.max_steps, stage.batch_size, stage.lr, 0.0,
                              stage.eval_every, LossOptions(lambda_v=stage.lambda_v, lambda_t=stage.lambda_t),
                              LoraOptions(rank=stage.rank, alpha=stage.alpha), micro_batch_size=stage.micro_batch_size)
    train_metric(trainer, datasets["train"], datasets["val"], backbone=backbone)
    if process_state().is_main_process:
        history_to_csv(folder / "train_log.json", curve)
    return _summary(folder)


def _summary(folder: Path) -> dict:
    log = json.loads((folder / "train_log.json").read_text(encoding="utf-8"))
    first, last = log["history"][0], log["history"][-1]
    return {"steps": log["steps"], "val_total_first": first.get("val_total"), "val_total_last": last.get("val_total"),
            "val_r1_first": first.get("val_r1"), "val_r1_last": last.get("val_r1")}
