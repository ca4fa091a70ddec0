"""The metric trainer: PAC-S++ (LoRA), PAC-S (projections) or full fine-tuning under accelerate.

One readable loop: ``accelerator.prepare``; every optimizer step trains one *global* batch of ``batch_size``
pairs, whatever the number of processes and the micro-batch size: each process takes its share of the same
seeded global batch, encodes it in micro-batches, and the contrastive loss covers all ``batch_size`` pairs
(embeddings all-gathered across processes, micro-batches combined with GradCache, see ``metric.training.grad_cache``);
``accelerator.backward``; validation loss (over global batches too) every ``eval_every`` optimizer steps with
early stopping after ``patience`` steps without improvement (the best weights are restored at the end), optional
periodic correlation on an eval benchmark, resumable state
(``save_state`` / ``load_state``). The temperature is the model's ``logit_scale``; it is frozen unless
``train_logit_scale`` is set. Outputs in ``output_dir``: ``checkpoint.safetensors`` (merged, loadable by
``metric.models.backbones.load_backbone``), ``adapter/`` (LoRA mode), ``train_log.json``, ``config.yaml``.
"""
from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from accelerate.logging import get_logger
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

from metric.common.config import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, dump_yaml, to_dict
from metric.common.errors import InputError
from metric.common.io import write_json_atomic
from metric.common.provenance import provenance
from metric.training.distributed import gather_with_grad
from metric.training.grad_cache import grad_cache_step
from metric.training.losses import LossTerms, positive_augmented_loss
from metric.training.data import ShardedEpochBatches, collate_positives, split_micro_batches

if TYPE_CHECKING:
    from metric.models.backbones import Backbone

logger = get_logger(__name__)  # accelerate's: logs once, on the main process

MODES = ("lora", "projection", "full")
FAMILY_OF_MODE = {"lora": "pac-s++", "projection": "pac-s", "full": "clip"}
STATE_DIR = "state"
CHECKPOINT_FILE = "checkpoint.safetensors"
ADAPTER_DIR = "adapter"
CorrelationFn = Callable[["Backbone"], dict[str, float]]
# PAC-S mode: ViT `visual.proj` + `text_projection`; ResNets: the attention pooling; timm/HF towers: their heads
PROJECTION_PREFIXES = ("visual.attnpool.", "visual.head.proj.", "text_projection.", "text.proj.")


@dataclass
class LoraOptions:
    """peft LoRA settings (PAC-S++: rank 4, alpha 1 as the official code, both towers + patch embedding)."""

    rank: PositiveInt = 4
    alpha: float = 1.0
    dropout: float = 0.0
    patch_embedding: bool = True
    targets: list[str] = field(default_factory=lambda: ["attn", "mlp.c_fc", "mlp.c_proj"])


@dataclass
class LossOptions:
    """Loss weights: PAC-S++ defaults λv = 0.1, λt = 0.001 (PAC-S: 0.05, 0.1); extra terms off."""

    lambda_v: float = 0.1
    lambda_t: float = 0.001
    directions: str = "mean"
    relative_weight: float = 0.0
    relative_weighting: str = "uniform"
    margin_weight: float = 0.0
    margin: float = 0.2


@dataclass
class DataOptions:
    """Where the positives come from: a manifest (+ image root), split names, what to do with missing files."""

    manifest: str | None = None
    image_root: str | None = None
    val_manifest: str | None = None
    train_split: str = "train"
    val_split: str = "val"
    skip_missing: bool = False
    num_workers: int = 0
    max_val_pairs: int = 5000


@dataclass
class CorrelationOptions:
    """Optional periodic correlation on an eval benchmark (lazy import of eval.benchmarks)."""

    benchmark: str | None = None
    data: str | None = None
    images: str | None = None
    every: int = 0


