"""LoRA on both towers of an open_clip CLIP through peft: attach, merge, save the adapter, load it back.

peft's own parametrisation is used unchanged (``LoraConfig(target_modules=...)``): LoRA on every
``nn.MultiheadAttention`` (fused q/k/v ``in_proj`` and ``out_proj``), on the MLP ``c_fc`` / ``c_proj`` of every
residual block of the image and text transformers, and optionally on the ViT patch embedding ``visual.conv1``.
The default ``alpha = 1`` follows the official PAC-S++ code (scaling alpha/r = 0.25 at r = 4).

An adapter folder holds peft's ``adapter_config.json`` + ``adapter_model.safetensors`` and ``pacs_base.json``
describing the base backbone: its open_clip config, its name and fingerprint, and where to load it from
(``{"backbone": "ViT-B-32/openai"}``, ``{"checkpoint": PATH, "sha256": ...}``, or the base weights stored in
the folder as ``base.safetensors`` when the base has no other source, e.g. a randomly initialised model).
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import os
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from metric.common.errors import InputError
from metric.common.json_input import read_json_file
from metric.common.provenance import sha256_file
from metric.models.backbones import Backbone, model_fingerprint, save_backbone
from metric.models.families import SOURCE_LORA, SOURCE_METADATA
from metric.models.weights_only import quiet_pickle_protocol_warning, torch_load_error

logger = logging.getLogger(__name__)

BASE_FILE = "pacs_base.json"
EMBEDDED_BASE = "base.safetensors"
DEFAULT_TARGETS = ("attn", "mlp.c_fc", "mlp.c_proj")
BASE_FINGERPRINT_ATTR = "pacs_base_fingerprint"


def lora_target_regex(targets: Sequence[str] = DEFAULT_TARGETS, patch_embedding: bool = True) -> str:
    """The peft ``target_modules`` regex (full-match on module names) for open_clip's blocks of both towers."""
    names = "|".join(t.replace(".", r"\.") for t in targets)
    pattern = rf"(.*\.)?({names})"
    if patch_embedding:
        pattern += r"|visual\.conv1"
    return pattern


def attach_lora(backbone: Backbone, rank: int = 4, alpha: float = 1.0, targets: Sequence[str] = DEFAULT_TARGETS,
                patch_embedding: bool = True, dropout: float = 0.0) -> Backbone:
    """Inject peft LoRA adapters into `backbone.model` (in place) and return the backbone with the peft model.

    Base weights are frozen (peft marks only the LoRA matrices trainable); the family becomes ``pac-s++``.
    The new fingerprint says "untrained adapter on this base"; it is recomputed when the adapter is merged or saved.
    """
    import peft

    if rank < 1:
        raise InputError(f"LoRA rank must be >= 1, got {rank}")
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout,
                             target_modules=lora_target_regex(targets, patch_embedding))
    base_fingerprint = backbone.fingerprint
    try:
        model = peft.get_peft_model(backbone.model, config)
    except ValueError as error:
        raise InputError(f"backbone {backbone.name}: cannot attach LoRA to {list(targets)}: {error}") from None
    setattr(model, BASE_FINGERPRINT_ATTR, base_fingerprint)
    return dataclasses.replace(backbone, model=model, family="pac-s++", family_source=SOURCE_LORA,
                               fingerprint=hashlib.sha256(f"{base_fingerprint}+lora-untrained".encode()).hexdigest())


def is_lora_backbone(backbone: Backbone) -> bool:
    """Whether `backbone.model` is a peft model carrying LoRA adapters."""
    import peft

    return isinstance(backbone.model, peft.PeftModel)


def merge_lora(backbone: Backbone) -> Backbone:
    """Merge the LoRA matrices into the base weights; return a backbone holding a plain open_clip model."""
    if not is_lora_backbone(backbone):
        raise InputError(f"backbone {backbone.name} carries no LoRA adapter to merge")
    merged = backbone.model.merge_and_unload()
    merged.eval()
    return dataclasses.replace(backbone, model=merged, family="pac-s++", family_source=SOURCE_LORA,
                               fingerprint=model_fingerprint(merged, backbone.open_clip_config, backbone.preprocess))


def base_model_copy(backbone: Backbone) -> torch.nn.Module:
    """A copy of the base open_clip model with the LoRA layers removed (not merged)."""
    return copy.deepcopy(backbone.model).unload()


def base_from_source(backbone: Backbone) -> dict[str, Any] | None:
    """Where to reload `backbone`'s base from, judged by its ``source`` record (None: embed the weights)."""
    source = getattr(backbone, "source", None) or {}
    if source.get("kind") == "open_clip" and source.get("pretrained"):
        return {"backbone": backbone.name}
    if source.get("kind") in ("pacs", "state_dict") and source.get("path") and Path(source["path"]).is_file():
        return {"checkpoint": source["path"], "arch": source.get("arch")}
    return None


