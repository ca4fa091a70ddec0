"""The metric trainer: PAC-S++ (LoRA), PAC-S (projections) or full fine-tuning under accelerate.

One readable loop: ``accelerator.prepare``; every optimizer step trains one *global* batch of ``batch_size``
pairs, whatever the number of processes and the micro-batch size: each process takes its share of the same
seeded global batch, encodes it in micro-batches, and the contrastive loss covers all ``batch_size`` pairs
(embeddings all-gathered across processes, micro-batches combined with GradCache, see ``pacs.metric.training.grad_cache``);
``accelerator.backward``; validation loss (over global batches too) every ``eval_every`` optimizer steps with
early stopping after ``patience`` steps without improvement (the best weights are restored at the end), optional
periodic correlation on an eval benchmark, resumable state
(accelerate's ``save_state`` / ``load_state`` for model, optimizer and RNG, read only after
``pacs.metric.training.resume_files.check_state_folder``; the trainer's counters in JSON + safetensors). The loss is InfoNCE, or SigLIP's sigmoid loss for a model with a ``logit_bias``
(``loss.kind``, see ``pacs.metric.training.losses``). The temperature is the model's ``logit_scale`` (and ``logit_bias`` for
the sigmoid loss); both are frozen unless ``train_logit_scale`` is set (or in ``full`` mode). Outputs in ``output_dir``: ``checkpoint.safetensors`` (merged, loadable by
``pacs.metric.models.factory.load_backbone``), ``adapter/`` (LoRA mode), ``train_log.json``, ``config.yaml``.
"""
from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from accelerate.logging import get_logger
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from pacs.metric.common.device import allow_new_precision, build_accelerator
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import finite_or_none
from pacs.metric.common.optim import make_adam
from pacs.metric.training.batches import batch_loader
from pacs.metric.training.config import (
    FAMILY_OF_MODE,
    MODES,
    CorrelationOptions,
    DataOptions,
    LoraOptions,
    LossOptions,
    MetricTrainConfig,
)
from pacs.metric.training.data import (
    ManifestDataset,
    ShardedEpochBatches,
    collate_positives,
    read_manifest,
    split_micro_batches,
)
from pacs.metric.training.divergence import any_process, check_loss, check_weights, diverged
from pacs.metric.training.encoding import (
    PROJECTION_PREFIXES,
    DualEncoder,
    PositivesBatch,
    build_base_backbone,
    check_trainable_backbone,
    compute_loss,
    embed_pairs,
    encode_positives,
    image_to_text_recall,
    loss_on_embeddings,
    prepare_trainable,
    trainable_parameters,
    validation_loss,
)
from pacs.metric.training.grad_cache import grad_cache_step
from pacs.metric.training.losses import positives_needed
from pacs.metric.training.resume_files import check_resume_step, check_state_folder
from pacs.metric.training.state import (
    ADAPTER_DIR,
    CHECKPOINT_FILE,
    STATE_DIR,
    TRAINER_STATE_FILE,
    TrainerState,
    check_output_folders,
    check_state_complete,
    resolve_resume,
    restore_best,
    save_outputs,
    save_state_folder,
)

if TYPE_CHECKING:
    from pacs.metric.models.backbones import Backbone

__all__ = [  # this module's public names (the option groups and helpers live in config / encoding / state)
    "ADAPTER_DIR", "CHECKPOINT_FILE", "FAMILY_OF_MODE", "MODES", "PROJECTION_PREFIXES", "STATE_DIR",
    "CorrelationFn", "CorrelationOptions", "DataOptions", "DualEncoder", "LoraOptions", "LossOptions",
    "MetricTrainConfig", "PositivesBatch", "TrainerState", "build_base_backbone", "compute_loss", "embed_pairs",
    "encode_positives", "image_to_text_recall", "loss_on_embeddings", "micro_batch_size", "prepare_trainable",
    "train_metric", "trainable_parameters", "validation_loss",
]

logger = get_logger(__name__)  # accelerate's: logs once, on the main process

CorrelationFn = Callable[["Backbone"], dict[str, float]]


