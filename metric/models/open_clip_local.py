"""open_clip models with a Hugging Face tokenizer (SigLIP, SigLIP2) and open_clip `local-dir:` folders, offline.

Sources:
- ``local-dir:FOLDER`` (or a checkpoint folder holding ``open_clip_config.json`` + ``open_clip_model.safetensors``
  without pacs metadata): open_clip's own folder layout; the model config, the preprocessing (``preprocess_cfg``,
  required: never open_clip's OpenAI default) and the tokenizer files (``tokenizer_config.json`` ...) come from it.
- ``NAME/FILE`` (or ``backbone=NAME, checkpoint=FILE``) for a built-in name whose tokenizer is a Hugging Face one
  (``ViT-B-16-SigLIP``, ``ViT-SO400M-14-SigLIP2`` ...): the tokenizer files must lie next to FILE, the
  preprocessing is that of the name's pretrained tags (all of them agree for the SigLIP names) unless an
  ``open_clip_config.json`` next to FILE has a ``preprocess_cfg``.
- ``NAME/TAG``: open_clip's pretrained weights and tokenizer from the Hugging Face cache.
"""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import open_clip

from metric.common.errors import InputError, MissingResourceError
from metric.common.json_input import read_json_file
from metric.common.provenance import sha256_file
from metric.models.backbones import (
    EXPORT_CONFIG_FILE,
    Backbone,
    assemble_backbone,
    parse_backbone_spec,
)
from metric.models.families import (
    NOT_ESTABLISHED,
    SOURCE_OPEN_CLIP,
    SOURCE_USER,
    check_declared_family,
    check_family_name,
)
from metric.models.open_clip_traits import TOKENIZER_FILE, hf_tokenizer_from_folder, wrap_open_clip_tokenizer
from metric.models.preprocess import ImagePreprocess
from metric.models.weights_only import LOAD_ERRORS, quiet_pickle_protocol_warning, torch_load_error

LOCAL_DIR = "local-dir:"
LOCAL_DIR_SOURCE = "open_clip-local-dir"  # Backbone.source["kind"] of a local-dir folder
WEIGHT_FILES = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
_PREPROCESS_KEYS = ("mean", "std", "interpolation", "resize_mode")


def has_hf_tokenizer(name: str) -> bool:
    """True for a built-in open_clip name whose text tower reads a Hugging Face tokenizer (SigLIP, SigLIP2 ...)."""
    config = open_clip.get_model_config(name) or {}
    return bool(config.get("text_cfg", {}).get("hf_tokenizer_name"))


def is_open_clip_folder(folder: Path) -> bool:
    """True when `folder` holds open_clip's ``open_clip_config.json`` and one of its weight files."""
    return (folder / EXPORT_CONFIG_FILE).is_file() and any((folder / name).is_file() for name in WEIGHT_FILES)


def _family(user_family: str | None) -> tuple[str | None, str]:
    family = check_family_name(user_family)
    return (family, SOURCE_USER) if family else (None, NOT_ESTABLISHED)


def _plain(cfg: dict[str, Any]) -> dict[str, Any]:
    return {key: list(value) if isinstance(value, tuple) else value for key, value in cfg.items()}


def _create(name: str, pretrained: str | None, what: str) -> Any:
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


def _tokenizer(source: str | Path, context_length: int, text_cfg: dict[str, Any], what: str) -> Any:
    """open_clip's `HFTokenizer` over a local folder (`hf_tokenizer_from_folder`)."""
    return hf_tokenizer_from_folder(source, {**text_cfg, "context_length": context_length}, what)


def load_local_dir_backbone(folder: str | os.PathLike, device: str = "cpu", family: str | None = None) -> Backbone:
    """Load an open_clip ``local-dir`` folder (config, preprocessing, tokenizer, weights: all from the folder)."""
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
    model = _create(f"{LOCAL_DIR}{folder}", None, f"local-dir:{folder}")
    config = copy.deepcopy(data["model_cfg"])
    text_cfg = config.get("text_cfg", {})
    context_length = int(text_cfg.get("context_length", 77))
    if text_cfg.get("hf_tokenizer_name"):
        tokenizer = _tokenizer(folder, context_length, text_cfg, f"local-dir:{folder}")
    else:
        tokenizer = wrap_open_clip_tokenizer(open_clip.get_tokenizer(f"{LOCAL_DIR}{folder}"))
    resolved = _plain(open_clip.get_model_preprocess_cfg(model))
    config["preprocess_cfg"] = resolved
    weights = next(folder / name for name in WEIGHT_FILES if (folder / name).is_file())
    own_family, own_source = _family(family)
    source = {"kind": LOCAL_DIR_SOURCE, "path": str(folder), "sha256": sha256_file(weights),
              "family_source": own_source}
    return assemble_backbone(model, config, preprocess=ImagePreprocess.from_open_clip_cfg(resolved),
                             name=f"{LOCAL_DIR}{folder}", family=own_family, family_source=own_source,
                             source=source, device=device, tokenizer=tokenizer)


