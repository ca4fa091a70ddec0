"""The model side of metric training: trainable parameters per mode, encoding positives, the loss, validation.

`DualEncoder` wraps an open_clip model so that one forward returns normalised image and text embeddings;
`encode_positives` + `loss_on_embeddings` are the two halves GradCache combines; `validation_loss` and
`image_to_text_recall` are the trainer's validation numbers.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from accelerate.logging import get_logger
from torch import nn
from torch.utils.data import DataLoader, Dataset

from metric.common.errors import InputError
from metric.training.config import FAMILY_OF_MODE, LossOptions, MetricTrainConfig
from metric.training.data import (
    ShardedEpochBatches,
    collate_positives,
    split_micro_batches,
)
from metric.training.distributed import gather_with_grad
from metric.training.losses import LossTerms, positive_augmented_loss

if TYPE_CHECKING:
    from metric.models.backbones import Backbone

logger = get_logger(__name__)  # accelerate's: logs once, on the main process

# PAC-S mode: ViT `visual.proj` + `text_projection`; ResNets: the attention pooling; timm/HF towers: their heads
PROJECTION_PREFIXES = ("visual.attnpool.", "visual.head.proj.", "text_projection.", "text.proj.")


class DualEncoder(nn.Module):
    """Wraps an open_clip model so that one forward returns normalised image and text embeddings."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return ``(image_emb, text_emb, logit_scale)`` with L2-normalised embeddings."""
        image_emb = nn.functional.normalize(self.model.encode_image(images), dim=-1)
        text_emb = nn.functional.normalize(self.model.encode_text(tokens), dim=-1)
        return image_emb, text_emb, self.model.logit_scale.exp().clamp(max=100.0)


def build_base_backbone(config: MetricTrainConfig) -> Backbone:
    """Load (or randomly build) the backbone the config names."""
    from metric.models.backbones import build_backbone_from_config, tiny_clip_config
    from metric.models.factory import load_backbone

    if config.random_init:
        if config.arch:
            import json

            arch = json.loads(Path(config.arch).read_text(encoding="utf-8"))
            arch = arch.get("open_clip_equivalent", arch)
        else:
            arch = tiny_clip_config()
        return build_backbone_from_config(arch, seed=config.seed)
    return load_backbone(backbone=None if config.checkpoint else config.backbone, checkpoint=config.checkpoint,
                         arch=config.arch)


def prepare_trainable(backbone: Backbone, config: MetricTrainConfig) -> Backbone:
    """Set requires_grad for the mode (LoRA adapters, final projections, or everything) and the logit scale."""
    model = backbone.model
    if config.mode == "lora":
        from metric.models.lora import attach_lora

        backbone = attach_lora(backbone, rank=config.lora.rank, alpha=config.lora.alpha,
                               targets=config.lora.targets, patch_embedding=config.lora.patch_embedding,
                               dropout=config.lora.dropout)
        model = backbone.model
    elif config.mode == "projection":
        found = []
        for name, param in model.named_parameters():
            keep = name in ("visual.proj", "text_projection") or name.startswith(PROJECTION_PREFIXES)
            param.requires_grad_(keep)
            if keep:
                found.append(name)
        if not found:
            raise InputError(f"backbone {backbone.name}: no final projection found for mode 'projection'")
    else:
        for param in model.parameters():
            param.requires_grad_(True)
    scale = _logit_scale_param(model)
    scale.requires_grad_(bool(config.train_logit_scale) or config.mode == "full")
    return dataclasses.replace(backbone, family=FAMILY_OF_MODE[config.mode])


