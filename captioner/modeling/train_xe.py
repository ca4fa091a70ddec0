"""Stage 1: cross-entropy training with teacher forcing (PAC-S++ §5.1), under accelerate.

Adam with the PAC-S++ schedule (`pacs.captioner.modeling.training_setup.pacs_lr`), a global batch of `batch_size` captions
reached with gradient accumulation, validation by CIDEr-D of beam-search captions, best model kept.
The loss of a batch is the mean over captions of each caption's mean token NLL (its <eos> included), so
any split of a global batch over processes and micro-batches gives the same loss and gradient; dropout masks are
drawn per caption from generators seeded by (seed, step, global example index) (`pacs.captioner.modeling.example_rng`), so
they do not depend on that split either, and a resumed run draws the same masks as an uninterrupted one.
"""
from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
import torch.nn.functional as F
from accelerate.utils import broadcast_object_list, gather_object
from annotated_types import Le

from pacs.captioner.modeling.caption_ids import EncodedCaptions
from pacs.captioner.modeling.checkpoints import CheckpointManager, save_captioner
from pacs.captioner.modeling.decoding import beam_search
from pacs.captioner.modeling.example_rng import DROPOUT, ExampleRNG, example_generators
from pacs.captioner.modeling.features import FeatureCache
from pacs.captioner.modeling.model import Captioner, CaptionerConfig, sequence_mask, shift_right
from pacs.captioner.modeling.training_setup import (
    BatchPlan,
    ScheduleConfig,
    check_trackers,
    finish_trackers,
    make_accelerator,
    pacs_scheduler,
    reduce_mean,
    start_trackers,
    tracker_names,
)
from pacs.captioner.modeling.vocab import Vocab, ptb_tokenize_fast
from pacs.eval.cider import cider_d
from pacs.metric.common.config import (
    MAX_BATCH,
    MAX_BEAM,
    MAX_IMAGES,
    MAX_MICRO_BATCH,
    MAX_STEPS,
    Fraction,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    check_batch_split,
    to_dict,
)
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import finite_or_none
from pacs.metric.common.optim import make_adam
from pacs.metric.common.progress import FEW_STEPS
from pacs.metric.common.progress import progress as progress_bar
from pacs.metric.common.seeding import seed_everything
from pacs.metric.common.trainer_config import TrainerConfig, is_due, resume_target
from pacs.metric.training.divergence import check_loss, check_weights

logger = logging.getLogger(__name__)

Validator = Callable[[Mapping[str, str], Mapping[str, Sequence[str]]], float]
XE_COLUMNS = ("loss", "lr", "tokens", "val_cider", "epoch")


@dataclass
class XEConfig(TrainerConfig):
    """Stage-1 settings (defaults: PAC-S++ §5.1); the shared trainer fields are `TrainerConfig`'s."""

    output_dir: str = "runs/xe"
    max_steps: Annotated[PositiveInt, Le(MAX_STEPS)] = 20000
    batch_size: Annotated[PositiveInt, Le(MAX_BATCH)] = 1024
    micro_batch_size: Annotated[NonNegativeInt, Le(MAX_MICRO_BATCH)] = 64  # per process; 0: batch_size / processes (derived by the pipeline)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    weight_decay: NonNegativeFloat = 0.0
    grad_clip: NonNegativeFloat = 1.0
    label_smoothing: Fraction = 0.0
    eval_every: Annotated[NonNegativeInt, Le(MAX_STEPS)] = 1000  # validate every N steps (0: only after the last step)
    val_beam_size: Annotated[PositiveInt, Le(MAX_BEAM)] = 5
    val_batch_size: Annotated[PositiveInt, Le(MAX_MICRO_BATCH)] = 50
    val_max_images: Annotated[NonNegativeInt, Le(MAX_IMAGES)] = 0
    save_every: Annotated[NonNegativeInt, Le(MAX_STEPS)] = 1000  # checkpoint every N steps (0: only after the last step)
    keep_checkpoints: Annotated[NonNegativeInt, Le(1000)] = 2
    log_every: Annotated[NonNegativeInt, Le(MAX_STEPS)] = 10  # log every N steps (0: only the last step)
    seed: int = 42
    trackers: list[str] | None = None  # accelerate's log_with by name (None: tensorboard when installed)
    tensorboard: bool | None = None  # deprecated (0.8 drops it): trackers

    def validate(self) -> None:
        """Cross-field checks run when the config is loaded (pacs.metric.common.config.from_dict)."""
        super().validate()
        check_trackers(self, "xe")
        if self.micro_batch_size:
            check_batch_split("", self.batch_size, self.micro_batch_size)


