"""Checkpoints: resumable training states (accelerate `save_state`, atomic, verified) and captioner model folders.

A training state lives in `<output_dir>/checkpoints/step-XXXXXXXX/`: accelerate's files (model, optimizer,
scheduler, one `random_states_<rank>.pkl` per process) plus `trainer_state.json` (step, epoch and position
in the data) and `manifest.json` (size and sha256 of every file). It is written into a temporary folder
and renamed into place only when complete; older states are pruned only after that. Loading checks the
manifest and refuses a corrupt, truncated or incomplete state with an error naming the file; its pickle-based
files are read with `torch.load(weights_only=True)` only (`pacs.metric.training.resume_files`): a file holding
anything else is refused in one line, and nothing in it runs.

A captioner model folder (`best/`, `final/`) holds `model.safetensors` + `captioner.json` (architecture,
vocabulary, feature source) and is what `pacs caption` and the SCST stage load.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from pacs.captioner.modeling.model import Captioner, CaptionerConfig, captioner_config_dict
from pacs.captioner.modeling.vocab import Vocab, vocab_from_dict
from pacs.metric.common.config import from_dict
from pacs.metric.common.errors import InputError, MissingResourceError, NonFiniteError, PacsError
from pacs.metric.common.file_kinds import refuse_special
from pacs.metric.common.io import chmod_like_umask, write_json_atomic
from pacs.metric.common.json_input import read_json_file
from pacs.metric.common.os_errors import writing_to
from pacs.metric.common.provenance import provenance, sha256_file
from pacs.metric.training.divergence import nonfinite_parameter
from pacs.metric.training.resume_files import check_resume_step, check_state_folder, load_weights_only

logger = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.json"
MANIFEST = "manifest.json"
EXTRA_STATE = "extra_state_{rank}.pt"  # per process: state outside the model/optimizer (e.g. a reward's caches)
REQUIRED_STATE_KEYS = ("step", "epoch", "position")


class CheckpointError(PacsError):
    """A training checkpoint is missing, incomplete, corrupt or does not match this run."""


def _atomic_dir_replace(tmp: Path, target: Path) -> None:
    """Move the finished folder `tmp` onto `target` (the old target, if any, is removed only afterwards)."""
    trash = None
    if target.exists():
        trash = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(target, trash)
    os.replace(tmp, target)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


class CheckpointManager:
    """Save, list, verify and restore accelerate training states under `<folder>/step-XXXXXXXX`."""

    def __init__(self, accelerator: Any, folder: str | os.PathLike, keep: int = 2) -> None:
        self.accelerator = accelerator
        self.folder = Path(folder)
        self.keep = max(1, int(keep))
        self.restored: Path | None = None

    def checkpoints(self) -> list[Path]:
        """Complete checkpoints (renamed into place), oldest first."""
        if not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.glob("step-*") if p.is_dir())

    def save(self, trainer_state: dict[str, Any], extra: dict[str, Any] | None = None) -> Path:
        """Write the accelerate state + `trainer_state` (+ each process's `extra`: tensors, strings, lists and
        dicts only, read back with `torch.load(weights_only=True)`) atomically; prune old checkpoints afterwards."""
        acc = self.accelerator
        step = int(trainer_state["step"])
        target = self.folder / f"step-{step:08d}"
        tmp = self.folder / f".tmp-step-{step:08d}"
        if self.folder.is_symlink():  # on every process: each stops with the same error
            raise CheckpointError(f"{self.folder} is a symbolic link: pacs writes checkpoints only into "
                                  "folders of the run directory itself (remove the link)")
        if acc.is_main_process:
            if tmp.is_symlink() or tmp.is_file():
                tmp.unlink()
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        acc.wait_for_everyone()
        acc.save_state(str(tmp), safe_serialization=True)
        if extra is not None:
            torch.save(extra, tmp / EXTRA_STATE.format(rank=acc.process_index))
        acc.wait_for_everyone()
        if acc.is_main_process:
            chmod_like_umask(tmp)  # safetensors writes 0600 files: give them the umask's mode
            state = dict(trainer_state, num_processes=acc.num_processes)
            write_json_atomic(tmp / TRAINER_STATE, state)
            files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
                     for p in sorted(tmp.iterdir()) if p.is_file()}
            write_json_atomic(tmp / MANIFEST, {"step": step, "files": files})
            _atomic_dir_replace(tmp, target)
            for old in self.checkpoints()[:-self.keep]:
                shutil.rmtree(old, ignore_errors=True)
            logger.info("checkpoint saved: %s", target, extra={"terminal": False})  # the run log only
        acc.wait_for_everyone()
        return target

    def verify(self, checkpoint: Path) -> dict[str, Any]:
        """Check a checkpoint is complete and intact; return its trainer state (CheckpointError otherwise)."""
        checkpoint = Path(checkpoint)
        previous = [p for p in self.checkpoints() if p != checkpoint and p.name < checkpoint.name]
        hint = (f"; the previous checkpoint {previous[-1]} is kept: resume from it with resume={previous[-1]}"
                if previous else "")
        manifest_path = checkpoint / MANIFEST
        if not manifest_path.is_file():
            raise CheckpointError(f"checkpoint {checkpoint} has no {MANIFEST} (incomplete write?){hint}")
        try:
            manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            files = manifest["files"]
            if not all(isinstance(e, dict) and {"bytes", "sha256"} <= e.keys() for e in files.values()):
                raise TypeError("a file entry without bytes / sha256")
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):  # bad JSON, bytes or fields
            raise CheckpointError(f"{manifest_path} is corrupt{hint}") from None
        num_processes = self.accelerator.num_processes
        for rank in range(num_processes):
            name = f"random_states_{rank}.pkl"
            if name not in files or not (checkpoint / name).is_file():
                raise CheckpointError(f"checkpoint {checkpoint} lacks {name}: the RNG state of process {rank} "
                                      f"cannot be restored (saved with a different number of processes?){hint}")
        if TRAINER_STATE not in files or not (checkpoint / TRAINER_STATE).is_file():
            raise CheckpointError(f"checkpoint {checkpoint} lacks {TRAINER_STATE}: the position in the data "
                                  f"cannot be restored{hint}")
        for name, expected in files.items():
            path = checkpoint / name
            if not path.is_file():
                raise CheckpointError(f"checkpoint file {path} is missing{hint}")
            size = path.stat().st_size
            if size != expected["bytes"]:
                raise CheckpointError(f"checkpoint file {path} is truncated or altered ({size} bytes, "
                                      f"expected {expected['bytes']}){hint}")
            if sha256_file(path) != expected["sha256"]:
                raise CheckpointError(f"checkpoint file {path} is corrupt (sha256 mismatch){hint}")
        state = read_json_file(checkpoint / TRAINER_STATE, "trainer state")
        if not isinstance(state, dict):
            raise CheckpointError(f"{checkpoint / TRAINER_STATE} is not a trainer state (a JSON object){hint}")
        missing = [key for key in REQUIRED_STATE_KEYS if key not in state]
        if missing:
            raise CheckpointError(f"{checkpoint / TRAINER_STATE} lacks {', '.join(missing)}: the position in the "
                                  f"data cannot be restored{hint}")
        if int(state.get("num_processes", num_processes)) != num_processes:
            raise CheckpointError(f"checkpoint {checkpoint} was written by {state['num_processes']} processes, this "
                                  f"run has {num_processes}: RNG states cannot be restored exactly")
        return state

    def restore(self, checkpoint: str | os.PathLike | None = None,
                max_steps: int | None = None) -> dict[str, Any] | None:
        """Restore `checkpoint` (default: the latest) into the accelerator; return its trainer state or None.

        Its step must be an integer in `0..max_steps` (the run's step count, when given): a state claiming step
        10**12 (or -5) is refused naming its trainer_state.json instead of ending (or restarting) the stage.
        """
        if checkpoint is None:
            found = self.checkpoints()
            if not found:
                return None
            checkpoint = found[-1]
        checkpoint = Path(checkpoint)
        if not checkpoint.is_dir():
            raise CheckpointError(f"checkpoint folder not found: {checkpoint}")
        state = self.verify(checkpoint)
        check_resume_step(state.get("step"), checkpoint / TRAINER_STATE, max_steps)
        check_state_folder(checkpoint)  # weights only: a pickle holding anything else is one error naming it
        self.accelerator.load_state(str(checkpoint))
        self.restored = checkpoint
        logger.info("resumed from %s (step %d)", checkpoint, state["step"])
        return state

    def restored_extra(self) -> dict[str, Any] | None:
        """This process's `extra` of the checkpoint `restore` loaded (verified by its manifest), or None."""
        if self.restored is None:
            return None
        path = self.restored / EXTRA_STATE.format(rank=self.accelerator.process_index)
        if not path.is_file():
            return None
        return load_weights_only(path)  # InputError naming the file when refused (nothing in it runs)


def save_captioner(folder: str | os.PathLike, model: Captioner, vocab: Vocab, features: dict[str, Any],
                   extra: dict[str, Any] | None = None) -> Path:
    """Write a captioner model folder (`model.safetensors` + `captioner.json`) atomically (finite weights only)."""
    folder = Path(folder)
    bad = nonfinite_parameter(model.state_dict().items())
    if bad is not None:  # the trainers stop before this (on every process); this is the last line of defence
        raise NonFiniteError(f"refusing to save a captioner with non-finite weights ({bad!r}) to {folder}")
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    try:
        state = {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}
        with writing_to(folder / "model.safetensors"):  # a full disk: one line naming the file
            save_file(state, str(tmp / "model.safetensors"))
        info = {"format": "pacs-captioner", "model": captioner_config_dict(model.config), "vocab": vocab.to_dict(),
                "features": dict(features), "provenance": provenance(**(extra or {}))}
        write_json_atomic(tmp / "captioner.json", info, indent=None)
        chmod_like_umask(tmp)  # safetensors writes 0600 files: give them the umask's mode
        _atomic_dir_replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def load_captioner(folder: str | os.PathLike, device: str | torch.device = "cpu") -> tuple[Captioner, Vocab, dict]:
    """Load a captioner model folder; returns (model in eval mode, vocabulary, captioner.json contents)."""
    folder = Path(folder)
    info_path, weights = folder / "captioner.json", folder / "model.safetensors"
    if not info_path.is_file() or not weights.is_file():
        raise MissingResourceError(f"{folder} is not a captioner checkpoint (needs captioner.json and model.safetensors)")
    try:
        info = json.loads(info_path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as error:  # ValueError: bad JSON or bytes that are not UTF-8
        raise InputError(f"{info_path}: invalid JSON ({error})") from None
    if not isinstance(info, dict) or info.get("format") != "pacs-captioner":
        found = info.get("format") if isinstance(info, dict) else type(info).__name__
        raise InputError(f"{info_path}: not a pacs captioner description (format={found!r})")
    check_feature_source(info.get("features", {}), info_path)
    model = Captioner(from_dict(CaptionerConfig, info["model"], f"{info_path}:model"))
    try:
        state = load_file(str(weights))
    except Exception as error:  # noqa: BLE001 - safetensors raises several types for corrupt files
        raise InputError(f"{weights} is unreadable ({error})") from None
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise InputError(f"{weights} does not match captioner.json: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model.to(device).eval(), vocab_from_dict(info["vocab"], str(info_path)), info


#: the `features` fields of captioner.json that name where features come from, and the types they must have
FEATURE_SOURCE_TYPES = {"backbone": str, "checkpoint": str, "arch": str, "family": str, "fingerprint": str,
                        "random_config": dict, "random_seed": int}


def check_feature_source(features: Any, info_path: Path) -> None:
    """InputError naming captioner.json and the key when its `features` record has a field of the wrong type, or
    names a checkpoint / arch file that is a FIFO, socket or device (reading one would block or never end)."""
    if not isinstance(features, dict):
        raise InputError(f"{info_path}: features must be an object (the feature source), not "
                         f"{type(features).__name__}")
    for key, kind in FEATURE_SOURCE_TYPES.items():
        value = features.get(key)
        if value is not None and (not isinstance(value, kind) or isinstance(value, bool)):
            expected = {str: "a string", dict: "an object", int: "an integer"}[kind]
            raise InputError(f"{info_path}: features.{key} must be {expected}, not {value!r:.60}")
    for key in ("checkpoint", "arch"):
        if features.get(key):
            refuse_special(features[key], f"{info_path}: features.{key}")
