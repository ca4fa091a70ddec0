"""Optional stage 1 for a transformers captioner: cross-entropy fine-tuning on the data set's references.

The same settings as pacs' XE (`pacs.captioner.modeling.train_xe.XEConfig`: steps, global batch split into
micro-batches over processes, the PAC-S++ learning-rate schedule, gradient clipping, checkpoints every
`save_every` steps, validation every `eval_every` steps by corpus CIDEr-D of greedy captions, best model kept),
on a `pacs.captioner.modeling.hf_policy.HFPolicy`: the loss of a caption is the mean over its tokens, end token
included, of `−log π(y_t | prefix, y_<t, image)` (`HFPolicy.token_log_probs`, the prompt as `pacs caption` gives
it), the loss of a batch the mean over its captions, so any split over processes and micro-batches gives the
same gradient (dropout is off in the policy). Writes `<output_dir>/best` and `<output_dir>/final` (transformers
folders, `HFPolicy.save`), `<output_dir>/log.csv` and resumes from `<output_dir>/checkpoints`.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from accelerate.utils import broadcast_object_list, gather_object

from pacs.captioner.modeling.hf_policy import HFPolicy, caption_mask
from pacs.captioner.modeling.train_xe import XE_COLUMNS, XEConfig, XELoop, XEResult, cider_validator
from pacs.captioner.modeling.training_setup import BatchPlan, make_accelerator, tracker_names
from pacs.metric.common.errors import InputError
from pacs.metric.common.seeding import seed_everything

logger = logging.getLogger(__name__)


def train_hf_xe(config: XEConfig, policy: HFPolicy, train: Sequence[tuple[str, str]],
                val: Mapping[str, Sequence[str]]) -> XEResult:
    """Fine-tune `policy` on `train` ((image_id, caption) pairs); validate on `val` ({image_id: references})."""
    out = Path(config.output_dir)
    missing = policy.missing_images([i for i, _ in train] + list(val))
    if missing:
        raise InputError(f"{len(missing)} image id(s) have no image, e.g. {missing[:3]}")
    accelerator = make_accelerator(out, "log.csv", XE_COLUMNS, config.mixed_precision,
                                   tracker_names(config.trackers, config.tensorboard, "xe"))
    seed_everything(config.seed)
    plan = BatchPlan(len(train), config.batch_size, config.micro_batch_size, accelerator.num_processes,
                     config.seed, "xe")
    loop = XELoop(accelerator, policy.module, config, plan, out, trainable_only=True)
    model = loop.model
    val_ids = sorted(val)[: config.val_max_images or None]
    try:
        while loop.state["step"] < config.max_steps:
            micro_batches = loop.micro_batches()
            unwrapped = accelerator.unwrap_model(model)
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
            row, validating, saving = loop.step(local_loss, local_tokens, bool(val_ids))
            step = loop.state["step"]
            if validating:
                score = _validate(accelerator, model, policy, val_ids, val, config)
                row["val_cider"] = score
                if loop.is_best(score):
                    policy.save(out / "best", accelerator.unwrap_model(model),
                                {"stage": "xe", "step": step, "val_cider": score})
                logger.info("xe step %d: val CIDEr %.2f", step, score)
            loop.end_step(row, saving)
    finally:
        loop.progress.close()
    loop.check_final_weights()
    final = out / "final"
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        policy.save(final, unwrapped, {"stage": "xe", "step": loop.state["step"]})
        if not (out / "best" / "config.json").is_file():  # no validation set: the last model is the best
            policy.save(out / "best", unwrapped, {"stage": "xe", "step": loop.state["step"]})
    return loop.result(out, final)


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