def name_preprocess_cfg(name: str, folder: Path | None = None) -> dict[str, Any]:
    """The preprocessing of a built-in name: a local ``preprocess_cfg``, else what all its pretrained tags agree on."""
    if folder is not None and (folder / EXPORT_CONFIG_FILE).is_file():
        data = read_json_file(folder / EXPORT_CONFIG_FILE, "open_clip config")
        local = data.get("preprocess_cfg") if isinstance(data, dict) else None
        if isinstance(local, dict) and "mean" in local and "std" in local:
            return dict(local)
    settings = set()
    for tag in open_clip.list_pretrained_tags_by_model(name):
        cfg = open_clip.get_pretrained_cfg(name, tag)
        settings.add(tuple((key, tuple(cfg[key]) if isinstance(cfg.get(key), (list, tuple)) else cfg.get(key))
                           for key in _PREPROCESS_KEYS))
    if len(settings) != 1 or any(value is None for key, value in next(iter(settings)) if key in ("mean", "std")):
        raise InputError(f"backbone= {name}: its preprocessing is not established (pretrained tags disagree or "
                         f"declare none); use local-dir:FOLDER with a preprocess_cfg", parameter="backbone")
    return {key: value for key, value in next(iter(settings)) if value is not None}


def load_named_hf_text_backbone(spec: str, device: str = "cpu", family: str | None = None,
                                checkpoint: str | None = None) -> Backbone:
    """A built-in open_clip name with a Hugging Face tokenizer: ``NAME/TAG``, ``NAME/FILE`` or ``NAME`` + checkpoint."""
    name, pretrained = parse_backbone_spec(spec)
    if checkpoint is not None:
        if pretrained:
            raise InputError(f"backbone= {spec} names weights already: drop checkpoint= {checkpoint}",
                             parameter=("backbone", "checkpoint"))
        pretrained = checkpoint
    config = copy.deepcopy(open_clip.get_model_config(name))
    text_cfg = config.get("text_cfg", {})
    context_length = int(text_cfg.get("context_length", 77))
    if pretrained and open_clip.get_pretrained_cfg(name, pretrained):
        model = _create(name, pretrained, f"backbone= {spec}")
        preprocess_cfg = _plain(open_clip.get_model_preprocess_cfg(model))
        try:
            tokenizer = wrap_open_clip_tokenizer(open_clip.get_tokenizer(name))
        except OSError as error:
            raise MissingResourceError(f"backbone= {spec}: tokenizer {text_cfg['hf_tokenizer_name']} is not available "
                                       f"offline ({str(error).splitlines()[0]})", parameter="backbone") from None
        own_family, own_source = "clip", f"{SOURCE_OPEN_CLIP} {spec}"
        check_declared_family(own_family, own_source, family, spec)
        sha = None
    elif pretrained and os.path.isfile(pretrained):
        folder = Path(pretrained).resolve().parent
        if not (folder / TOKENIZER_FILE).is_file():
            raise MissingResourceError(f"backbone= {spec}: {name} reads a Hugging Face tokenizer "
                                       f"({text_cfg.get('hf_tokenizer_name')}); no {TOKENIZER_FILE} next to "
                                       f"{pretrained}: put the tokenizer files in {folder}", parameter="backbone")
        preprocess_cfg = name_preprocess_cfg(name, folder)
        model = _create(name, pretrained, f"backbone= {spec}")
        tokenizer = _tokenizer(folder, context_length, text_cfg, f"backbone= {spec}")
        own_family, own_source = _family(family)
        sha = sha256_file(pretrained)
    elif pretrained:
        tags = ", ".join(open_clip.list_pretrained_tags_by_model(name)) or "none"
        raise InputError(f"backbone= {spec}: {pretrained!r} is neither a pretrained tag of {name} (known: {tags}) "
                         "nor an existing file", parameter="backbone")
    else:
        raise MissingResourceError(f"backbone= {name}: random weights need its Hugging Face tokenizer "
                                   f"{text_cfg.get('hf_tokenizer_name')}, which is not available offline; use "
                                   f"{name}/WEIGHTS_FILE (tokenizer files next to it) or local-dir:FOLDER",
                                   parameter="backbone")
    config["preprocess_cfg"] = preprocess_cfg
    source = {"kind": "open_clip", "name": name, "pretrained": pretrained, "sha256": sha,
              "family_source": own_source}
    return assemble_backbone(model, config, preprocess=ImagePreprocess.from_open_clip_cfg(
        {"size": config.get("vision_cfg", {}).get("image_size", 224), **preprocess_cfg}),
        name=spec if checkpoint is None else f"{name}/{pretrained}", family=own_family, family_source=own_source,
        source=source, device=device, tokenizer=tokenizer)
