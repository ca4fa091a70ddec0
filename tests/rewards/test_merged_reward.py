"""The SCST reward model of a LoRA backbone runs on merged weights (issue 43 item 4); the backbone is untouched."""
from __future__ import annotations

import copy
import dataclasses

import torch

from pacs.metric.models.lora import attach_lora, carries_lora
from pacs.metric.scoring.registry import default_w
from pacs.metric.scoring.scorer import Scorer
from pacs.rewards import build_reward


def test_a_lora_reward_model_is_a_merged_copy(tiny_backbone, images, batch):
    backbone = attach_lora(dataclasses.replace(tiny_backbone, model=copy.deepcopy(tiny_backbone.model)), rank=4,
                           alpha=4.0)
    with torch.no_grad():
        for name, parameter in backbone.model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.05 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(0)))
    trainable = [name for name, p in backbone.model.named_parameters() if p.requires_grad]
    ids, captions, refs = batch
    reward = build_reward("pac-s++", backbone=backbone, image_loader=images.__getitem__)
    values = reward(ids, captions, refs)
    assert not carries_lora(reward.fn.scorer.backbone) and carries_lora(backbone)
    # the reward freezes its own copy: the adapters of the model given stay trainable
    assert trainable and [name for name, p in backbone.model.named_parameters() if p.requires_grad] == trainable
    unmerged = Scorer(backbone, progress=False, workers=0).score(
        [images[i] for i in ids for _ in range(3)], [c for row in captions for c in row],
        w=default_w("pac-s++", backbone))
    # merging changes float rounding only (tests/metric/test_merged_lora.py): the Scorer's float tolerance, times w
    assert torch.allclose(values.flatten(), torch.from_numpy(unmerged.scores), rtol=0, atol=unmerged.w * 1e-5)
