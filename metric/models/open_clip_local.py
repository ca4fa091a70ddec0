"""What both open_clip families share: the ``local-dir:`` folder layout, offline model creation, quiet open_clip.

open_clip's own folder layout (``local-dir:FOLDER``, or a checkpoint folder holding ``open_clip_config.json`` +
``open_clip_model.safetensors`` without pacs metadata): the model config, the preprocessing (``preprocess_cfg``,
required: never open_clip's OpenAI default) and, for a Hugging Face tokenizer, the tokenizer files come from it.
Which family a folder is (its text config names a Hugging Face tokenizer: `pacs.metric.models.open_clip_siglip`, else
`pacs.metric.models.open_clip_clip`) is `local_dir_reads_hf_tokenizer`; each family module builds its tokenizer and
hands the rest to `assemble_local_dir`.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import open_clip
import torch

from pacs.metric.common.errors import InputError, MissingResourceError
from pacs.metric.common.json_input import read_json_file
from pacs.metric.common.provenance import sha256_file
from pacs.metric.models.backbones import EXPORT_CONFIG_FILE, Backbone, assemble_backbone
from pacs.metric.models.families import NOT_ESTABLISHED, SOURCE_USER, check_family_name
from pacs.metric.models.preprocess import ImagePreprocess
from pacs.metric.models.weights_only import LOAD_ERRORS, quiet_pickle_protocol_warning, torch_load_error

LOCAL_DIR = "local-dir:"
LOCAL_DIR_SOURCE = "open_clip-local-dir"  # Backbone.source["kind"] of a local-dir folder
WEIGHT_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")


def is_open_clip_folder(folder: Path) -> bool:
    """True when `folder` holds open_clip's ``open_clip_config.json`` and one of its weight files."""
    return (folder / EXPORT_CONFIG_FILE).is_file() and any((folder / name).is_file() for name in WEIGHT_FILES)


def local_dir_reads_hf_tokenizer(folder: Path) -> bool:
    """True when a local-dir folder's model config names a Hugging Face tokenizer; False when unreadable."""
    try:
        data = read_json_file(folder / EXPORT_CONFIG_FILE, "open_clip config")
    except (InputError, MissingResourceError, OSError):
        return False  # the family loader that takes the folder names the problem
    model_cfg = data.get("model_cfg") if isinstance(data, dict) else None
    text_cfg = model_cfg.get("text_cfg") if isinstance(model_cfg, dict) else None
    return isinstance(text_cfg, dict) and bool(text_cfg.get("hf_tokenizer_name"))


def user_family(family: str | None) -> tuple[str | None, str]:
    """(family, how established) of a model whose files establish none: the user's --family, else none."""
    family = check_family_name(family)
    return (family, SOURCE_USER) if family else (None, NOT_ESTABLISHED)


def plain_cfg(cfg: dict[str, Any]) -> dict[str, Any]:
    """A preprocess config with tuples as lists (JSON-like, as saved)."""
    return {key: list(value) if isinstance(value, tuple) else value for key, value in cfg.items()}


@contextlib.contextmanager
def open_clip_errors_silenced() -> Iterator[None]:
    """Drop open_clip's root-logger INFO chatter and ERROR records while it runs (pacs reports failures itself)."""
    root = logging.getLogger()

    def not_open_clip(record: logging.LogRecord) -> bool:
        return "open_clip" not in record.pathname or record.levelno == logging.WARNING

    root.addFilter(not_open_clip)
    try:
        yield
    finally:
        root.removeFilter(not_open_clip)


def create_open_clip(name: str, pretrained: str | None, what: str) -> Any:
    """open_clip.create_model offline (fp32, CPU, weights_only); one error naming `what` otherwise."""
    try:
        with quiet_pickle_protocol_warning():
            return open_clip.create_model(name, pretrained=pretrained, precision="fp32", device="cpu",
                                          weights_only=True)
    except LOAD_ERRORS as error:
        raise torch_load_error(pretrained or what, error, parameter="backbone") from None
    except (RuntimeError, ValueError, FileNotFoundError, OSError) as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise MissingResourceError(f"{what}: cannot build the open_clip model offline: {message}",
                                   parameter="backbone") from None


@dataclass
class LocalDirFolder:
    """A checked local-dir folder: its model (weights loaded), model config, resolved preprocessing, weights file."""

    folder: Path
    model: torch.nn.Module
    config: dict[str, Any]
    preprocess_cfg: dict[str, Any]
    weights: Path

    @property
    def name(self) -> str:
        """The backbone name, ``local-dir:FOLDER``."""
        return f"{LOCAL_DIR}{self.folder}"


def read_local_dir(folder: str | os.PathLike) -> LocalDirFolder:
    """Check a local-dir folder (config, normalisation, weights) and build its model offline."""
    folder = Path(folder)
    config_path = folder / EXPORT_CONFIG_FILE
    if not config_path.is_file():
        raise MissingResourceError(f"local-dir:{folder}: {EXPORT_CONFIG_FILE} not found", parameter="backbone")
    data = read_json_file(config_path, "open_clip config")
    if not isinstance(data, dict) or not isinstance(data.get("model_cfg"), dict):
        raise InputError(f"{config_path}: expected an object with 'model_cfg' (open_clip's local-dir layout)")
    preprocess_cfg = data.get("preprocess_cfg") or {}
    missing = [key for key in ("mean", "std") if key not in preprocess_cfg]
    if missing:
        raise InputError(f"{config_path}: preprocess_cfg lacks {', '.join(missing)}: the image normalisation is not "
                         "established (open_clip would silently use OpenAI's); add it to the file")
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        raise MissingResourceError(f"local-dir:{folder}: no weights ({' or '.join(WEIGHT_FILES)})",
                                   parameter="backbone")
    model = create_open_clip(f"{LOCAL_DIR}{folder}", None, f"local-dir:{folder}")
    config = copy.deepcopy(data["model_cfg"])
    resolved = plain_cfg(open_clip.get_model_preprocess_cfg(model))
    config["preprocess_cfg"] = resolved
    weights = next(folder / name for name in WEIGHT_FILES if (folder / name).is_file())
    return LocalDirFolder(folder=folder, model=model, config=config, preprocess_cfg=resolved, weights=weights)


def assemble_local_dir(local: LocalDirFolder, tokenizer: Any, device: str, family: str | None) -> Backbone:
    """The `Backbone` of a read local-dir folder with its family's tokenizer (family: the user's --family)."""
    own_family, own_source = user_family(family)
    source = {"kind": LOCAL_DIR_SOURCE, "path": str(local.folder), "sha256": sha256_file(local.weights),
              "family_source": own_source}
    return assemble_backbone(local.model, local.config,
                             preprocess=ImagePreprocess.from_open_clip_cfg(local.preprocess_cfg), name=local.name,
                             family=own_family, family_source=own_source, source=source, device=device,
                             tokenizer=tokenizer)
