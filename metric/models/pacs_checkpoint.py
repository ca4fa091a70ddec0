"""pacs' own checkpoint format (`save_backbone`, the weights of a `pacs export` folder) as a loader.

A ``.safetensors`` file whose metadata says ``pacs_format: open_clip`` holds an open_clip state dict with its model
config (preprocessing included), family and name; it is either open_clip family. Its tokenizer: the Hugging Face
one found by `pacs.metric.models.open_clip_siglip.checkpoint_tokenizer` (SigLIP), else the CLIP BPE.
"""
from __future__ import annotations

import json
from pathlib import Path

from pacs.metric.common.errors import InputError
from pacs.metric.common.provenance import sha256_file
from pacs.metric.models.backbones import (
    EXPORT_WEIGHTS_FILE,
    PACS_FORMAT,
    Backbone,
    assemble_backbone,
    instantiate_open_clip,
    load_state_strict,
)
from pacs.metric.models.families import (
    FAMILIES,
    NOT_ESTABLISHED,
    SOURCE_METADATA,
    SOURCE_USER,
    check_declared_family,
    check_family_name,
)
from pacs.metric.models.loader_registry import LoadRequest
from pacs.metric.models.open_clip_siglip import checkpoint_tokenizer, names_hf_text_model
from pacs.metric.models.preprocess import ImagePreprocess


def read_pacs_metadata(path: Path) -> dict[str, str] | None:
    """The metadata of a pacs checkpoint, None for another safetensors file; InputError for an unreadable one."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except Exception as error:  # noqa: BLE001 - safetensors raises its own and several built-in types for bad files
        raise InputError(f"{path}: not a readable safetensors file: {error}") from None
    return metadata if metadata.get("pacs_format") == PACS_FORMAT else None


def load_pacs_safetensors(path: Path, device: str, family: str | None = None) -> Backbone | None:
    """A pacs checkpoint (`save_backbone`; the weights of a `pacs export` folder), None for another safetensors file.

    The tokenizer of a model with a Hugging Face tokenizer comes from `checkpoint_tokenizer`.
    """
    from safetensors.torch import load_file

    metadata = read_pacs_metadata(path)
    if metadata is None:
        return None
    try:
        config = json.loads(metadata["open_clip_config"])
    except (KeyError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: broken pacs metadata (open_clip_config): {error}") from None
    stored = metadata.get("family") or None
    if stored is not None and stored not in FAMILIES:
        raise InputError(f"{path}: broken pacs metadata: family {stored!r} (known: {', '.join(FAMILIES)})")
    own_family, own_source = (stored, SOURCE_METADATA) if stored else (None, NOT_ESTABLISHED)
    check_declared_family(own_family, own_source, family, str(path))
    if own_family is None and check_family_name(family):
        own_family, own_source = check_family_name(family), SOURCE_USER
    name = metadata.get("name", path.stem)
    tokenizer = checkpoint_tokenizer(config, name, path)
    state = load_file(str(path))
    model = instantiate_open_clip(config)
    load_state_strict(model, state, path)
    preprocess = ImagePreprocess.from_open_clip_cfg(config.get("preprocess_cfg", {}))
    return assemble_backbone(model, config, preprocess=preprocess, name=name, family=own_family,
                             family_source=own_source, device=device, tokenizer=tokenizer,
                             source={"kind": "pacs", "path": str(path), "sha256": sha256_file(path),
                                     "family_source": own_source})


def _weights(request: LoadRequest) -> Path | None:
    """The safetensors file a request names: the checkpoint file, or the weights of an export folder."""
    path = request.checkpoint
    if path is None or names_hf_text_model(request):
        return None
    if path.is_dir():
        return path / EXPORT_WEIGHTS_FILE if (path / EXPORT_WEIGHTS_FILE).is_file() else None
    return path if path.suffix == ".safetensors" else None


class PacsCheckpointLoader:
    """Loader of pacs checkpoints and `pacs export` folders (`pacs.metric.models.loader_registry`)."""

    name = "pacs-checkpoint"

    def detect(self, request: LoadRequest) -> bool:
        """A safetensors checkpoint (or export folder) with pacs metadata; an unreadable one is an InputError."""
        weights = _weights(request)
        return weights is not None and read_pacs_metadata(weights) is not None

    def build(self, request: LoadRequest, device: str) -> Backbone:
        """The backbone stored in the checkpoint; arch= is refused (the file carries its architecture)."""
        path = request.checkpoint
        weights = _weights(request)
        loaded = load_pacs_safetensors(weights, device, request.family) if weights is not None else None
        if loaded is None:
            raise InputError(f"{path}: not a pacs checkpoint", parameter="checkpoint")
        if request.arch is not None:
            what = "pacs export" if path.is_dir() else "pacs checkpoint"
            raise InputError(f"{path} is a {what} that carries its architecture: drop arch= {request.arch}",
                             parameter="arch")
        return loaded
