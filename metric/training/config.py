"""The metric trainer's configuration: `MetricTrainConfig` and its option groups (LoRA, loss, data, correlation)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from annotated_types import Le

from pacs.metric.common.config import (
    MAX_BATCH,
    MAX_IMAGES,
    MAX_MICRO_BATCH,
    MAX_STEPS,
    Fraction,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
)
from pacs.metric.common.errors import InputError
from pacs.metric.common.trainer_config import TrainerConfig

MODES = ("lora", "projection", "full")
LOSS_KINDS = ("auto", "infonce", "sigmoid")  # auto: sigmoid for a model with a logit_bias (SigLIP), else InfoNCE
FAMILY_OF_MODE = {"lora": "pac-s++", "projection": "pac-s", "full": "clip"}


@dataclass
class LoraOptions:
    """peft LoRA settings (PAC-S++: rank 4, alpha 1 as the official code, both towers + patch embedding)."""

    rank: Annotated[PositiveInt, Le(1024)] = 4
    alpha: PositiveFloat = 1.0
    dropout: Fraction = 0.0
    patch_embedding: bool = True
    targets: list[str] = field(default_factory=lambda: ["attn", "mlp.c_fc", "mlp.c_proj"])


@dataclass
class LossOptions:
    """Loss kind and weights: PAC-S++ defaults λv = 0.1, λt = 0.001 (PAC-S: 0.05, 0.1); extra terms off.

    `kind`: ``infonce`` (CLIP's symmetric InfoNCE), ``sigmoid`` (SigLIP's pairwise sigmoid loss with the model's
    own scale and bias) or ``auto`` (sigmoid when the model has a ``logit_bias`` parameter, i.e. SigLIP / SigLIP2).
    """

    kind: str = "auto"
    lambda_v: NonNegativeFloat = 0.1
    lambda_t: NonNegativeFloat = 0.001
    directions: str = "mean"
    relative_weight: NonNegativeFloat = 0.0
    relative_weighting: str = "uniform"
    margin_weight: NonNegativeFloat = 0.0
    margin: NonNegativeFloat = 0.2  # cosine margin of the hard-negative term


@dataclass
class DataOptions:
    """Where the positives come from: a manifest (+ image root), split names, what to do with missing files."""

    manifest: str | None = None
    image_root: str | None = None
    val_manifest: str | None = None
    train_split: str = "train"
    val_split: str = "val"
    skip_missing: bool = False
    num_workers: Annotated[NonNegativeInt, Le(64)] = 0
    # decoders of the next batches' images while the model trains (with num_workers 0; processes for a manifest of
    # >= 64 items, else threads): auto = one per CPU core, 0 or 1 = in the training loop; the batches are the same,
    # bit for bit (pacs.metric.training.batches)
    workers: int | str = "auto"
    max_val_pairs: Annotated[PositiveInt, Le(MAX_IMAGES)] = 5000  # validation pairs used (the first ones of the validation split)

    def validate(self) -> None:
        """Check `workers` (auto or 0..256 threads)."""
        from pacs.metric.common.parallel import resolve_workers

        resolve_workers(self.workers, "data.workers")


@dataclass
class CorrelationOptions:
    """Optional periodic correlation on an eval benchmark (lazy import of pacs.eval.benchmarks)."""

    benchmark: str | None = None
    data: str | None = None
    images: str | None = None
    every: Annotated[NonNegativeInt, Le(MAX_STEPS)] = 0  # correlation at every N-th validation (0: at each)


@dataclass
class MetricTrainConfig(TrainerConfig):
    """Everything a metric training run needs (YAML + key=value overrides through pacs.metric.common.config).

    The shared trainer fields (seed, mixed_precision, resume, save/eval/log cadence) are `TrainerConfig`'s;
    `resume` names a saved state folder or "latest" (empty: start afresh).
    """

    mode: str = "lora"
    backbone: str | None = "ViT-B-32/openai"
    checkpoint: str | None = None
    arch: str | None = None
    random_init: bool = False
    lora: LoraOptions = field(default_factory=LoraOptions)
    loss: LossOptions = field(default_factory=LossOptions)
    data: DataOptions = field(default_factory=DataOptions)
    correlation: CorrelationOptions = field(default_factory=CorrelationOptions)
    train_logit_scale: bool = False  # also trains the logit bias of a sigmoid-loss (SigLIP) model
    lr: PositiveFloat = 1e-4
    weight_decay: NonNegativeFloat = 0.0
    batch_size: int = 256  # the global batch: pairs per optimizer step (and per loss), all processes; >= 2 (validate)
    micro_batch_size: Annotated[NonNegativeInt, Le(MAX_MICRO_BATCH)] = 0  # pairs encoded at once per process (0: batch_size / processes); memory only
    max_steps: Annotated[NonNegativeInt, Le(MAX_STEPS)] = 0
    max_epochs: Annotated[PositiveInt, Le(10_000)] = 50
    eval_every: Annotated[NonNegativeInt, Le(MAX_STEPS)] = 100  # validation loss every N steps (0: only after the last step)
    patience: Annotated[PositiveInt, Le(MAX_STEPS)] = 1500
    device: str = "auto"  # auto (accelerate's process device) or an explicit one that must match it (pacs.metric.common.device)
    cpu: bool = False  # the same as device: cpu
    output_dir: str = "runs/metric"

    def validate(self) -> None:
        """Check values that would otherwise fail late; InputError names the key."""
        super().validate()
        if self.mode not in MODES:
            raise InputError(f"mode: unknown training mode {self.mode!r} (known: {', '.join(MODES)})")
        if self.batch_size < 2:
            raise InputError(f"batch_size must be >= 2 (in-batch negatives), got {self.batch_size}")
        if self.batch_size > MAX_BATCH:
            raise InputError(f"batch_size={self.batch_size}: expected int <= {MAX_BATCH}")
        micro = self.micro_batch_size or self.batch_size
        if micro < 1 or self.batch_size % micro:
            raise InputError(f"micro_batch_size ({micro}) must be >= 1 and divide batch_size ({self.batch_size})")
        if self.loss.kind not in LOSS_KINDS:
            raise InputError(f"loss.kind must be one of {', '.join(LOSS_KINDS)}, got {self.loss.kind!r}")
        if self.loss.directions not in ("mean", "sum"):
            raise InputError(f"loss.directions must be 'mean' or 'sum', got {self.loss.directions!r}")
        if self.loss.relative_weighting not in ("uniform", "similarity"):
            raise InputError(f"loss.relative_weighting must be 'uniform' or 'similarity', "
                             f"got {self.loss.relative_weighting!r}")
        if not (self.backbone or self.checkpoint or self.random_init):
            raise InputError("name a base: backbone, checkpoint, or random_init=true")