def _logit_scale_param(model: nn.Module) -> nn.Parameter:
    for name, param in model.named_parameters():
        if name.split(".")[-1] == "logit_scale":
            return param
    raise InputError("the backbone has no logit_scale parameter")


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters with requires_grad, by name."""
    return {name: param for name, param in model.named_parameters() if param.requires_grad}


PositivesBatch = tuple[torch.Tensor, list[str], torch.Tensor, list[str]]


def encode_positives(encoder: nn.Module, tokenize: Callable[[list[str]], torch.Tensor], batch: PositivesBatch,
                     device: torch.device, gen_images: bool = True,
                     gen_texts: bool = True) -> tuple[list[torch.Tensor | None], torch.Tensor]:
    """Encode a batch of positives (real and generated images in one pass, texts in one pass).

    Returns ``([v, t, v', t'], logit_scale)``: four float32 ``[n, E]`` normalised embeddings and the temperature.
    With `gen_images` / `gen_texts` False, v' / t' are not encoded (None): training skips the positives whose loss
    terms have weight 0 (`losses.positives_needed`), e.g. plain contrastive training with λv = λt = 0 encodes
    half as much.
    """
    images, captions, generated_images, generated_captions = batch
    n = images.shape[0]
    pixels = torch.cat([images, generated_images]) if gen_images else images
    tokens = tokenize(list(captions) + list(generated_captions) if gen_texts else list(captions))
    image_emb, text_emb, scale = encoder(pixels.to(device), tokens.to(device))
    image_emb, text_emb = image_emb.float(), text_emb.float()
    return ([image_emb[:n], text_emb[:n], image_emb[n:] if gen_images else None, text_emb[n:] if gen_texts else None],
            scale.float())


def loss_on_embeddings(embeddings: Sequence[torch.Tensor | None], scale: torch.Tensor,
                       options: LossOptions) -> LossTerms:
    """The positive-augmented loss (with the configured extra terms) of ``[v, t, v', t']`` embeddings (v'/t' may be None)."""
    img, txt, gen_img, gen_txt = embeddings
    return positive_augmented_loss(
        img, txt, gen_img, gen_txt, scale, lambda_v=options.lambda_v, lambda_t=options.lambda_t,
        directions=options.directions, relative_weight=options.relative_weight,
        relative_weighting=options.relative_weighting, margin_weight=options.margin_weight, margin=options.margin)


def compute_loss(encoder: nn.Module, tokenize: Callable[[list[str]], torch.Tensor], batch: PositivesBatch,
                 options: LossOptions, device: torch.device) -> LossTerms:
    """Encode a batch of positives in one pass and score it (one process, no micro-batching)."""
    embeddings, scale = encode_positives(encoder, tokenize, batch, device)
    return loss_on_embeddings(embeddings, scale, options)


@torch.no_grad()
def embed_pairs(model: nn.Module, tokenize: Callable[[list[str]], torch.Tensor], dataset: Dataset,
                batch_size: int = 64, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised embeddings of the real images and captions of a positives dataset (in order)."""
    encoder = DualEncoder(model)
    was_training = model.training
    model.eval()
    images, texts = [], []
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, collate_fn=collate_positives)
    for pixels, captions, _, _ in loader:
        image_emb, text_emb, _ = encoder(pixels.to(device), tokenize(captions).to(device))
        images.append(image_emb.float().cpu())
        texts.append(text_emb.float().cpu())
    model.train(was_training)
    return torch.cat(images), torch.cat(texts)


def image_to_text_recall(image_emb: torch.Tensor, text_emb: torch.Tensor, image_ids: Sequence[str] | None = None,
                         k: int = 1) -> float:
    """Image→text recall@k: the share of images with one of their own captions among the top-k texts.

    Row i of both tensors is a pair; rows with the same image id are one image (queried once).
    """
    n = image_emb.shape[0]
    ids = list(image_ids) if image_ids is not None else [str(i) for i in range(n)]
    first_row: dict[str, int] = {}
    for row, image_id in enumerate(ids):
        first_row.setdefault(image_id, row)
    queries = torch.tensor(list(first_row.values()))
    sims = image_emb[queries] @ text_emb.t()
    top = sims.topk(min(k, n), dim=1).indices
    hits = sum(any(ids[j] == ids[int(q)] for j in top[row].tolist()) for row, q in enumerate(queries.tolist()))
    return hits / len(queries)


@torch.no_grad()
def validation_loss(encoder: nn.Module, tokenize: Callable[[list[str]], torch.Tensor], dataset: Dataset,
                    batch_size: int, micro_batch_size: int, options: LossOptions, device: torch.device,
                    rank: int = 0, processes: int = 1, num_workers: int = 0) -> dict[str, float]:
    """Mean of every loss term over the consecutive full global batches of `dataset` (eval mode).

    As in training, each loss covers `batch_size` pairs: this process encodes its share in micro-batches and
    the embeddings are all-gathered, so the value does not depend on the process count or micro-batch size.
    """
    sampler = ShardedEpochBatches(len(dataset), batch_size, 0, 0, rank=rank, processes=processes, shuffle=False)
    if not len(sampler):
        raise InputError(f"validation set has {len(dataset)} pairs, fewer than one global batch ({batch_size}): "
                         "give more validation pairs or a smaller batch_size")
    if sampler.dropped:
        logger.info("validation: the last %d of %d pairs do not fill a global batch and are left out",
                    sampler.dropped, len(dataset))
    was_training = encoder.training
    encoder.eval()
    sums: dict[str, float] = {}
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_positives, num_workers=num_workers)
    for batch in loader:
        parts, scale = [], None
        for micro in split_micro_batches(batch, micro_batch_size):
            embeddings, scale = encode_positives(encoder, tokenize, micro, device)
            parts.append(embeddings)
        gathered = [gather_with_grad(torch.cat([p[k] for p in parts])) for k in range(len(parts[0]))]
        for name, value in loss_on_embeddings(gathered, scale, options).as_floats().items():
            sums[name] = sums.get(name, 0.0) + value
    encoder.train(was_training)
    return {f"val_{name}": total / len(sampler) for name, total in sums.items()}
