"""The demo's XE stage settings and its finishing step, shared by pacs' captioner and a transformers one."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from pacs.captioner.demo.config import DemoConfig
from pacs.captioner.modeling.train_xe import XEConfig
from pacs.captioner.modeling.training_setup import ScheduleConfig, process_state
from pacs.metric.common.io import finite_or_none

BIG = 10**9  # "never" for checkpoint intervals: the demo's stages are short and cached as a whole


def xe_trainer_config(config: DemoConfig, folder: Path, micro_batch_size: int, seed: int | None = None) -> XEConfig:
    """The XE trainer's settings of the `xe` section (PAC-S++ schedule: warm-up, constant to 60%, decay to lr/10;
    greedy validation CIDEr-D picks the best checkpoint), for pacs' captioner and a transformers one alike."""
    stage = config.xe
    return XEConfig(output_dir=str(folder), max_steps=stage.max_steps, batch_size=stage.batch_size,
                    micro_batch_size=micro_batch_size,
                    schedule=ScheduleConfig(warmup_steps=stage.schedule.warmup_steps,
                                            constant_until=int(stage.max_steps * 0.6), decay_until=stage.max_steps,
                                            peak_lr=stage.schedule.peak_lr, final_lr=stage.schedule.peak_lr / 10),
                    eval_every=stage.eval_every, val_beam_size=1, val_batch_size=100, val_max_images=stage.val_max_images,
                    save_every=BIG, log_every=stage.log_every, seed=config.seed if seed is None else seed,
                    trackers=[])


def finish_xe(result: Any, folder: Path, logs: Path) -> dict:
    """After an XE run: its log copied to `logs/xe.csv`, its resume checkpoints dropped (main process); the
    stage's summary."""
    if process_state().is_main_process:
        shutil.copyfile(folder / "log.csv", logs / "xe.csv")
        shutil.rmtree(folder / "checkpoints", ignore_errors=True)
    losses = result.losses
    return {"steps": result.steps, "loss_first": losses[0], "loss_last": float(np.mean(losses[-10:])),
            "best_val_cider": finite_or_none(result.best_score), "best_step": result.best_step}  # null: none