@dataclass
class MetricTrainConfig:
    """Everything a metric training run needs (YAML + key=value overrides through metric.common.config)."""

    mode: str = "lora"
    backbone: str | None = "ViT-B-32/openai"
    checkpoint: str | None = None
    arch: str | None = None
    random_init: bool = False
    lora: LoraOptions = field(default_factory=LoraOptions)
    loss: LossOptions = field(default_factory=LossOptions)
    data: DataOptions = field(default_factory=DataOptions)
    correlation: CorrelationOptions = field(default_factory=CorrelationOptions)
    train_logit_scale: bool = False
    lr: PositiveFloat = 1e-4
    weight_decay: NonNegativeFloat = 0.0
    batch_size: int = 256  # the global batch: pairs per optimizer step (and per contrastive loss), all processes
    micro_batch_size: int = 0  # pairs encoded at once per process (0: batch_size / processes); memory only
    max_steps: NonNegativeInt = 0
    max_epochs: PositiveInt = 50
    eval_every: NonNegativeInt = 100
    patience: PositiveInt = 1500
    save_every: NonNegativeInt = 0
    log_every: NonNegativeInt = 10
    mixed_precision: str = "no"
    cpu: bool = False
    seed: int = 0
    output_dir: str = "runs/metric"
    resume: str | None = None

    def validate(self) -> None:
        """Check values that would otherwise fail late; InputError names the key."""
        if self.mode not in MODES:
            raise InputError(f"mode: unknown training mode {self.mode!r} (known: {', '.join(MODES)})")
        if self.batch_size < 2:
            raise InputError(f"batch_size must be >= 2 (in-batch negatives), got {self.batch_size}")
        micro = self.micro_batch_size or self.batch_size
        if micro < 1 or self.batch_size % micro:
            raise InputError(f"micro_batch_size ({micro}) must be >= 1 and divide batch_size ({self.batch_size})")
        if self.loss.directions not in ("mean", "sum"):
            raise InputError(f"loss.directions must be 'mean' or 'sum', got {self.loss.directions!r}")
        if self.loss.relative_weighting not in ("uniform", "similarity"):
            raise InputError(f"loss.relative_weighting must be 'uniform' or 'similarity', "
                             f"got {self.loss.relative_weighting!r}")
        if self.mixed_precision not in ("no", "fp16", "bf16"):
            raise InputError(f"mixed_precision must be no, fp16 or bf16, got {self.mixed_precision!r}")
        if not (self.backbone or self.checkpoint or self.random_init):
            raise InputError("name a base: backbone, checkpoint, or random_init=true")


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