@dataclass
class XEResult:
    """What stage 1 produced."""

    best_dir: Path
    final_dir: Path
    best_score: float  # -inf when nothing was validated
    best_step: int
    steps: int
    losses: list[float]


def cider_validator(captions: Mapping[str, str], references: Mapping[str, Sequence[str]]) -> float:
    """Corpus CIDEr-D (×100) of `captions` against `references` (PTB-style tokens, df from the references)."""

    ids = list(captions)
    candidates = [" ".join(ptb_tokenize_fast(captions[i])) for i in ids]
    refs = [[" ".join(ptb_tokenize_fast(r)) for r in references[i]] for i in ids]
    return float(100.0 * cider_d(candidates, refs, tokenized=True).mean())


def encode_captions(vocab: Vocab, captions: Sequence[str]) -> torch.Tensor:
    """Targets `[N, max_length+1]`: the caption's ids, <eos>, then <pad> (training keeps `EncodedCaptions` instead)."""
    return EncodedCaptions.encode(vocab, captions).targets(np.arange(len(captions)))


def caption_images(train: Sequence[tuple[str, str]]) -> tuple[Sequence[str], Any]:
    """The distinct image ids of `train` (first-seen order) and, per caption, the int32 index of its image (a
    list and an array; on disk for a `CaptionPairs` view)."""
    image_index = getattr(train, "image_index", None)
    if image_index is not None and hasattr(train, "image_ids"):  # a CaptionPairs view: both on disk already
        return train.image_ids(), image_index
    position: dict[str, int] = {}
    index = np.fromiter((position.setdefault(image_id, len(position)) for image_id, _ in train), dtype=np.int32,
                        count=len(train))
    return list(position), index