def _datasets_from_config(config: MetricTrainConfig, backbone: Backbone) -> tuple[Dataset, Dataset]:

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


def planned_steps(config: MetricTrainConfig, pairs: int) -> int:
    """The optimizer steps a run over `pairs` training pairs makes: `max_steps`, else `max_epochs` full epochs."""
    return config.max_steps or (pairs // config.batch_size) * config.max_epochs


def train_metric(config: MetricTrainConfig, train_dataset: Dataset | None = None, val_dataset: Dataset | None = None,
                 backbone: Backbone | None = None, correlation_hook: CorrelationFn | None = None,
                 correlation_fn: CorrelationFn | None = None) -> Path:
    """Train the metric; return the output folder (checkpoint.safetensors, adapter/, train_log.json).

    In-memory use: pass `train_dataset` / `val_dataset` yielding ``(image, caption, gen_image, gen_caption)``
    and optionally a ready `backbone` (else the config's base is loaded); otherwise the manifest is read.
    `correlation_hook(backbone) -> {key: number}` runs at the evaluations (every `config.correlation.every`-th,
    else each) and is logged as ``corr_<key>``; `pacs.eval.training_hook.correlation_hook_from_config` builds it
    from `config.correlation` (`correlation_fn` is its deprecated name).
    """
    if correlation_fn is not None:
        warnings.warn("train_metric(correlation_fn=) is deprecated: pass correlation_hook=", DeprecationWarning,
                      stacklevel=2)
        correlation_hook = correlation_hook or correlation_fn
    from accelerate.utils import set_seed


    config.validate()
    output_dir = Path(config.output_dir)
    check_output_folders(output_dir)  # no link planted in it is written through
    _allow_new_precision(config.mixed_precision)
    accelerator = build_accelerator("cpu" if config.cpu else config.device, config.mixed_precision)
    if correlation_hook is None and config.correlation.benchmark and config.correlation.every:
        logger.warning("correlation.benchmark is set but no correlation_hook was passed: no periodic correlation "
                       "(build one with pacs.eval.training_hook.correlation_hook_from_config(config.correlation))")
    processes, rank = accelerator.num_processes, accelerator.process_index
    micro = micro_batch_size(config, processes)
    set_seed(config.seed)
    base = backbone if backbone is not None else build_base_backbone(config)
    check_trainable_backbone(base)
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
    encoder = DualEncoder(model, config.loss.kind)
    logger.info("loss: %s (loss.kind=%s)", encoder.loss_kind, config.loss.kind)
    optimizer = make_adam(params.values(), decoupled_weight_decay=True, lr=config.lr,
                          weight_decay=config.weight_decay)
    encoder, optimizer = accelerator.prepare(encoder, optimizer)
    state = TrainerState()  # saved as JSON + safetensors by pacs, not registered with accelerate (no pickle)
    resume_dir = resolve_resume(config, output_dir)
    if resume_dir is not None:
        check_state_folder(resume_dir)  # every pickle-based file: weights only, or one error naming it
        check_state_complete(resume_dir)
        try:
            accelerator.load_state(str(resume_dir))
        except (RuntimeError, KeyError, ValueError) as error:
            raise InputError(f"resume state {resume_dir} does not fit this model/config "
                             f"({str(error).splitlines()[0]})") from None
        state.load(resume_dir)
        check_resume_step(state.step, resume_dir / TRAINER_STATE_FILE, planned_steps(config, len(train_dataset)))
        logger.info("resumed from %s at step %d (epoch %d, batch %d)", resume_dir, state.step, state.epoch,
                    state.batch_in_epoch)
    correlate = correlation_hook
    unwrapped = accelerator.unwrap_model(encoder).model
    tokenize = trained.tokenize
    device = accelerator.device

    stage, hint = f"metric training ({config.mode})", f"lr={config.lr:g}"

    def evaluate(step: int) -> dict[str, float | None]:
        check_weights(accelerator, unwrapped, stage, step, hint)
        losses = validation_loss(encoder, tokenize, val_dataset, config.batch_size, micro, config.loss, device, rank,
                                 processes, config.data.num_workers, config.data.workers)
        record: dict[str, float | None] = {"step": float(step), **losses}
        image_emb, text_emb = embed_pairs(unwrapped, tokenize, val_dataset, micro, device, config.data.workers)
        record["val_r1"] = image_to_text_recall(image_emb, text_emb, getattr(val_dataset, "image_ids", None))
        every = config.correlation.every or 1
        due = every and (step // max(config.eval_every, 1)) % every == 0
        if correlate is not None and due and accelerator.is_main_process:  # logging only: no effect on stopping
            for name, value in correlate(dataclasses.replace(trained, model=unwrapped)).items():
                record[f"corr_{name}"] = finite_or_none(value)  # an undefined correlation is null, not NaN
        if any_process(accelerator, not math.isfinite(record["val_total"])):
            raise diverged(stage, step, f"the validation loss is {record['val_total']}", hint)
        return record

    def remember_if_best(record: dict[str, float | None]) -> None:
        if record["val_total"] < state.best_val:  # finite: evaluate() stops a run whose loss is not
            state.best_val, state.best_step = record["val_total"], int(record["step"])
            state.best_weights = {name: p.detach().cpu().clone() for name, p in trainable_parameters(unwrapped).items()}

    if not state.history:
        state.history.append(evaluate(0))
        remember_if_best(state.history[-1])
        logger.info("step 0: %s", _fmt(state.history[-1]))
    if len(train_dataset) % config.batch_size:
        logger.info("each epoch leaves out %d of %d training pairs (a different random remainder each epoch)",
                    len(train_dataset) % config.batch_size, len(train_dataset))
    total_steps = planned_steps(config, len(train_dataset))
    progress = tqdm(total=total_steps, initial=state.step, desc="train-metric", disable=not accelerator.is_main_process)
    stop = state.step >= total_steps or state.step - state.best_step >= config.patience
    started, running = time.time(), []
    needed_positives = positives_needed(config.loss.lambda_v, config.loss.lambda_t, config.loss.relative_weight)
    if not all(needed_positives):
        logger.info("training encodes no %s: their loss weight is 0",
                    " and no ".join(name for name, needed in zip(("generated images (v')", "generated captions (t')"),
                                                                  needed_positives) if not needed))
    try:  # the bar is closed before an error (e.g. a diverged loss) is printed
        while not stop and state.epoch < config.max_epochs:
            batches = ShardedEpochBatches(len(train_dataset), config.batch_size, config.seed, state.epoch,
                                          state.batch_in_epoch, rank, processes)
            loader = batch_loader(train_dataset, batches, collate_positives, config.data.num_workers,
                                  config.data.workers)  # images decoded by threads, one batch ahead
            for batch in loader:  # this process's share of one global batch
                terms = grad_cache_step(
                    split_micro_batches(batch, micro),
                    lambda part: encode_positives(encoder, tokenize, part, device, *needed_positives),
                    lambda embeddings, scale: loss_on_embeddings(embeddings, scale, config.loss), accelerator.backward,
                    lambda: accelerator.no_sync(encoder), averaged_over=processes, device=device)
                check_loss(accelerator, float(terms.total.detach()), stage, state.step + 1, hint)
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
                    check_weights(accelerator, unwrapped, stage, state.step, hint)
                    save_state_folder(accelerator, state, output_dir)
                if state.step >= total_steps or state.step - state.best_step >= config.patience:
                    stop = True
                    break
            else:
                state.epoch += 1
                state.batch_in_epoch = 0
    finally:
        progress.close()
    if config.eval_every == 0 or state.history[-1]["step"] != state.step:
        record = evaluate(state.step)
        state.history.append(record)
        remember_if_best(record)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        restore_best(unwrapped, state.best_weights)
        save_outputs(config, trained, unwrapped, state, output_dir, time.time() - started,
                     loss_kind=accelerator.unwrap_model(encoder).loss_kind)
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
    """Let a single-process caller run several trainings with different precisions (`pacs.metric.common.device`)."""

    allow_new_precision(mixed_precision)


def _fmt(record: dict[str, float | None]) -> str:
    return " ".join(f"{k}={'null' if v is None else f'{v:.4f}'}" for k, v in record.items() if k != "step")