class TrainerState:
    """Counters restored on resume: optimizer step, data position, early-stopping record, best weights."""

    def __init__(self) -> None:
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.best_val = math.inf
        self.best_step = 0
        self.history: list[dict[str, float]] = []
        self.train_losses: list[float] = []  # the global batch's total loss at every optimizer step
        self.best_weights: dict[str, torch.Tensor] = {}

    def state_dict(self) -> dict[str, Any]:
        """Plain data for accelerate's custom-object checkpointing."""
        return {"step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                "best_val": self.best_val, "best_step": self.best_step, "history": self.history,
                "best_weights": self.best_weights, "train_losses": self.train_losses}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict()`; a missing field is an error (a resume must be complete)."""
        for key in ("step", "epoch", "batch_in_epoch", "best_val", "best_step", "history", "best_weights"):
            if key not in state:
                raise InputError(f"resume state lacks {key!r}")
            setattr(self, key, state[key])
        self.train_losses = list(state.get("train_losses", []))


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
                     device: torch.device) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Encode a batch of positives (real and generated images in one pass, texts in one pass).

    Returns ``([v, t, v', t'], logit_scale)``: four float32 ``[n, E]`` normalised embeddings and the temperature.
    """
    images, captions, gen_images, gen_captions = batch
    n = images.shape[0]
    pixels = torch.cat([images, gen_images]).to(device)
    tokens = tokenize(list(captions) + list(gen_captions)).to(device)
    image_emb, text_emb, scale = encoder(pixels, tokens)
    image_emb, text_emb = image_emb.float(), text_emb.float()
    return [image_emb[:n], text_emb[:n], image_emb[n:], text_emb[n:]], scale.float()


def loss_on_embeddings(embeddings: Sequence[torch.Tensor], scale: torch.Tensor, options: LossOptions) -> LossTerms:
    """The positive-augmented loss (with the configured extra terms) of ``[v, t, v', t']`` embeddings."""
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


def _datasets_from_config(config: MetricTrainConfig, backbone: Backbone) -> tuple[Dataset, Dataset]:
    from metric.training.data import ManifestDataset, read_manifest

    data = config.data
    if not data.manifest:
        raise InputError("data.manifest is required (a positives manifest from `pacs generate-positives`)")
    if data.val_manifest:
        train = read_manifest(data.manifest, data.image_root, data.skip_missing)
        val = read_manifest(data.val_manifest, data.image_root, data.skip_missing)
    else:
        train = read_manifest(data.manifest, data.image_root, data.skip_missing, splits=[data.train_split])
        val = read_manifest(data.manifest, data.image_root, data.skip_missing, splits=[data.val_split])
    for name, manifest in (("training", train), ("validation", val)):
        if not manifest.records:
            raise InputError(f"{manifest.path}: no {name} records (split "
                             f"{data.train_split if name == 'training' else data.val_split!r})")
        if manifest.skipped:
            logger.warning("%s set: %d manifest line(s) skipped for missing files", name, len(manifest.skipped))
    return (ManifestDataset(train.records, backbone.preprocess),
            ManifestDataset(val.records[: data.max_val_pairs], backbone.preprocess))


def _correlation_from_config(options: CorrelationOptions) -> CorrelationFn | None:
    if not options.benchmark or not options.every:
        return None

    def run(backbone: Backbone) -> dict[str, float]:
        from metric.training.correlation import benchmark_correlation

        return benchmark_correlation(options.benchmark, options.data, options.images, backbone)

    return run


def _state_dirs(output_dir: Path) -> list[Path]:
    root = output_dir / STATE_DIR
    return sorted(p for p in root.glob("step_*") if p.is_dir()) if root.is_dir() else []


def _resolve_resume(config: MetricTrainConfig, output_dir: Path) -> Path | None:
    if not config.resume:
        return None
    if config.resume == "latest":
        dirs = _state_dirs(output_dir)
        if not dirs:
            raise InputError(f"resume=latest: no saved state under {output_dir / STATE_DIR}")
        return dirs[-1]
    path = Path(config.resume)
    if not path.is_dir():
        raise InputError(f"resume: state folder not found: {path}")
    return path


def _check_state_complete(path: Path) -> None:
    required = ["custom_checkpoint_0.pkl", "random_states_0.pkl"]
    missing = [name for name in required if not (path / name).is_file()]
    if not any(path.glob("optimizer*.bin")) and not any(path.glob("optimizer*.safetensors")):
        missing.append("optimizer.bin")
    if missing:
        raise InputError(f"resume state {path} is incomplete: missing {', '.join(missing)}")


def train_metric(config: MetricTrainConfig, train_dataset: Dataset | None = None, val_dataset: Dataset | None = None,
                 backbone: Backbone | None = None, correlation_fn: CorrelationFn | None = None) -> Path:
    """Train the metric; return the output folder (checkpoint.safetensors, adapter/, train_log.json).

    In-memory use: pass `train_dataset` / `val_dataset` yielding ``(image, caption, gen_image, gen_caption)``
    and optionally a ready `backbone` (else the config's base is loaded); otherwise the manifest is read.
    """
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    config.validate()
    output_dir = Path(config.output_dir)
    _allow_new_precision(config.mixed_precision)
    accelerator = Accelerator(mixed_precision=config.mixed_precision, cpu=config.cpu)
    processes, rank = accelerator.num_processes, accelerator.process_index
    micro = micro_batch_size(config, processes)
    set_seed(config.seed)
    base = backbone if backbone is not None else build_base_backbone(config)
    if train_dataset is None or val_dataset is None:
        file_train, file_val = _datasets_from_config(config, base)
        train_dataset = train_dataset if train_dataset is not None else file_train
        val_dataset = val_dataset if val_dataset is not None else file_val
    if len(train_dataset) < config.batch_size:
        raise InputError(f"training set has {len(train_dataset)} pairs, fewer than one global batch "
                         f"(batch_size={config.batch_size})")
    trained = prepare_trainable(base, config)
    model = trained.model
    model.train()
    params = trainable_parameters(model)
    logger.info("global batch %d = %d process(es) x %d micro-batch(es) of %d pairs", config.batch_size, processes,
                config.batch_size // processes // micro, micro)
    logger.info("mode %s: %d trainable tensors, %d parameters (of %d)", config.mode, len(params),
                sum(p.numel() for p in params.values()), sum(p.numel() for p in model.parameters()))
    encoder = DualEncoder(model)
    optimizer = torch.optim.AdamW(list(params.values()), lr=config.lr, weight_decay=config.weight_decay)
    encoder, optimizer = accelerator.prepare(encoder, optimizer)
    state = TrainerState()
    accelerator.register_for_checkpointing(state)
    resume_dir = _resolve_resume(config, output_dir)
    if resume_dir is not None:
        _check_state_complete(resume_dir)
        try:
            accelerator.load_state(str(resume_dir))
        except (RuntimeError, KeyError, ValueError) as error:
            raise InputError(f"resume state {resume_dir} does not fit this model/config "
                             f"({str(error).splitlines()[0]})") from None
        logger.info("resumed from %s at step %d (epoch %d, batch %d)", resume_dir, state.step, state.epoch,
                    state.batch_in_epoch)
    correlate = correlation_fn or _correlation_from_config(config.correlation)
    unwrapped = accelerator.unwrap_model(encoder).model
    tokenize = trained.tokenize
    device = accelerator.device

    def evaluate(step: int) -> dict[str, float]:
        record = {"step": float(step), **validation_loss(encoder, tokenize, val_dataset, config.batch_size, micro,
                                                         config.loss, device, rank, processes,
                                                         config.data.num_workers)}
        image_emb, text_emb = embed_pairs(unwrapped, tokenize, val_dataset, micro, device)
        record["val_r1"] = image_to_text_recall(image_emb, text_emb, getattr(val_dataset, "image_ids", None))
        every = config.correlation.every or (1 if correlation_fn else 0)
        due = every and (step // max(config.eval_every, 1)) % every == 0
        if correlate is not None and due and accelerator.is_main_process:  # logging only: no effect on stopping
            for name, value in correlate(dataclasses.replace(trained, model=unwrapped)).items():
                record[f"corr_{name}"] = float(value)
        return record

    def remember_if_best(record: dict[str, float]) -> None:
        if record["val_total"] < state.best_val:
            state.best_val, state.best_step = record["val_total"], int(record["step"])
            state.best_weights = {name: p.detach().cpu().clone() for name, p in trainable_parameters(unwrapped).items()}

    if not state.history:
        state.history.append(evaluate(0))
        remember_if_best(state.history[-1])
        logger.info("step 0: %s", _fmt(state.history[-1]))
    steps_per_epoch = len(train_dataset) // config.batch_size
    if len(train_dataset) % config.batch_size:
        logger.info("each epoch leaves out %d of %d training pairs (a different random remainder each epoch)",
                    len(train_dataset) % config.batch_size, len(train_dataset))
    total_steps = config.max_steps or steps_per_epoch * config.max_epochs
    progress = tqdm(total=total_steps, initial=state.step, desc="train-metric", disable=not accelerator.is_main_process)
    stop = state.step >= total_steps or state.step - state.best_step >= config.patience
    started, running = time.time(), []
    while not stop and state.epoch < config.max_epochs:
        batches = ShardedEpochBatches(len(train_dataset), config.batch_size, config.seed, state.epoch,
                                      state.batch_in_epoch, rank, processes)
        loader = DataLoader(train_dataset, batch_sampler=batches, collate_fn=collate_positives,
                            num_workers=config.data.num_workers)
        for batch in loader:  # this process's share of one global batch
            terms = grad_cache_step(
                split_micro_batches(batch, micro), lambda part: encode_positives(encoder, tokenize, part, device),
                lambda embeddings, scale: loss_on_embeddings(embeddings, scale, config.loss), accelerator.backward,
                lambda: accelerator.no_sync(encoder), averaged_over=processes, device=device)
            optimizer.step()
            optimizer.zero_grad()
            state.batch_in_epoch += 1
            running.append(float(terms.total.detach()))
            state.train_losses.append(running[-1])
            state.step += 1
            progress.update(1)
            if config.log_every and state.step % config.log_every == 0:
                progress.set_postfix(loss=sum(running) / len(running))
                running = []
            if config.eval_every and state.step % config.eval_every == 0:
                record = evaluate(state.step)
                state.history.append(record)
                remember_if_best(record)
                logger.info("step %d: %s", state.step, _fmt(record))
            if config.save_every and state.step % config.save_every == 0:
                accelerator.save_state(str(output_dir / STATE_DIR / f"step_{state.step:08d}"))
            if state.step >= total_steps or state.step - state.best_step >= config.patience:
                stop = True
                break
        else:
            state.epoch += 1
            state.batch_in_epoch = 0
    progress.close()
    if config.eval_every == 0 or state.history[-1]["step"] != state.step:
        record = evaluate(state.step)
        state.history.append(record)
        remember_if_best(record)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        _restore_best(unwrapped, state.best_weights)
        _save_outputs(config, trained, unwrapped, state, output_dir, time.time() - started)
    accelerator.wait_for_everyone()
    if config.mixed_precision != "no" and accelerator.num_processes == 1:
        _allow_new_precision("no")  # do not leave autocast on for later Accelerators of this process
    return output_dir


def micro_batch_size(config: MetricTrainConfig, processes: int) -> int:
    """Pairs each process encodes at once: `micro_batch_size`, or by default its whole share of the global batch."""
    if config.batch_size % processes:
        raise InputError(f"batch_size ({config.batch_size}) must be a multiple of the number of processes "
                         f"({processes}): it is the global batch")
    share = config.batch_size // processes
    micro = config.micro_batch_size or share
    if share % micro:
        raise InputError(f"micro_batch_size ({micro}) must divide each process's share of the global batch "
                         f"(batch_size {config.batch_size} / {processes} process(es) = {share})")
    return micro


def _allow_new_precision(mixed_precision: str) -> None:
    """Let a single-process caller run several trainings with different precisions in one Python process.

    accelerate keeps one process-wide state and refuses a second Accelerator with another mixed precision; when
    nothing is distributed that state is safe to drop (under `accelerate launch` it is kept and must match).
    """
    from accelerate.state import AcceleratorState, PartialState

    shared = AcceleratorState._shared_state
    if shared and shared.get("_mixed_precision") != mixed_precision and PartialState().num_processes == 1:
        AcceleratorState._reset_state()


def _fmt(record: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4f}" for k, v in record.items() if k != "step")


def _restore_best(model: nn.Module, best: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        current = dict(model.named_parameters())
        for name, value in best.items():
            current[name].copy_(value.to(current[name].device))


def _save_outputs(config: MetricTrainConfig, trained: Backbone, model: nn.Module, state: TrainerState,
                  output_dir: Path, seconds: float) -> None:
    from metric.models.backbones import save_backbone
    from metric.models.backbones import model_fingerprint
    from metric.models.lora import base_from_source, merge_lora, save_adapter

    model.eval()
    backbone = dataclasses.replace(trained, model=model)
    base_source = base_from_source(trained)
    if base_source is not None and config.arch:
        base_source["arch"] = config.arch
    files: dict[str, str] = {"checkpoint": CHECKPOINT_FILE}
    if config.mode == "lora":
        save_adapter(backbone, output_dir / ADAPTER_DIR, base=base_source)
        files["adapter"] = ADAPTER_DIR
        backbone = merge_lora(backbone)
    else:
        for param in model.parameters():
            param.requires_grad_(False)
        fingerprint = model_fingerprint(model, backbone.open_clip_config, backbone.preprocess)
        backbone = dataclasses.replace(backbone, fingerprint=fingerprint)
    save_backbone(backbone, output_dir / CHECKPOINT_FILE)
    dump_yaml(config, output_dir / "config.yaml")
    write_json_atomic(output_dir / "train_log.json", {
        "history": state.history, "best_step": state.best_step, "best_val_total": state.best_val,
        "steps": state.step, "train_losses": state.train_losses, "seconds": seconds, "files": files,
        "provenance": provenance(config=to_dict(config), seed=config.seed, mode=config.mode,
                                 base=trained.name, family=FAMILY_OF_MODE[config.mode])})
    logger.info("saved %s (best step %d, val loss %.4f)", output_dir, state.best_step, state.best_val)
