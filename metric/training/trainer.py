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
from typing import TYPE_CHECKING, Any

from accelerate.logging import get_logger
from accelerate.utils import set_seed
from torch.utils.data import Dataset

from pacs.metric.common.device import allow_new_precision, build_accelerator
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import finite_or_none
from pacs.metric.common.optim import make_adam
from pacs.metric.common.progress import progress
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
    loop = MetricLoop(config, train_dataset, val_dataset, backbone, correlation_hook)
    loop.begin()
    try:  # the bar is closed before an error (e.g. a diverged loss) is printed
        while not loop.stop and loop.state.epoch < config.max_epochs:
            loop.run_epoch()
    finally:
        loop.progress.close()
    return loop.result()


class MetricLoop:
    """The metric trainer's loop: a set-up (`__init__`, `begin`), a step (`step`, one global batch), a
    check-point (`checkpoint`) and a result (`result`); the resumable counters are `state` (`TrainerState`)."""

    def __init__(self, config: MetricTrainConfig, train_dataset: Dataset | None, val_dataset: Dataset | None,
                 backbone: Backbone | None, correlation_hook: CorrelationFn | None) -> None:
        """Check the config, build the trainable model and the data, prepare the optimizer, restore a saved state."""
        config.validate()
        self.config, self.correlate = config, correlation_hook
        self.output_dir = Path(config.output_dir)
        check_output_folders(self.output_dir)  # no link planted in it is written through
        _allow_new_precision(config.mixed_precision)
        self.accelerator = accelerator = build_accelerator("cpu" if config.cpu else config.device,
                                                           config.mixed_precision)
        if correlation_hook is None and config.correlation.benchmark and config.correlation.every:
            logger.warning("correlation.benchmark is set but no correlation_hook was passed: no periodic correlation "
                           "(build one with pacs.eval.training_hook.correlation_hook_from_config(config.correlation))")
        self.processes, self.rank = accelerator.num_processes, accelerator.process_index
        self.micro = micro_batch_size(config, self.processes)
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
        self.train_dataset, self.val_dataset = train_dataset, val_dataset
        self.trained = trained = prepare_trainable(base, config)
        self._prepare(trained.model)
        self.state = TrainerState()  # saved as JSON + safetensors by pacs, not registered with accelerate (no pickle)
        self._resume()
        self.unwrapped = accelerator.unwrap_model(self.encoder).model
        self.tokenize, self.device = trained.tokenize, accelerator.device
        self.stage, self.hint = f"metric training ({config.mode})", f"lr={config.lr:g}"

    def _prepare(self, model: Any) -> None:
        """Log the batch split and the trainable parameters; the encoder and its optimizer, prepared."""
        config, processes = self.config, self.processes
        model.train()
        params = trainable_parameters(model)
        logger.info("global batch %d = %d process(es) x %d micro-batch(es) of %d pairs", config.batch_size,
                    processes, config.batch_size // processes // self.micro, self.micro)
        logger.info("mode %s: %d trainable tensors, %d parameters (of %d)", config.mode, len(params),
                    sum(p.numel() for p in params.values()), sum(p.numel() for p in model.parameters()))
        encoder = DualEncoder(model, config.loss.kind)
        logger.info("loss: %s (loss.kind=%s)", encoder.loss_kind, config.loss.kind)
        optimizer = make_adam(params.values(), decoupled_weight_decay=True, lr=config.lr,
                              weight_decay=config.weight_decay)
        self.encoder, self.optimizer = self.accelerator.prepare(encoder, optimizer)

    def _resume(self) -> None:
        """Load the saved state the config's `resume` names, if any (checked before anything is unpickled)."""
        config, state = self.config, self.state
        resume_dir = resolve_resume(config, self.output_dir)
        if resume_dir is None:
            return
        check_state_folder(resume_dir)  # every pickle-based file: weights only, or one error naming it
        check_state_complete(resume_dir)
        try:
            self.accelerator.load_state(str(resume_dir))
        except (RuntimeError, KeyError, ValueError) as error:
            raise InputError(f"resume state {resume_dir} does not fit this model/config "
                             f"({str(error).splitlines()[0]})") from None
        state.load(resume_dir)
        check_resume_step(state.step, resume_dir / TRAINER_STATE_FILE, planned_steps(config, len(self.train_dataset)))
        logger.info("resumed from %s at step %d (epoch %d, batch %d)", resume_dir, state.step, state.epoch,
                    state.batch_in_epoch)

    def begin(self) -> None:
        """Evaluate the initial model (a fresh run), start the progress bar and the clock."""
        config, state, train_dataset = self.config, self.state, self.train_dataset
        if not state.history:
            self.record(self.evaluate(0))
            logger.info("step 0: %s", _fmt(state.history[-1]))
        if len(train_dataset) % config.batch_size:
            logger.info("each epoch leaves out %d of %d training pairs (a different random remainder each epoch)",
                        len(train_dataset) % config.batch_size, len(train_dataset))
        self.total_steps = planned_steps(config, len(train_dataset))
        self.progress = progress(total=self.total_steps, initial=state.step, desc="train-metric",
                                 disable=not self.accelerator.is_main_process)
        self.stop = state.step >= self.total_steps or state.step - state.best_step >= config.patience
        self.started, self.running = time.time(), []
        self.needed_positives = positives_needed(config.loss.lambda_v, config.loss.lambda_t,
                                                 config.loss.relative_weight)
        if not all(self.needed_positives):
            logger.info("training encodes no %s: their loss weight is 0",
                        " and no ".join(name for name, needed in zip(("generated images (v')", "generated captions (t')"),
                                                                      self.needed_positives) if not needed))

    def evaluate(self, step: int) -> dict[str, float | None]:
        """Validation losses, image-to-text R@1 and (when due) the correlation hook's numbers at `step`."""
        config, accelerator, unwrapped = self.config, self.accelerator, self.unwrapped
        check_weights(accelerator, unwrapped, self.stage, step, self.hint)
        losses = validation_loss(self.encoder, self.tokenize, self.val_dataset, config.batch_size, self.micro,
                                 config.loss, self.device, self.rank, self.processes, config.data.num_workers,
                                 config.data.workers)
        record: dict[str, float | None] = {"step": float(step), **losses}
        image_emb, text_emb = embed_pairs(unwrapped, self.tokenize, self.val_dataset, self.micro, self.device,
                                          config.data.workers)
        record["val_r1"] = image_to_text_recall(image_emb, text_emb, getattr(self.val_dataset, "image_ids", None))
        every = config.correlation.every or 1
        due = every and (step // max(config.eval_every, 1)) % every == 0
        if self.correlate is not None and due and accelerator.is_main_process:  # logging only: no effect on stopping
            for name, value in self.correlate(dataclasses.replace(self.trained, model=unwrapped)).items():
                record[f"corr_{name}"] = finite_or_none(value)  # an undefined correlation is null, not NaN
        if any_process(accelerator, not math.isfinite(record["val_total"])):
            raise diverged(self.stage, step, f"the validation loss is {record['val_total']}", self.hint)
        return record

    def record(self, record: dict[str, float | None]) -> None:
        """Append an evaluation to the history; keep the trainable weights when its loss is the best so far."""
        state = self.state
        state.history.append(record)
        if record["val_total"] < state.best_val:  # finite: evaluate() stops a run whose loss is not
            state.best_val, state.best_step = record["val_total"], int(record["step"])
            state.best_weights = {name: p.detach().cpu().clone()
                                  for name, p in trainable_parameters(self.unwrapped).items()}

    def run_epoch(self) -> None:
        """Train on this process's share of the epoch's global batches until the epoch, the steps or the patience
        ends (a stop sets `stop` and leaves the epoch counter where a resume continues it)."""
        config, state = self.config, self.state
        batches = ShardedEpochBatches(len(self.train_dataset), config.batch_size, config.seed, state.epoch,
                                      state.batch_in_epoch, self.rank, self.processes)
        loader = batch_loader(self.train_dataset, batches, collate_positives, config.data.num_workers,
                              config.data.workers)  # images decoded by threads, one batch ahead
        for batch in loader:  # this process's share of one global batch
            if self.step(batch):
                self.checkpoint()
            if state.step >= self.total_steps or state.step - state.best_step >= config.patience:
                self.stop = True
                return
        state.epoch += 1
        state.batch_in_epoch = 0

    def step(self, batch: Any) -> bool:
        """One optimizer step on a global batch (GradCache over micro-batches), its log and evaluation; whether a
        check-point is due."""
        config, state, accelerator = self.config, self.state, self.accelerator
        terms = grad_cache_step(
            split_micro_batches(batch, self.micro),
            lambda part: encode_positives(self.encoder, self.tokenize, part, self.device, *self.needed_positives),
            lambda embeddings, scale: loss_on_embeddings(embeddings, scale, config.loss), accelerator.backward,
            lambda: accelerator.no_sync(self.encoder), averaged_over=self.processes, device=self.device)
        check_loss(accelerator, float(terms.total.detach()), self.stage, state.step + 1, self.hint)
        self.optimizer.step()
        self.optimizer.zero_grad()
        state.batch_in_epoch += 1
        self.running.append(float(terms.total.detach()))
        state.train_losses.append(self.running[-1])
        state.step += 1
        self.progress.update(1)
        if config.log_every and state.step % config.log_every == 0:
            self.progress.set_postfix(loss=sum(self.running) / len(self.running))
            self.running = []
        if config.eval_every and state.step % config.eval_every == 0:
            self.record(self.evaluate(state.step))
            logger.info("step %d: %s", state.step, _fmt(state.history[-1]))
        return bool(config.save_every and state.step % config.save_every == 0)

    def checkpoint(self) -> None:
        """Save the resumable state folder (weights checked first)."""
        check_weights(self.accelerator, self.unwrapped, self.stage, self.state.step, self.hint)
        save_state_folder(self.accelerator, self.state, self.output_dir)

    def result(self) -> Path:
        """Evaluate the last step (unless just done), restore the best weights, write the outputs; the folder."""
        config, state, accelerator = self.config, self.state, self.accelerator
        if config.eval_every == 0 or state.history[-1]["step"] != state.step:
            self.record(self.evaluate(state.step))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            restore_best(self.unwrapped, state.best_weights)
            save_outputs(config, self.trained, self.unwrapped, state, self.output_dir, time.time() - self.started,
                         loss_kind=accelerator.unwrap_model(self.encoder).loss_kind)
        accelerator.wait_for_everyone()
        if config.mixed_precision != "no" and accelerator.num_processes == 1:
            _allow_new_precision("no")  # do not leave autocast on for later Accelerators of this process
        return self.output_dir


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
