"""Resumable trainer state and the run folder: counters, saved-state folders, resume checks, final outputs."""
from __future__ import annotations

import dataclasses
import math
import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from accelerate.logging import get_logger
from torch import nn

from pacs.metric.common.config import dump_yaml, to_dict
from pacs.metric.common.errors import InputError
from pacs.metric.common.io import chmod_like_umask, finite_or_none, write_json_atomic
from pacs.metric.common.json_input import read_json_file
from pacs.metric.common.link_safety import check_no_links
from pacs.metric.common.os_errors import writing_to
from pacs.metric.common.provenance import provenance
from pacs.metric.models.backbones import model_fingerprint, save_backbone
from pacs.metric.models.lora import base_from_source, merge_lora, save_adapter
from pacs.metric.training.config import FAMILY_OF_MODE, MetricTrainConfig

if TYPE_CHECKING:
    from pacs.metric.models.backbones import Backbone

logger = get_logger(__name__)  # accelerate's: logs once, on the main process

STATE_DIR = "state"
CHECKPOINT_FILE = "checkpoint.safetensors"
ADAPTER_DIR = "adapter"
TRAINER_STATE_FILE = "trainer_state.json"  # in each saved state folder, next to accelerate's files
BEST_WEIGHTS_FILE = "best_weights.safetensors"


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

    def save(self, folder: Path) -> None:
        """Write `trainer_state.json` (counters, history) and `best_weights.safetensors` into `folder` (no pickle)."""
        from safetensors.torch import save_file


        with writing_to(folder / BEST_WEIGHTS_FILE):  # a full disk: one line naming the file
            save_file({name: tensor.contiguous() for name, tensor in self.best_weights.items()},
                      str(folder / BEST_WEIGHTS_FILE))
        write_json_atomic(folder / TRAINER_STATE_FILE, {
            "step": self.step, "epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
            "best_val": finite_or_none(self.best_val), "best_step": self.best_step, "history": self.history,
            "train_losses": self.train_losses})

    def load(self, folder: Path) -> None:
        """Restore from `save`'s files; InputError naming the file when one is unreadable or lacks a field."""
        from safetensors.torch import load_file


        path = folder / TRAINER_STATE_FILE
        state = read_json_file(path, "trainer state")
        if not isinstance(state, dict):
            raise InputError(f"{path}: not a trainer state (a JSON object is expected)")
        for key, kind in (("step", int), ("epoch", int), ("batch_in_epoch", int), ("best_step", int),
                          ("history", list), ("train_losses", list)):
            if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool):
                raise InputError(f"{path}: {key!r} is missing or not {'a list' if kind is list else 'an integer'}")
        best_val = state.get("best_val")
        if best_val is not None and not isinstance(best_val, (int, float)):
            raise InputError(f"{path}: 'best_val' is not a number")
        weights = folder / BEST_WEIGHTS_FILE
        try:
            best_weights = load_file(str(weights))
        except Exception as error:  # noqa: BLE001 - safetensors raises several types for missing / corrupt files
            raise InputError(f"{weights}: not a readable safetensors file ({str(error).splitlines()[0]})") from None
        self.step, self.epoch, self.batch_in_epoch = state["step"], state["epoch"], state["batch_in_epoch"]
        self.best_step, self.history, self.train_losses = state["best_step"], state["history"], state["train_losses"]
        self.best_val = math.inf if best_val is None else float(best_val)
        self.best_weights = best_weights


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
    required = [TRAINER_STATE_FILE, BEST_WEIGHTS_FILE, "random_states_0.pkl"]
    missing = [name for name in required if not (path / name).is_file()]
    if not any(path.glob("optimizer*.bin")) and not any(path.glob("optimizer*.safetensors")):
        missing.append("optimizer.bin")
    if missing:
        raise InputError(f"resume state {path} is incomplete: missing {', '.join(missing)}")


def check_output_folders(output_dir: Path) -> None:
    """InputError (on every process, before any work) when `state/` or `adapter/` of the run is a symbolic link:
    pacs never writes through a link planted in its output folder."""

    for name in (STATE_DIR, ADAPTER_DIR):
        check_no_links(output_dir, output_dir / name)


def save_state_folder(accelerator: Any, state: TrainerState, output_dir: Path) -> Path:
    """Save accelerate's state + `state` as `<output_dir>/state/step_N` (written aside, renamed into place).

    Files are written into a fresh temporary folder that pacs created (never through a link planted in the run
    directory); the finished folder replaces any older `step_N`.
    """
    root = output_dir / STATE_DIR
    target = root / f"step_{state.step:08d}"
    tmp = root / f".tmp-step_{state.step:08d}"
    if root.is_symlink():  # on every process: each stops with the same error
        raise InputError(f"{root} is a symbolic link: pacs writes training states only into folders of the "
                         "run directory itself (remove the link)")
    if accelerator.is_main_process:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.is_symlink() or tmp.is_file():
            tmp.unlink()
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        state.save(tmp)
        chmod_like_umask(tmp)  # safetensors writes 0600 files: give them the umask's mode
        trash = root / f".old-step_{state.step:08d}-{uuid.uuid4().hex[:8]}"
        if target.is_symlink() or target.exists():
            os.replace(target, trash)
        os.replace(tmp, target)
        if trash.is_symlink():
            trash.unlink()
        else:
            shutil.rmtree(trash, ignore_errors=True)
    accelerator.wait_for_everyone()
    return target


def restore_best(model: nn.Module, best: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        current = dict(model.named_parameters())
        for name, value in best.items():
            current[name].copy_(value.to(current[name].device))


def save_outputs(config: MetricTrainConfig, trained: Backbone, model: nn.Module, state: TrainerState,
                  output_dir: Path, seconds: float, loss_kind: str | None = None) -> None:

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
