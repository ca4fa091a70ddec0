"""Optional stage 1 for a transformers captioner: cross-entropy fine-tuning on the data set's references.

The same settings as pacs' XE (`captioner.modeling.train_xe.XEConfig`: steps, global batch split into
micro-batches over processes, the PAC-S++ learning-rate schedule, gradient clipping, checkpoints every
`save_every` steps, validation every `eval_every` steps by corpus CIDEr-D of greedy captions, best model kept),
on a `captioner.modeling.hf_policy.HFPolicy`: the loss of a caption is the mean over its tokens, end token
included, of `−log π(y_t | prefix, y_<t, image)` (`HFPolicy.token_log_probs`, the prompt as `pacs caption` gives
it), the loss of a batch the mean over its captions, so any split over processes and micro-batches gives the
same gradient (dropout is off in the policy). Writes `<output_dir>/best` and `<output_dir>/final` (transformers
folders, `HFPolicy.save`), `<output_dir>/log.csv` and resumes from `<output_dir>/checkpoints`.
"""
from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from accelerate.utils import broadcast_object_list, gather_object
from tqdm.auto import tqdm

from captioner.modeling.checkpoints import CheckpointManager
from captioner.modeling.hf_policy import HFPolicy, caption_mask
from captioner.modeling.train_xe import XE_COLUMNS, XEConfig, XEResult, cider_validator, is_better
from captioner.modeling.training import (
    BatchPlan,
    finish_trackers,
    make_accelerator,
    pacs_scheduler,
    reduce_mean,
    start_trackers,
)
from metric.common.config import to_dict
from metric.common.errors import InputError
from metric.common.io import finite_or_none
from metric.common.optim import make_adam
from metric.common.seeding import seed_everything
from metric.common.trainer_config import is_due, resume_target
from metric.training.divergence import check_loss, check_weights

logger = logging.getLogger(__name__)


