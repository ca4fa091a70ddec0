"""The open_clip SigLIP / SigLIP2 family (text tower with a Hugging Face tokenizer), offline.

Sources:
- ``local-dir:FOLDER`` (or a checkpoint folder in open_clip's layout without pacs metadata) whose text config names
  a Hugging Face tokenizer: config, preprocessing and tokenizer files from the folder (`pacs.metric.models.open_clip_local`).
- ``NAME/FILE`` (or ``backbone=NAME, checkpoint=FILE``) for a built-in name whose tokenizer is a Hugging Face one
  (``ViT-B-16-SigLIP``, ``ViT-SO400M-14-SigLIP2`` ...): the tokenizer files must lie next to FILE, the
  preprocessing is that of the name's pretrained tags (all of them agree for the SigLIP names) unless an
  ``open_clip_config.json`` next to FILE has a ``preprocess_cfg``.
- ``NAME/TAG``: open_clip's pretrained weights and tokenizer from the Hugging Face cache.
- A pacs checkpoint of such a model finds its tokenizer with `checkpoint_tokenizer` (`pacs.metric.models.pacs_checkpoint`).

Tokenizer: open_clip's `HFTokenizer`, wrapped to report truncation (`pacs.metric.models.hf_tokenizer`). Traits: read
from the model (`pacs.metric.models.open_clip_traits`: sigmoid loss, pooling, pad id).
"""
from __future__ import annotations

import copy
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import open_clip
import torch

from pacs.metric.common.errors import InputError, MissingResourceError
from pacs.metric.common.json_input import read_json_file
from pacs.metric.common.provenance import sha256_file
from pacs.metric.models.backbones import (
    EXPORT_CONFIG_FILE,
    Backbone,
    assemble_backbone,
    parse_backbone_spec,
)
from pacs.metric.models.families import SOURCE_OPEN_CLIP, check_declared_family
from pacs.metric.models.loader_registry import LoadRequest
from pacs.metric.models.open_clip_local import (
    LOCAL_DIR,
    assemble_local_dir,
    create_open_clip,
    is_open_clip_folder,
    local_dir_reads_hf_tokenizer,
    open_clip_errors_silenced,
    plain_cfg,
    read_local_dir,
    user_family,
)
from pacs.metric.models.open_clip_traits import (
    TOKENIZER_FILE,
    TOKENIZER_FILES_TEXT,
    has_tokenizer_files,
    hf_tokenizer_from_folder,
    wrap_open_clip_tokenizer,
)
from pacs.metric.models.preprocess import ImagePreprocess

_PREPROCESS_KEYS = ("mean", "std", "interpolation", "resize_mode")


def has_hf_tokenizer(name: str) -> bool:
    """True for a built-in open_clip name whose text tower reads a Hugging Face tokenizer (SigLIP, SigLIP2 ...)."""
    config = open_clip.get_model_config(name) or {}
    return bool(config.get("text_cfg", {}).get("hf_tokenizer_name"))


def _tokenizer(source: str | Path, context_length: int, text_cfg: dict[str, Any], what: str) -> Any:
    """open_clip's `HFTokenizer` over a local folder (`hf_tokenizer_from_folder`)."""
    return hf_tokenizer_from_folder(source, {**text_cfg, "context_length": context_length}, what)


def load_local_dir_siglip(folder: str | os.PathLike, device: str = "cpu", family: str | None = None) -> Backbone:
    """A SigLIP ``local-dir`` folder: config, preprocessing, tokenizer files and weights all from the folder."""
    local = read_local_dir(folder)
    text_cfg = local.config.get("text_cfg", {})
    tokenizer = _tokenizer(local.folder, int(text_cfg.get("context_length", 77)), text_cfg, local.name)
    return assemble_local_dir(local, tokenizer, device, family)


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
        model = create_open_clip(name, pretrained, f"backbone= {spec}")
        preprocess_cfg = plain_cfg(open_clip.get_model_preprocess_cfg(model))
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
        model = create_open_clip(name, pretrained, f"backbone= {spec}")
        tokenizer = _tokenizer(folder, context_length, text_cfg, f"backbone= {spec}")
        own_family, own_source = user_family(family)
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


def _reads_hf_tokenizer(config: Mapping[str, Any]) -> bool:
    text_cfg = config.get("text_cfg", {})
    return bool(text_cfg.get("hf_tokenizer_name") or text_cfg.get("hf_model_name"))


