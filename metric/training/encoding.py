"""The model side of metric training: trainable parameters per mode, encoding positives, the loss, validation.

`DualEncoder` wraps an open_clip model so that one forward returns normalised image and text embeddings and the
*temperature*: the scalar ``logit_scale`` for InfoNCE, or the 2-vector ``[scale, bias]`` for the SigLIP sigmoid loss
(`resolve_loss_kind`); `encode_positives` + `loss_on_embeddings` are the two halves GradCache combines (the
temperature travels with the embeddings, whatever its shape); `validation_loss` and `image_to_text_recall` are the
trainer's validation numbers. Texts are tokenized by the backbone's own tokenizer to its full context and the text
tower runs its full forward (no trimming: SigLIP's text tower pools the last position of the padded context).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from accelerate.logging import get_logger
from torch import nn
from torch.utils.data import BatchSampler, Dataset, SequentialSampler

from pacs.metric.common.errors import InputError, PacsError
from pacs.metric.common.json_input import read_json_file
from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
from pacs.metric.models.factory import load_backbone
from pacs.metric.training.batches import batch_loader
from pacs.metric.training.config import FAMILY_OF_MODE, LOSS_KINDS, LossOptions, MetricTrainConfig
from pacs.metric.training.data import (
    ShardedEpochBatches,
    collate_positives,
    split_micro_batches,
)
from pacs.metric.training.distributed import gather_with_grad
from pacs.metric.training.losses import LossTerms, positive_augmented_loss

if TYPE_CHECKING:
    from pacs.metric.models.backbones import Backbone

logger = get_logger(__name__)  # accelerate's: logs once, on the main process

# PAC-S mode: ViT `visual.proj` + `text_projection`; ResNets: the attention pooling; timm/HF towers: their heads;
# open_clip custom text towers (SigLIP): `text.text_projection`; timm SigLIP towers without a projection
# (`timm_proj: none`): their MAP attention-pooling head, as for ResNets
PROJECTION_PREFIXES = ("visual.attnpool.", "visual.head.proj.", "text_projection.", "text.proj.",
                       "text.text_projection.", "visual.trunk.attn_pool.")
CLIP_SCALE_MAX = 100.0  # InfoNCE: CLIP's temperature cap (exp(logit_scale) <= 100)


def _named_parameter(model: nn.Module, leaf: str) -> nn.Parameter | None:
    """The parameter whose name ends in `leaf` (e.g. ``logit_bias``; peft prefixes names), or None."""
    for name, param in model.named_parameters():
        if name.split(".")[-1] == leaf:
            return param
    return None


def resolve_loss_kind(kind: str, model: nn.Module) -> str:
    """``infonce`` or ``sigmoid`` for `kind` (``auto``: sigmoid when the model has a ``logit_bias``, i.e. SigLIP)."""
    if kind not in LOSS_KINDS:
        raise InputError(f"loss.kind must be one of {', '.join(LOSS_KINDS)}, got {kind!r}")
    has_bias = _named_parameter(model, "logit_bias") is not None
    if kind == "auto":
        return "sigmoid" if has_bias else "infonce"
    if kind == "sigmoid" and not has_bias:
        raise InputError("loss.kind=sigmoid needs a model with a logit_bias (SigLIP / SigLIP2, or an open_clip config "
                         "with init_logit_bias); this backbone has none: use loss.kind=infonce or auto")
    return kind


class DualEncoder(nn.Module):
    """Wraps an open_clip model so that one forward returns normalised image and text embeddings and the temperature.

    `loss_kind` (``auto``, ``infonce``, ``sigmoid``; see `resolve_loss_kind`) fixes the temperature's form: the
    scalar ``exp(logit_scale)`` capped at 100 (CLIP) for InfoNCE, the 2-vector ``[exp(logit_scale), logit_bias]``
    (the model's own values, uncapped, as SigLIP's forward) for the sigmoid loss.
    """

    def __init__(self, model: nn.Module, loss_kind: str = "auto"):
        super().__init__()
        self.model = model
        self.loss_kind = resolve_loss_kind(loss_kind, model)

    def forward(self, images: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Return ``(image_emb, text_emb, temperature)`` with L2-normalised embeddings."""
        image_emb = nn.functional.normalize(self.model.encode_image(images), dim=-1)
        text_emb = nn.functional.normalize(self.model.encode_text(tokens), dim=-1)
        if self.loss_kind == "sigmoid":
            return image_emb, text_emb, torch.stack([self.model.logit_scale.exp().reshape(()),
                                                     self.model.logit_bias.reshape(())])
        return image_emb, text_emb, self.model.logit_scale.exp().clamp(max=CLIP_SCALE_MAX)


def build_base_backbone(config: MetricTrainConfig) -> Backbone:
    """Load (or randomly build) the backbone the config names."""

    if config.random_init:
        if config.arch:
            arch = read_json_file(config.arch, "architecture file")
            arch = arch.get("open_clip_equivalent", arch)
        else:
            arch = tiny_clip_config()
        # a SigLIP-style arch (with init_logit_bias) keeps its own activation; CLIP archs get QuickGELU as before
        quick_gelu = bool(arch.get("quick_gelu", False)) if "init_logit_bias" in arch else True
        return build_backbone_from_config(arch, seed=config.seed, quick_gelu=quick_gelu)
    return load_backbone(backbone=None if config.checkpoint else config.backbone, checkpoint=config.checkpoint,
                         arch=config.arch)