def train_hf_xe(config: XEConfig, policy: HFPolicy, train: Sequence[tuple[str, str]],
                val: Mapping[str, Sequence[str]]) -> XEResult:
    """Fine-tune `policy` on `train` ((image_id, caption) pairs); validate on `val` ({image_id: references})."""
    out = Path(config.output_dir)
    missing = policy.missing_images([i for i, _ in train] + list(val))
    if missing:
        raise InputError(f"{len(missing)} image id(s) have no image, e.g. {missing[:3]}")
    accelerator = make_accelerator(out, "log.csv", XE_COLUMNS, config.mixed_precision, config.tensorboard)
    seed_everything(config.seed)
    plan = BatchPlan(len(train), config.batch_size, config.micro_batch_size, accelerator.num_processes,
                     config.seed, "xe")
    model = policy.module
    optimizer = make_adam([p for p in model.parameters() if p.requires_grad], lr=config.schedule.peak_lr,
                          betas=tuple(config.betas), weight_decay=config.weight_decay)
    scheduler = pacs_scheduler(optimizer, config.schedule)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    checkpoints = CheckpointManager(accelerator, out / "checkpoints", config.keep_checkpoints)
    state = checkpoints.restore(resume_target(config.resume)) or {
        "step": 0, "epoch": 0, "position": 0, "best_score": None, "best_step": -1}
    state["best_score"] = finite_or_none(state.get("best_score"))
    hint = f"schedule.peak_lr={config.schedule.peak_lr:g}"
    start_trackers(accelerator, "xe", to_dict(config), state["step"] if state["step"] else None)
    val_ids = sorted(val)[: config.val_max_images or None]
    losses: list[float] = []
    progress = tqdm(total=config.max_steps, initial=state["step"], desc="xe", disable=not accelerator.is_main_process)
    try:
        while state["step"] < config.max_steps:
            model.train()
            unwrapped = accelerator.unwrap_model(model)
            micro_batches = plan.local_micro_batches(state["epoch"], state["position"], accelerator.process_index)
            local_loss, local_tokens = 0.0, 0
            for index, micro in enumerate(micro_batches):
                sync = index == len(micro_batches) - 1
                pairs = [train[i] for i in micro]
                with contextlib.nullcontext() if sync else accelerator.no_sync(model):
                    batch = policy.batch([str(i) for i, _ in pairs], accelerator.device)
                    targets = policy.encode_captions([c for _, c in pairs]).to(accelerator.device)
                    with accelerator.autocast():
                        log_p = policy.token_log_probs(model, unwrapped, batch, targets, 1)
                    mask = caption_mask(targets, policy.ends)
                    per_caption = -(log_p * mask).sum(1) / mask.sum(1).clamp(min=1)
                    accelerator.backward(per_caption.mean() / len(micro_batches))
                local_loss += float(per_caption.detach().mean()) / len(micro_batches)
                local_tokens += int(mask.sum())
            loss = reduce_mean(accelerator, local_loss)
            check_loss(accelerator, loss, "xe", state["step"] + 1, hint)
            if config.grad_clip > 0:
                accelerator.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], config.grad_clip)
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss)
            state["step"] += 1
            state["epoch"], state["position"] = plan.advance(state["epoch"], state["position"])
            step = state["step"]
            progress.update(1)
            row: dict[str, Any] = {}
            if is_due(step, config.log_every) or step == config.max_steps:
                row.update(loss=loss, lr=lr, tokens=local_tokens, epoch=state["epoch"])
            validating = bool(val_ids) and (is_due(step, config.eval_every) or step == config.max_steps)
            saving = is_due(step, config.save_every) or step == config.max_steps
            if validating or saving:
                check_weights(accelerator, model, "xe", step, hint)
            if validating:
                score = _validate(accelerator, model, policy, val_ids, val, config)
                row["val_cider"] = score
                if accelerator.is_main_process and is_better(score, state["best_score"]):
                    state["best_score"], state["best_step"] = score, step
                    policy.save(out / "best", accelerator.unwrap_model(model),
                                {"stage": "xe", "step": step, "val_cider": score})
                logger.info("xe step %d: val CIDEr %.2f", step, score)
            if row:
                accelerator.log(row, step=step)
            if saving:
                box = [state]
                broadcast_object_list(box, from_process=0)
                state = box[0]
                checkpoints.save(state)
    finally:
        progress.close()
    check_weights(accelerator, model, "xe", state["step"], hint)
    final = out / "final"
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        policy.save(final, unwrapped, {"stage": "xe", "step": state["step"]})
        if not (out / "best" / "config.json").is_file():  # no validation set: the last model is the best
            policy.save(out / "best", unwrapped, {"stage": "xe", "step": state["step"]})
    accelerator.wait_for_everyone()
    finish_trackers(accelerator)
    best = state["best_score"]
    return XEResult(out / "best", final, -math.inf if best is None else float(best), int(state["best_step"]),
                    int(state["step"]), losses)


def _validate(accelerator: Any, model: Any, policy: HFPolicy, val_ids: Sequence[str],
              references: Mapping[str, Sequence[str]], config: XEConfig) -> float:
    """Greedy captions of the validation images (split over processes), corpus CIDEr-D on the main process."""
    unwrapped = accelerator.unwrap_model(model)
    local_ids = list(val_ids[accelerator.process_index::accelerator.num_processes])
    local: dict[str, str] = {}
    for start in range(0, len(local_ids), config.val_batch_size):
        chunk = local_ids[start:start + config.val_batch_size]
        tokens = policy.greedy(unwrapped, policy.batch(chunk, accelerator.device), policy.max_length)
        local.update({i: row[0] for i, row in zip(chunk, policy.decode(tokens))})
    captions = {k: v for part in gather_object([local]) for k, v in part.items()}
    box = [cider_validator(captions, {i: references[i] for i in captions}) if accelerator.is_main_process else 0.0]
    broadcast_object_list(box, from_process=0)
    return float(box[0])