def image_rows(features: FeatureCache, image_ids: Sequence[str], image_of_caption: Any, captions: Sequence[int],
               device: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The features of the distinct images of `captions` (first-seen order) and each caption's row among them:
    an image with several captions in the micro-batch is fetched once (and encoded once where
    `Captioner.forward(rows=...)` can)."""
    position: dict[int, int] = {}
    rows = [position.setdefault(int(image_of_caption[int(i)]), len(position)) for i in captions]
    feats = features.get([image_ids[image] for image in position]).to(device)
    return feats, torch.tensor(rows, dtype=torch.long, device=device)


def xe_loss(logits: torch.Tensor, targets: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Per-caption mean token NLL `[B]` (tokens up to the first <eos>)."""
    mask = sequence_mask(targets)
    nll = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none", label_smoothing=label_smoothing)
    return (nll * mask).sum(1) / mask.sum(1).clamp(min=1)


@torch.no_grad()
def generate_captions(model: Captioner, vocab: Vocab, features: FeatureCache, image_ids: Sequence[str],
                      beam_size: int = 5, batch_size: int = 50, device: Any = None,
                      progress: bool = False) -> dict[str, str]:
    """Beam-search captions (best beam) for `image_ids` (on `device`, by default the model's)."""
    model.eval()
    device = device if device is not None else next(model.parameters()).device
    captions: dict[str, str] = {}
    starts = range(0, len(image_ids), batch_size)  # a bar for a few batches only flashes by (monitor, validation)
    for start in progress_bar(starts, desc="captioning", leave=False, disable=not progress or len(starts) < FEW_STEPS):
        chunk = list(image_ids[start:start + batch_size])
        decoded = beam_search(model, features.get(chunk).to(device), beam_size=beam_size, return_k=1)
        for image_id, tokens in zip(chunk, decoded.tokens[:, 0]):
            captions[image_id] = vocab.decode(tokens.tolist())
    return captions


def train_xe(config: XEConfig, model_config: CaptionerConfig, vocab: Vocab, features: FeatureCache,
             train: Sequence[tuple[str, str]], val: Mapping[str, Sequence[str]],
             validate: Validator | None = None, feature_source: Mapping[str, Any] | None = None) -> XEResult:
    """Train stage 1 on `train` ((image_id, caption) pairs); validate on `val` ({image_id: references}).

    Resumes from the latest checkpoint in `<output_dir>/checkpoints` (or the folder `resume` names). Writes
    `<output_dir>/best` and `<output_dir>/final` (captioner folders) and `<output_dir>/log.csv`.
    """
    out = Path(config.output_dir)
    validate = validate or cider_validator
    distinct_ids, image_of_caption = caption_images(train)
    missing = list(dict.fromkeys(features.missing(itertools.chain(distinct_ids, val))))
    if missing:
        raise InputError(f"{len(missing)} image id(s) lack cached features, e.g. {missing[:3]}")
    model_config.vocab_size, model_config.feature_dim = len(vocab), features.feature_dim
    model_config.max_length = vocab.max_length
    accelerator = make_accelerator(out, "log.csv", XE_COLUMNS, config.mixed_precision,
                                   tracker_names(config.trackers, config.tensorboard, "xe"))
    seed_everything(config.seed)
    plan = BatchPlan(len(train), config.batch_size, config.micro_batch_size, accelerator.num_processes,
                     config.seed, "xe")
    if plan.dropped_per_epoch:
        logger.info("xe: %d caption(s) per epoch do not fill a batch and are skipped", plan.dropped_per_epoch)
    targets = EncodedCaptions.encode(vocab, (caption for _, caption in train),  # two arrays on disk, nothing per
                                     folder=out if out.is_dir() else None)  # caption in memory

    loop = XELoop(accelerator, Captioner(model_config), config, plan, out)
    model = loop.model
    source = dict(features.meta, **(feature_source or {}))
    val_ids = sorted(val)[: config.val_max_images or None]
    try:  # the bar is closed before an error (e.g. a diverged loss) is printed
        while loop.state["step"] < config.max_steps:
            micro_batches = loop.micro_batches()
            policy = accelerator.unwrap_model(model)
            local_loss, local_tokens = 0.0, 0
            for index, micro in enumerate(micro_batches):
                sync = index == len(micro_batches) - 1
                dropout = ExampleRNG(example_generators(config.seed, loop.state["step"], micro, DROPOUT,
                                                        accelerator.device))
                with contextlib.nullcontext() if sync else accelerator.no_sync(model), policy.example_rng(dropout):
                    feats, rows = image_rows(features, distinct_ids, image_of_caption, micro, accelerator.device)
                    batch_targets = targets.targets(micro).to(accelerator.device)
                    per_caption = xe_loss(model(feats, shift_right(batch_targets), rows=rows), batch_targets,
                                          config.label_smoothing)
                    accelerator.backward(per_caption.mean() / len(micro_batches))
                local_loss += float(per_caption.detach().mean()) / len(micro_batches)
                local_tokens += int(sequence_mask(batch_targets).sum())
            row, validating, saving = loop.step(local_loss, local_tokens, bool(val_ids))
            state, step = loop.state, loop.state["step"]
            loop.progress.set_postfix(loss=f"{loop.losses[-1]:.3f}")
            if validating:
                score = _validate(accelerator, model, vocab, features, val_ids, val, validate, config)
                row["val_cider"] = score
                if loop.is_best(score):
                    save_captioner(out / "best", accelerator.unwrap_model(model), vocab, source,
                                   {"stage": "xe", "step": step, "val_cider": score})
                if not math.isfinite(score):
                    logger.warning("xe step %d: the validation score is %s: never the best model", step, score)
                logger.info("xe step %d: val CIDEr %.2f (best %s at step %d)", step, score,
                            _shown(state["best_score"]), state["best_step"])
            loop.end_step(row, saving)
    finally:
        loop.progress.close()
    loop.check_final_weights()
    state = loop.state
    final = out / "final"
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        save_captioner(final, unwrapped, vocab, source, {"stage": "xe", "step": state["step"]})
        if not (out / "best" / "captioner.json").is_file():  # no validation set: the last model is the best
            save_captioner(out / "best", unwrapped, vocab, source, {"stage": "xe", "step": state["step"]})
    return loop.result(out, final)


def is_better(score: float, best: float | None) -> bool:
    """Whether a validation `score` beats the `best` so far (None: none yet); a non-finite score never does."""
    return math.isfinite(score) and (best is None or score > best)


def _shown(best: float | None) -> str:
    return "none" if best is None else f"{best:.2f}"


class XELoop:
    """The optimisation loop both XE trainers share (pacs' captioner here, a transformers captioner in
    `pacs.captioner.modeling.hf_train_xe`): Adam with the PAC-S++ schedule under accelerate, the resumable state
    (`step`, `epoch`, `position`, `best_score`, `best_step`), the optimizer step, the log row, the checks of the
    weights before a validation or a checkpoint, and the result."""

    def __init__(self, accelerator: Any, model: Any, config: XEConfig, plan: BatchPlan, out: Path,
                 trainable_only: bool = False) -> None:
        """Prepare `model` (only its parameters that require a gradient when `trainable_only`), restore the
        latest checkpoint and start the trackers and the progress bar."""
        self.accelerator, self.config, self.plan, self.trainable_only = accelerator, config, plan, trainable_only
        optimizer = make_adam(self.parameters(model), lr=config.schedule.peak_lr, betas=tuple(config.betas),
                              weight_decay=config.weight_decay)
        scheduler = pacs_scheduler(optimizer, config.schedule)
        self.model, self.optimizer, self.scheduler = accelerator.prepare(model, optimizer, scheduler)
        self.checkpoints = CheckpointManager(accelerator, out / "checkpoints", config.keep_checkpoints)
        self.state: dict[str, Any] = self.checkpoints.restore(resume_target(config.resume), config.max_steps) or {
            "step": 0, "epoch": 0, "position": 0, "best_score": None, "best_step": -1}
        self.state["best_score"] = finite_or_none(self.state.get("best_score"))  # None: nothing validated yet
        self.hint = f"schedule.peak_lr={config.schedule.peak_lr:g}"
        start_trackers(accelerator, "xe", to_dict(config), self.state["step"] if self.state["step"] else None)
        self.losses: list[float] = []
        self.progress = progress_bar(total=config.max_steps, initial=self.state["step"], desc="xe",
                                     disable=not accelerator.is_main_process)

    def parameters(self, model: Any) -> list[Any]:
        """The parameters the loop trains and clips."""
        return [p for p in model.parameters() if p.requires_grad or not self.trainable_only]

    def micro_batches(self) -> list[Any]:
        """This process's micro-batches of the next step (the model in training mode)."""
        self.model.train()
        return self.plan.local_micro_batches(self.state["epoch"], self.state["position"],
                                             self.accelerator.process_index)

    def step(self, local_loss: float, tokens: int, has_validation: bool) -> tuple[dict[str, Any], bool, bool]:
        """Check the loss, clip, step the optimizer and the schedule; (log row, validating, saving) of the step."""
        accelerator, config, state = self.accelerator, self.config, self.state
        loss = reduce_mean(accelerator, local_loss)  # every micro-batch's loss, all processes: one verdict
        check_loss(accelerator, loss, "xe", state["step"] + 1, self.hint)
        if config.grad_clip > 0:
            accelerator.clip_grad_norm_(self.parameters(self.model), config.grad_clip)
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.losses.append(loss)
        state["step"] += 1
        state["epoch"], state["position"] = self.plan.advance(state["epoch"], state["position"])
        step = state["step"]
        self.progress.update(1)
        row: dict[str, Any] = {}
        if is_due(step, config.log_every) or step == config.max_steps:
            row.update(loss=loss, lr=lr, tokens=tokens, epoch=state["epoch"])
        validating = has_validation and (is_due(step, config.eval_every) or step == config.max_steps)
        saving = is_due(step, config.save_every) or step == config.max_steps
        if validating or saving:
            check_weights(accelerator, self.model, "xe", step, self.hint)
        return row, validating, saving

    def is_best(self, score: float) -> bool:
        """On the main process, whether `score` beats the best so far (then it is recorded as the best)."""
        if self.accelerator.is_main_process and is_better(score, self.state["best_score"]):
            self.state["best_score"], self.state["best_step"] = score, self.state["step"]
            return True
        return False

    def end_step(self, row: dict[str, Any], saving: bool) -> None:
        """Log the step's row and save a checkpoint (the main process's state) when `saving`."""
        if row:
            self.accelerator.log(row, step=self.state["step"])
        if saving:
            box = [self.state]
            broadcast_object_list(box, from_process=0)
            self.state = box[0]
            self.checkpoints.save(self.state)

    def check_final_weights(self) -> None:
        """Check the weights after the last step (a non-finite weight is an error)."""
        check_weights(self.accelerator, self.model, "xe", self.state["step"], self.hint)

    def result(self, out: Path, final: Path) -> XEResult:
        """Wait for every process, finish the trackers; what stage 1 produced."""
        self.accelerator.wait_for_everyone()
        finish_trackers(self.accelerator)
        best = self.state["best_score"]
        return XEResult(out / "best", final, -math.inf if best is None else float(best),
                        int(self.state["best_step"]), int(self.state["step"]), self.losses)


def _validate(accelerator: Any, model: Any, vocab: Vocab, features: FeatureCache, val_ids: Sequence[str],
              references: Mapping[str, Sequence[str]], validate: Validator, config: XEConfig) -> float:
    """Beam-search the validation images (split over processes) and score them on the main process."""
    local_ids = list(val_ids[accelerator.process_index::accelerator.num_processes])
    local = generate_captions(accelerator.unwrap_model(model), vocab, features, local_ids, config.val_beam_size,
                              config.val_batch_size, accelerator.device)
    gathered = gather_object([local])
    captions = {k: v for part in gathered for k, v in part.items()}
    box = [validate(captions, {i: references[i] for i in captions}) if accelerator.is_main_process else 0.0]
    broadcast_object_list(box, from_process=0)
    return float(box[0])
