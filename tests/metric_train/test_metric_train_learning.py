"""Evidence that the trainer learns: a tiny random CLIP on real Flickr8k pairs (CPU, well under a minute)."""
from __future__ import annotations

import json
import random

import pytest
import torch
from PIL import Image

from pacs.metric.common.seeding import seed_everything
from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
from pacs.metric.training.data import TensorPositivesDataset, random_view
from pacs.metric.training.trainer import MetricTrainConfig, train_metric

N_IMAGES = 240
N_VAL_IMAGES = 80
TRAIN_CAPTIONS = 4  # captions 0-3 of each image are trained on; caption 4 is held out for validation


def _flickr8k_items(root, n_images):
    captions: dict[str, list[str]] = {}
    for line in (root / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines():
        key, _, caption = line.partition("\t")
        captions.setdefault(key.split("#")[0], []).append(caption)
    names = sorted(p.name for p in (root / "images").glob("*.jpg"))[:n_images]
    items = []
    for name in names:
        with Image.open(root / "images" / name) as image:
            image.draft("RGB", (80, 80))  # fast JPEG decoding at reduced size
            items.append((name, image.convert("RGB"), captions[name]))
    return items


def positives_datasets(backbone, items):
    """(train, val) positives of Flickr8k items: captions 0-3 trained on, t' another caption, v' an augmented view;
    validation: the held-out fifth caption of the first N_VAL_IMAGES images."""
    train, val = ([], [], [], [], []), ([], [], [], [], [])
    for index, (name, image, captions) in enumerate(items):
        pixels = backbone.preprocess(image)
        for k in range(TRAIN_CAPTIONS):  # t' = another reference caption, v' = an augmented view of the image
            for column, value in zip(train, (pixels, captions[k], backbone.preprocess(random_view(image)),
                                             captions[(k + 1) % TRAIN_CAPTIONS], name)):
                column.append(value)
        if index < N_VAL_IMAGES:  # validation: the held-out fifth caption of the first images
            for column, value in zip(val, (pixels, captions[TRAIN_CAPTIONS], backbone.preprocess(random_view(image)),
                                           captions[0], name)):
                column.append(value)
    return TensorPositivesDataset(*train[:4], image_ids=train[4]), TensorPositivesDataset(*val[:4], image_ids=val[4])


@pytest.fixture(scope="module")
def flickr_positives(shared_data):
    torch.set_num_threads(1)
    seed_everything(0)
    random.seed(0)
    config = tiny_clip_config(vision_cfg={"image_size": 32, "patch_size": 8}, text_cfg={"context_length": 32})
    backbone = build_backbone_from_config(config, seed=0, name="tiny-flickr")
    items = _flickr8k_items(shared_data / "flickr8k", N_IMAGES)
    return (backbone, *positives_datasets(backbone, items))


def test_validation_loss_falls_and_recall_rises(flickr_positives, tmp_path):
    backbone, train, val = flickr_positives
    config = MetricTrainConfig(mode="full", random_init=True, batch_size=32, lr=1e-3, max_steps=90, eval_every=30,
                               log_every=0, seed=0, output_dir=str(tmp_path / "run"))
    out = train_metric(config, train, val, backbone=backbone)
    log = json.loads((out / "train_log.json").read_text())
    history = log["history"]
    first, best = history[0], min(history, key=lambda r: r["val_total"])
    print(f"\nFlickr8k tiny CLIP ({len(train)} training pairs, {N_VAL_IMAGES} held-out captions):")
    for record in history:
        print(f"  step {int(record['step']):3d}: val loss {record['val_total']:.4f}  "
              f"image->text R@1 {record['val_r1']:.3f}")
    last = history[-1]
    assert first["step"] == 0 and last["step"] == 90
    assert last["val_total"] < first["val_total"] - 0.3  # the validation loss falls ...
    assert last["val_r1"] > first["val_r1"]  # ... and held-out image->text R@1 rises above its start
    assert best["step"] == log["best_step"]  # the saved weights are those of the best validation
    assert (out / "checkpoint.safetensors").is_file()