def check_trainable_backbone(backbone: Backbone) -> None:
    """InputError unless `backbone` is an open_clip model (CLIP, SigLIP, SigLIP2): the run writes open_clip weights."""
    if not {"embed_dim", "vision_cfg", "text_cfg"} <= set(backbone.open_clip_config):
        kind = getattr(backbone, "family_kind", "")
        raise InputError(f"backbone {backbone.name}{f' ({kind})' if kind else ''}: metric training needs an open_clip "
                         "model (CLIP, SigLIP, SigLIP2: a name, local-dir: folder or checkpoint with its open_clip "
                         "config); transformers folders can be scored but not trained")


def prepare_trainable(backbone: Backbone, config: MetricTrainConfig) -> Backbone:
    """Set requires_grad for the mode (LoRA adapters, final projections, or everything), the logit scale and bias.

    The scale (and, for the sigmoid loss, the bias) is trained with `train_logit_scale` or in `full` mode only.
    """
    model = backbone.model
    if config.mode == "lora":
        from pacs.metric.models.lora import attach_lora  # it picks the layers for the model's layout (open_clip, timm)

        backbone = attach_lora(backbone, rank=config.lora.rank, alpha=config.lora.alpha, targets=config.lora.targets,
                               patch_embedding=config.lora.patch_embedding, dropout=config.lora.dropout)
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
    train_temperature = bool(config.train_logit_scale) or config.mode == "full"
    scale = _named_parameter(model, "logit_scale")
    if scale is None:
        raise InputError("the backbone has no logit_scale parameter")
    scale.requires_grad_(train_temperature)
    bias = _named_parameter(model, "logit_bias")
    if bias is not None:  # used by the sigmoid loss only: trained with the scale then, else frozen
        bias.requires_grad_(train_temperature and resolve_loss_kind(config.loss.kind, model) == "sigmoid")
    return dataclasses.replace(backbone, family=FAMILY_OF_MODE[config.mode])


def trainable_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """The parameters with requires_grad, by name."""
    return {name: param for name, param in model.named_parameters() if param.requires_grad}


PositivesBatch = tuple[torch.Tensor, list[str], torch.Tensor, list[str]]


def encode_positives(encoder: nn.Module, tokenize: Callable[[list[str]], torch.Tensor], batch: PositivesBatch,
                     device: torch.device, gen_images: bool = True,
                     gen_texts: bool = True) -> tuple[list[torch.Tensor | None], torch.Tensor]:
    """Encode a batch of positives (real and generated images in one pass, texts in one pass).

    Returns ``([v, t, v', t'], temperature)``: four float32 ``[n, E]`` normalised embeddings and the temperature
    (`DualEncoder`: the scale, or ``[scale, bias]`` for the sigmoid loss).
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
    """The positive-augmented loss (with the configured extra terms) of ``[v, t, v', t']`` embeddings (v'/t' may be None).

    `scale` is the encoder's temperature: a scalar (InfoNCE) or ``[scale, bias]`` (sigmoid); ``options.kind``
    ``auto`` follows its form, an explicit kind must match it.
    """
    img, txt, gen_img, gen_txt = embeddings
    with_bias = scale.numel() == 2
    kind = options.kind if options.kind != "auto" else ("sigmoid" if with_bias else "infonce")
    if (kind == "sigmoid") != with_bias:
        raise PacsError(f"loss.kind={options.kind} but the encoder gives a temperature of {scale.numel()} value(s) "
                         "(1: InfoNCE scale, 2: sigmoid [scale, bias]): build DualEncoder with the same loss_kind")
    logit_scale, logit_bias = (scale[0], scale[1]) if with_bias else (scale, None)
    return positive_augmented_loss(
        img, txt, gen_img, gen_txt, logit_scale, lambda_v=options.lambda_v, lambda_t=options.lambda_t,
        directions=options.directions, relative_weight=options.relative_weight,
        relative_weighting=options.relative_weighting, margin_weight=options.margin_weight, margin=options.margin,
        kind=kind, logit_bias=logit_bias)


def compute_loss(encoder: nn.Module, tokenize: Callable[[list[str]], torch.Tensor], batch: PositivesBatch,
                 options: LossOptions, device: torch.device) -> LossTerms:
    """Encode a batch of positives in one pass and score it (one process, no micro-batching)."""
    embeddings, scale = encode_positives(encoder, tokenize, batch, device)
    return loss_on_embeddings(embeddings, scale, options)


@torch.no_grad()
def embed_pairs(model: nn.Module, tokenize: Callable[[list[str]], torch.Tensor], dataset: Dataset,
                batch_size: int = 64, device: str | torch.device = "cpu",
                workers: int | str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised embeddings of the real images and captions of a positives dataset (in order; images decoded by
    `workers` threads)."""
    encoder = DualEncoder(model)
    was_training = model.training
    model.eval()
    images, texts = [], []
    loader = batch_loader(dataset, BatchSampler(SequentialSampler(dataset), batch_size, drop_last=False),
                          collate_positives, 0, workers)
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
                    rank: int = 0, processes: int = 1, num_workers: int = 0,
                    workers: int | str = "auto") -> dict[str, float]:
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
    loader = batch_loader(dataset, sampler, collate_positives, num_workers, workers)
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