def save_adapter(backbone: Backbone, folder: str | os.PathLike, base: dict[str, Any] | None = None) -> Path:
    """Write the peft adapter (``save_pretrained``) and ``pacs_base.json`` into `folder`; return the folder.

    `base` says where the base comes from: ``{"backbone": NAME}`` or ``{"checkpoint": PATH}`` (its sha256 is
    recorded); by default it is taken from ``backbone.source`` (an open_clip name or a pacs checkpoint file).
    A base with no other source (random weights) is saved into the folder (``base.safetensors``).
    """
    base = base if base is not None else base_from_source(backbone)
    if not is_lora_backbone(backbone):
        raise InputError(f"backbone {backbone.name} carries no LoRA adapter to save")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    backbone.model.save_pretrained(str(folder), safe_serialization=True)
    source: dict[str, Any]
    if base and base.get("checkpoint"):
        path = Path(base["checkpoint"]).resolve()
        source = {"checkpoint": str(path), "sha256": sha256_file(path)}
        if base.get("arch"):
            source["arch"] = str(base["arch"])
    elif base and base.get("backbone"):
        source = {"backbone": str(base["backbone"])}
        if base.get("arch"):
            source["arch"] = str(base["arch"])
    else:
        base_backbone = dataclasses.replace(backbone, model=base_model_copy(backbone), family="clip",
                                            fingerprint=getattr(backbone.model, BASE_FINGERPRINT_ATTR, ""))
        save_backbone(base_backbone, folder / EMBEDDED_BASE)
        source = {"checkpoint": EMBEDDED_BASE, "sha256": sha256_file(folder / EMBEDDED_BASE)}
    record = {
        "pacs_format": "lora-adapter",
        "name": backbone.name,
        "base": source,
        "base_fingerprint": getattr(backbone.model, BASE_FINGERPRINT_ATTR, None),
        "open_clip_config": backbone.open_clip_config,
        "context_length": backbone.context_length,
    }
    from metric.common.io import write_json_atomic

    write_json_atomic(folder / BASE_FILE, record)
    return folder


def read_base_record(folder: str | os.PathLike) -> dict[str, Any]:
    """Read and check ``pacs_base.json`` of an adapter folder."""
    folder = Path(folder)
    path = folder / BASE_FILE
    if not (folder / "adapter_config.json").is_file():
        raise InputError(f"{folder}: not a LoRA adapter folder (adapter_config.json missing)")
    if not path.is_file():
        raise InputError(f"{folder}: {BASE_FILE} missing; the adapter does not say which base backbone it needs")
    record = read_json_file(path, "adapter base record")
    if not isinstance(record, dict) or not isinstance(record.get("base"), dict) or not ("backbone" in record["base"] or "checkpoint" in record["base"]):
        raise InputError(f"{path}: key 'base' must name a 'backbone' or a 'checkpoint'")
    return record


def apply_adapter(folder: str | os.PathLike, base: Backbone, record: dict[str, Any], base_given: bool = False,
                  merge: bool = True) -> Backbone:
    """Put the adapter of `folder` (its `read_base_record` is `record`) on the loaded `base`; merged by default.

    A `base_given` by the caller must carry the recorded base fingerprint; any base must have the recorded open_clip
    config. `metric.models.factory.load_adapter_backbone` finds and loads the base first.
    """
    import peft

    folder = Path(folder)
    expected_fp = record.get("base_fingerprint")
    if record.get("open_clip_config") and base.open_clip_config and \
            _normalise(base.open_clip_config) != _normalise(record["open_clip_config"]):
        raise InputError(f"{folder}: adapter was trained on a different backbone ({record.get('name')}); "
                         f"the base given is {base.name} with another open_clip config")
    if base_given and expected_fp and base.fingerprint != expected_fp:
        raise InputError(f"{folder}: adapter was trained on base fingerprint {expected_fp[:12]}..., "
                         f"the base given ({base.name}) has {base.fingerprint[:12]}...")
    try:
        with quiet_pickle_protocol_warning():
            model = peft.PeftModel.from_pretrained(base.model, str(folder))
    except (pickle.UnpicklingError, EOFError) as error:  # adapter_model.bin that torch.load(weights_only=True) refused
        weights = folder / "adapter_model.bin"
        raise torch_load_error(weights if weights.is_file() else folder, error) from None
    except (RuntimeError, ValueError, KeyError) as error:
        raise InputError(f"{folder}: adapter does not fit base {base.name}: {str(error).splitlines()[0]}") from None
    model.eval()
    setattr(model, BASE_FINGERPRINT_ATTR, base.fingerprint)
    adapter_file = folder / "adapter_model.safetensors"
    adapter_hash = sha256_file(adapter_file) if adapter_file.is_file() else ""
    backbone = dataclasses.replace(base, model=model, family="pac-s++", family_source=SOURCE_METADATA,
                                   name=str(record.get("name") or base.name),
                                   fingerprint=hashlib.sha256(f"{base.fingerprint}+{adapter_hash}".encode())
                                   .hexdigest())
    if merge:
        merged = model.merge_and_unload()
        merged.eval()
        backbone = dataclasses.replace(backbone, model=merged)
    return backbone


def _normalise(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)
