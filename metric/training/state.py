"""Resumable trainer state and the run folder: counters, saved-state folders, resume checks, final outputs."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate.logging import get_logger
from torch import nn

from metric.common.config import dump_yaml, to_dict
from metric.common.errors import InputError
from metric.common.io import chmod_like_umask, write_json_atomic
from metric.common.provenance import provenance
from metric.training.config import FAMILY_OF_MODE, MetricTrainConfig

if TYPE_CHECKING:
    from metric.models.backbones import Backbone

logger = get_logger(__name__)  # accelerate's: logs once, on the main process

STATE_DIR = "state"
CHECKPOINT_FILE = "checkpoint.safetensors"
ADAPTER_DIR = "adapter"


class TrainerState:
    """Counters restored on resume: optimizer step, data position, early-stopping record, best weights."""

    def __init__(self) -> None:
        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.best_val = math.inf
        self.best_step = 0
        self.history: list[dict[str, float | None]] = []  # an undefined correlation is None (null)
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


def state_dirs(output_dir: Path) -> list[Path]:
    root = output_dir / STATE_DIR
    return sorted(p for p in root.glob("step_*") if p.is_dir()) if root.is_dir() else []


def resolve_resume(config: MetricTrainConfig, output_dir: Path) -> Path | None:
    if not config.resume:
        return None
    if config.resume == "latest":
        dirs = state_dirs(output_dir)
        if not dirs:
            raise InputError(f"resume=latest: no saved state under {output_dir / STATE_DIR}")
        return dirs[-1]
    path = Path(config.resume)
    if not path.is_dir():
        raise InputError(f"resume: state folder not found: {path}")
    return path


def check_state_complete(path: Path) -> None:
    required = ["custom_checkpoint_0.pkl", "random_states_0.pkl"]
    missing = [name for name in required if not (path / name).is_file()]
    if not any(path.glob("optimizer*.bin")) and not any(path.glob("optimizer*.safetensors")):
        missing.append("optimizer.bin")
    if missing:
        raise InputError(f"resume state {path} is incomplete: missing {', '.join(missing)}")


def restore_best(model: nn.Module, best: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        current = dict(model.named_parameters())
        for name, value in best.items():
            current[name].copy_(value.to(current[name].device))


def save_outputs(config: MetricTrainConfig, trained: Backbone, model: nn.Module, state: TrainerState,
                  output_dir: Path, seconds: float, loss_kind: str | None = None) -> None:
    from metric.models.backbones import model_fingerprint, save_backbone
    from metric.models.lora import base_from_source, merge_lora, save_adapter

    model.eval()
    backbone = dataclasses.replace(trained, model=model)
    base_source = base_from_source(trained)
    if base_source is not None and config.arch:
        base_source["arch"] = config.arch
    files: dict[str, str] = {"checkpoint": CHECKPOINT_FILE}
    if config.mode == "lora":  # a trained logit scale / bias is recorded in pacs_base.json (peft saves LoRA only)
        save_adapter(backbone, output_dir / ADAPTER_DIR, base=base_source)
        chmod_like_umask(output_dir / ADAPTER_DIR)  # peft/safetensors write 0600 files: follow the umask
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
                                 base=trained.name, family=FAMILY_OF_MODE[config.mode], loss_kind=loss_kind)})
    logger.info("saved %s (best step %d, val loss %.4f)", output_dir, state.best_step, state.best_val)