def checkpoint_tokenizer(config: Mapping[str, Any], name: str, weights: Path) -> Callable[..., torch.Tensor] | None:
    """The Hugging Face tokenizer of a pacs checkpoint / export (SigLIP, SigLIP2); None for the CLIP BPE.

    Looked for, in order: tokenizer files next to `weights` (an export folder holds them), the recorded base `name`
    (a ``local-dir:`` folder, the folder of a ``NAME/FILE`` weights file, a built-in name's tokenizer in the Hugging
    Face cache); else one MissingResourceError saying where to put the tokenizer files.
    """
    if not _reads_hf_tokenizer(config):
        return None
    text_cfg = config.get("text_cfg", {})
    what = f"checkpoint {weights}"
    model_name, pretrained = parse_backbone_spec(name)
    folders = [weights.resolve().parent]
    if model_name.startswith("local-dir:"):
        folders.append(Path(model_name[len("local-dir:"):]))
    elif pretrained and not open_clip.get_pretrained_cfg(model_name, pretrained) and \
            (Path(pretrained).suffix or os.sep in pretrained):  # NAME/FILE: the tokenizer lay next to FILE
        folders.append(Path(pretrained).parent)
    for folder in folders:
        if has_tokenizer_files(folder):
            return hf_tokenizer_from_folder(folder, text_cfg, what, parameter="checkpoint")
    tokenizer_name = text_cfg.get("hf_tokenizer_name") or text_cfg.get("hf_model_name")
    if model_name.startswith("hf-hub:") or (not model_name.startswith("local-dir:")
                                            and open_clip.get_model_config(model_name) is not None):
        # a hub or built-in name: its tokenizer may be in the Hugging Face cache
        try:
            with open_clip_errors_silenced():
                return wrap_open_clip_tokenizer(open_clip.get_tokenizer(
                    model_name, context_length=int(text_cfg.get("context_length", 77))))
        except (OSError, ValueError, RuntimeError):
            pass
    places = " or ".join(str(folder) for folder in folders)
    raise MissingResourceError(f"{what}: its text tower reads the Hugging Face tokenizer {tokenizer_name}, found "
                               f"neither next to the weights nor at the recorded base {name} (looked in {places}): "
                               f"put the tokenizer files ({TOKENIZER_FILES_TEXT}) in {weights.resolve().parent}",
                               parameter="checkpoint")


def names_hf_text_model(request: LoadRequest) -> bool:
    """True for ``backbone=NAME`` + a checkpoint *file* where NAME is a built-in SigLIP name (the file: its weights)."""
    return (request.backbone is not None and request.checkpoint is not None and request.checkpoint.is_file()
            and has_hf_tokenizer(parse_backbone_spec(request.backbone)[0]))


class OpenClipSiglipLoader:
    """Loader of the open_clip SigLIP / SigLIP2 family (`pacs.metric.models.loader_registry`); before the CLIP loader."""

    name = "open_clip-siglip"

    def detect(self, request: LoadRequest) -> bool:
        """A SigLIP name (alone or + weights file), or a local-dir folder whose text config names an HF tokenizer."""
        if request.checkpoint is None:
            spec = str(request.backbone)
            if spec.startswith(LOCAL_DIR):
                return local_dir_reads_hf_tokenizer(Path(spec[len(LOCAL_DIR):]))
            return has_hf_tokenizer(parse_backbone_spec(spec)[0])
        if names_hf_text_model(request):
            return True
        folder = request.checkpoint
        return folder.is_dir() and is_open_clip_folder(folder) and local_dir_reads_hf_tokenizer(folder)

    def build(self, request: LoadRequest, device: str) -> Backbone:
        """The open_clip SigLIP backbone of a name, a name + weights file or a local-dir folder."""
        spec = str(request.backbone)
        if request.checkpoint is None:
            if spec.startswith(LOCAL_DIR):
                return load_local_dir_siglip(Path(spec[len(LOCAL_DIR):]), device=device, family=request.family)
            return load_named_hf_text_backbone(spec, device=device, family=request.family)
        if request.checkpoint.is_file():
            return load_named_hf_text_backbone(spec, device=device, family=request.family,
                                               checkpoint=str(request.checkpoint))
        return load_local_dir_siglip(request.checkpoint, device=device, family=request.family)
