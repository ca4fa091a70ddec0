"""LoRA on both towers of an open_clip model through peft: attach, merge, save the adapter, load it back.

peft's own parametrisation is used unchanged (``LoraConfig(target_modules=...)``). This module owns which layers
are adapted, chosen by module type and name for each layout it finds in the model (`lora_modules`):

- open_clip transformer blocks (CLIP and SigLIP text towers, open_clip ViTs): every ``nn.MultiheadAttention``
  named ``attn`` (fused q/k/v ``in_proj`` and ``out_proj``) and the MLP ``mlp.c_fc`` / ``mlp.c_proj``;
- open_clip attention pooling (``visual.attn_pool.attn``, SigLIP's MAP head): adapted like a block's attention,
  but left out (logged) when its query and key widths differ, since peft can only wrap a MultiheadAttention whose
  query, key and value share one width;
- timm vision trunks (every open_clip ``ViT-*-SigLIP*`` config): the ``nn.Linear`` layers ``blocks.N.attn.qkv``,
  ``attn.proj``, ``mlp.fc1`` / ``mlp.fc2`` and the MAP head ``attn_pool.q`` / ``kv`` / ``proj`` (+ its MLP); timm's
  ``Attention`` module itself is not a layer peft can wrap;
- optionally the patch embedding: ``visual.conv1`` (open_clip ViT) or ``trunk.patch_embed.proj`` (timm).

The default ``alpha = 1`` follows the official PAC-S++ code (scaling alpha/r = 0.25 at r = 4).

An adapter folder holds peft's ``adapter_config.json`` + ``adapter_model.safetensors`` and ``pacs_base.json``
describing the base backbone: its open_clip config, its name and fingerprint, where to load it from
(``{"backbone": "ViT-B-32/openai"}``, ``{"backbone": "local-dir:PATH", "sha256": ...}``,
``{"checkpoint": PATH, "sha256": ...}``, or the base weights stored in the folder as ``base.safetensors`` when the
base has no other source, e.g. a randomly initialised model), and the model's ``logit_scale`` / ``logit_bias``
parameter values (peft saves the LoRA matrices only: a scale and bias trained with ``train_logit_scale`` travel
here and are put back on the base by `apply_adapter`).
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import logging
import os
import pickle
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pacs.metric.common.errors import InputError
from pacs.metric.common.io import chmod_like_umask, write_json_atomic
from pacs.metric.common.json_input import read_json_file
from pacs.metric.common.os_errors import writing_to
from pacs.metric.common.provenance import sha256_file
from pacs.metric.models.backbones import Backbone, model_fingerprint, save_backbone
from pacs.metric.models.families import SOURCE_LORA, SOURCE_METADATA
from pacs.metric.models.open_clip_local import LOCAL_DIR, LOCAL_DIR_SOURCE
from pacs.metric.models.weights_only import quiet_pickle_protocol_warning, torch_load_error

logger = logging.getLogger(__name__)

BASE_FILE = "pacs_base.json"
EMBEDDED_BASE = "base.safetensors"
DEFAULT_TARGETS = ("attn", "mlp.c_fc", "mlp.c_proj")
BASE_FINGERPRINT_ATTR = "pacs_base_fingerprint"
OPEN_CLIP_LINEAR_SUFFIXES = ("mlp.c_fc", "mlp.c_proj")  # open_clip residual blocks' MLP
TIMM_LINEAR_SUFFIXES = ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2",  # timm ViT blocks (and the MAP head's MLP)
                        "attn_pool.q", "attn_pool.kv", "attn_pool.proj")  # timm's MAP head (attention pooling)
TIMM_PATCH_EMBEDDING = "patch_embed.proj"
OPEN_CLIP_PATCH_EMBEDDING = "conv1"
TEMPERATURE_PARAMETERS = ("logit_scale", "logit_bias")


def lora_target_regex(targets: Sequence[str] = DEFAULT_TARGETS, patch_embedding: bool = True) -> str:
    """A peft ``target_modules`` regex (full-match on module names) for `targets` of open_clip's blocks of both towers."""
    names = "|".join(t.replace(".", r"\.") for t in targets)
    pattern = rf"(.*\.)?({names})"
    if patch_embedding:
        pattern += r"|visual\.conv1"
    return pattern


def _ends_with(name: str, suffixes: Sequence[str]) -> bool:
    return any(name == suffix or name.endswith("." + suffix) for suffix in suffixes)


def _timm_trunks(model: nn.Module) -> list[str]:
    """Names of the timm models inside `model` (open_clip's ``visual.trunk``), outermost only."""
    trunks: list[str] = []
    for name, module in model.named_modules():
        if type(module).__module__.startswith("timm.") and not any(not t or name.startswith(t + ".") for t in trunks):
            trunks.append(name)
    return trunks


def patch_embedding_modules(model: nn.Module) -> list[str]:
    """The patch embedding convolutions of `model`: ``visual.conv1`` (open_clip ViT), ``trunk.patch_embed.proj`` (timm)."""
    from open_clip.transformer import VisionTransformer

    trunks = _timm_trunks(model)
    timm_names = {f"{trunk}.{TIMM_PATCH_EMBEDDING}" if trunk else TIMM_PATCH_EMBEDDING for trunk in trunks}
    found = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Conv2d):
            continue
        parent, _, leaf = name.rpartition(".")
        open_clip_vit = leaf == OPEN_CLIP_PATCH_EMBEDDING and isinstance(
            model.get_submodule(parent) if parent else model, VisionTransformer)
        if open_clip_vit or name in timm_names:
            found.append(name)
    return found


def _peft_can_wrap(name: str, module: nn.Module) -> bool:
    """False (logged) for a MultiheadAttention whose query and key widths differ: peft's LoRA refuses it."""
    if isinstance(module, nn.MultiheadAttention) and not module._qkv_same_embed_dim:
        logger.info("LoRA: %s left out: its query width %d differs from its key/value width %d (peft wraps a "
                    "MultiheadAttention only when they agree)", name, module.embed_dim, module.kdim)
        return False
    return True


def lora_modules(model: nn.Module, targets: Sequence[str] = DEFAULT_TARGETS, patch_embedding: bool = True) -> list[str]:
    """The names of the modules of `model` that LoRA adapts (see the module docstring), in model order.

    The default `targets` pick, per layout, open_clip's block attention + MLP, its attention pooling and timm's
    block / MAP-head linear layers; other `targets` are name suffixes matched as given (`lora_target_regex`). A
    MultiheadAttention peft cannot wrap (query width != key width) is left out; `patch_embedding` adds the layout's
    patch embedding.
    """
    names: list[str] = []
    if tuple(targets) == DEFAULT_TARGETS:
        trunks = _timm_trunks(model)
        for name, module in model.named_modules():
            if isinstance(module, nn.MultiheadAttention):
                keep = name.rpartition(".")[2] == "attn"
            elif isinstance(module, nn.Linear):
                keep = _ends_with(name, OPEN_CLIP_LINEAR_SUFFIXES) or (
                    _ends_with(name, TIMM_LINEAR_SUFFIXES) and any(not t or name.startswith(t + ".") for t in trunks))
            else:
                keep = False
            if keep and _peft_can_wrap(name, module):
                names.append(name)
    else:
        pattern = re.compile(lora_target_regex(targets, patch_embedding=False))
        names = [name for name, module in model.named_modules()
                 if name and pattern.fullmatch(name) and _peft_can_wrap(name, module)]
    if patch_embedding:
        names += [name for name in patch_embedding_modules(model) if name not in names]
    return names


def attach_lora(backbone: Backbone, rank: int = 4, alpha: float = 1.0, targets: Sequence[str] = DEFAULT_TARGETS,
                patch_embedding: bool = True, dropout: float = 0.0) -> Backbone:
    """Inject peft LoRA adapters into `backbone.model` (in place) and return the backbone with the peft model.

    The adapted modules are `lora_modules(model, targets, patch_embedding)` (peft gets their exact names).
    Base weights are frozen (peft marks only the LoRA matrices trainable); the family becomes ``pac-s++``.
    The new fingerprint says "untrained adapter on this base"; it is recomputed when the adapter is merged or saved.
    """
    import peft

    if rank < 1:
        raise InputError(f"LoRA rank must be >= 1, got {rank}")
    modules = lora_modules(backbone.model, targets, patch_embedding)
    if not modules:
        raise InputError(f"backbone {backbone.name}: no module matches the LoRA targets {list(targets)}")
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout,
                             target_modules="|".join(re.escape(name) for name in modules))
    base_fingerprint = backbone.fingerprint
    try:
        # adapters keep the base's dtype (peft >= 0.11 would upcast them to fp32 under a half-precision base)
        model = peft.get_peft_model(backbone.model, config, autocast_adapter_dtype=False)
    except ValueError as error:
        raise InputError(f"backbone {backbone.name}: cannot attach LoRA to {list(targets)}: {error}") from None
    no_input_casting(model)
    setattr(model, BASE_FINGERPRINT_ATTR, base_fingerprint)
    return dataclasses.replace(backbone, model=model, family="pac-s++", family_source=SOURCE_LORA,
                               fingerprint=hashlib.sha256(f"{base_fingerprint}+lora-untrained".encode()).hexdigest())


def no_input_casting(model: nn.Module) -> int:
    """Stop peft's LoRA layers from copying their input to the adapter's dtype; the number of layers changed.

    Under bf16 autocast a LoRA layer's input is bf16 and its adapter fp32: peft would copy the input to fp32 before
    the adapter matmul, which autocast then casts back to bf16 (the same values: bf16 -> fp32 -> bf16 is exact), so
    the copy only costs time. Without autocast input and adapter already share their dtype and nothing changes.
    """
    changed = 0
    for module in model.modules():
        if hasattr(module, "cast_input_dtype_enabled"):
            module.cast_input_dtype_enabled = False
            changed += 1
    return changed


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


def carries_lora(backbone: Backbone) -> bool:
    """`is_lora_backbone` without importing peft: a model built by peft means peft is already imported."""
    return "peft" in sys.modules and is_lora_backbone(backbone)


def merged_for_inference(backbone: Backbone) -> Backbone:
    """For frozen passes (scoring, a reward model): a LoRA backbone's adapters merged into a copy of its weights.

    One matmul per layer instead of three (W·x + B·(A·x)) and no low-rank products under autocast; the scores
    differ from the unmerged model's by float rounding only (tests/metric/test_merged_lora.py). The backbone given
    is left as it is (it may still be training: merging into it would fold the adapters into weights that are not
    trained); its fingerprint is kept, as the merged copy computes the same function. Any other backbone comes
    back as it is, uncopied.
    """
    if not carries_lora(backbone):
        return backbone
    merged = copy.deepcopy(backbone.model).merge_and_unload()
    merged.eval()
    merged.requires_grad_(False)
    return dataclasses.replace(backbone, model=merged)


def base_model_copy(backbone: Backbone) -> torch.nn.Module:
    """A copy of the base open_clip model with the LoRA layers removed (not merged)."""
    return copy.deepcopy(backbone.model).unload()


def base_from_source(backbone: Backbone) -> dict[str, Any] | None:
    """Where to reload `backbone`'s base from, judged by its ``source`` record (None: embed the weights).

    An open_clip pretrained name or local weights file, an open_clip ``local-dir:`` folder (by its absolute path and
    the sha256 of its weights), or a pacs / state-dict checkpoint file.
    """
    source = getattr(backbone, "source", None) or {}
    if source.get("kind") == "open_clip" and source.get("pretrained"):
        return {"backbone": backbone.name}
    if source.get("kind") == LOCAL_DIR_SOURCE and source.get("path") and Path(source["path"]).is_dir():
        record = {"backbone": f"{LOCAL_DIR}{Path(source['path']).resolve()}"}
        if source.get("sha256"):
            record["sha256"] = str(source["sha256"])
        return record
    if source.get("kind") in ("pacs", "state_dict") and source.get("path") and Path(source["path"]).is_file():
        return {"checkpoint": source["path"], "arch": source.get("arch")}
    return None


def temperature_values(model: nn.Module) -> dict[str, list[float]]:
    """The model's ``logit_scale`` (log of the scale) and ``logit_bias`` parameters as float lists, by name."""
    values: dict[str, list[float]] = {}
    for name, param in model.named_parameters():
        leaf = name.rpartition(".")[2]
        if leaf in TEMPERATURE_PARAMETERS and leaf not in values:
            values[leaf] = [float(v) for v in param.detach().to("cpu", torch.float32).reshape(-1).tolist()]
    return values


def _save_peft_files(model: nn.Module, folder: Path) -> None:
    """peft's ``save_pretrained`` into a temporary folder inside `folder`, its files then renamed into place: a full
    disk leaves no partial adapter and is an OSError naming the weights file (`writing_to`), not a SafetensorError."""

    with tempfile.TemporaryDirectory(prefix=".adapter.", dir=folder) as tmp, \
            writing_to(folder / "adapter_model.safetensors"):
        model.save_pretrained(tmp, safe_serialization=True)
        for item in sorted(Path(tmp).iterdir()):
            chmod_like_umask(item)
            os.replace(item, folder / item.name)


def save_adapter(backbone: Backbone, folder: str | os.PathLike, base: dict[str, Any] | None = None) -> Path:
    """Write the peft adapter (``save_pretrained``) and ``pacs_base.json`` into `folder`; return the folder.

    `base` says where the base comes from: ``{"backbone": NAME}`` (``local-dir:PATH`` with the ``sha256`` of its
    weights) or ``{"checkpoint": PATH}`` (its sha256 is recorded); by default it is taken from ``backbone.source``
    (`base_from_source`: an open_clip name, a local-dir folder or a pacs checkpoint file). A base with no other
    source (random weights; or an empty `base`) is saved into the folder (``base.safetensors``). The model's
    current ``logit_scale`` / ``logit_bias`` are recorded (a trained temperature is not in peft's adapter).
    """
    base = base if base is not None else base_from_source(backbone)
    if not is_lora_backbone(backbone):
        raise InputError(f"backbone {backbone.name} carries no LoRA adapter to save")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    _save_peft_files(backbone.model, folder)
    source: dict[str, Any]
    if base and base.get("checkpoint"):
        path = Path(base["checkpoint"]).resolve()
        source = {"checkpoint": str(path), "sha256": sha256_file(path)}
        if base.get("arch"):
            source["arch"] = str(base["arch"])
    elif base and base.get("backbone"):
        source = {"backbone": str(base["backbone"])}
        for key in ("sha256", "arch"):
            if base.get(key):
                source[key] = str(base[key])
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
        **temperature_values(backbone.model),
    }

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
    config. `pacs.metric.models.factory.load_adapter_backbone` finds and loads the base first.
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
            model = peft.PeftModel.from_pretrained(base.model, str(folder), autocast_adapter_dtype=False)
    except (pickle.UnpicklingError, EOFError) as error:  # adapter_model.bin that torch.load(weights_only=True) refused
        weights = folder / "adapter_model.bin"
        raise torch_load_error(weights if weights.is_file() else folder, error) from None
    except (RuntimeError, ValueError, KeyError) as error:
        raise InputError(f"{folder}: adapter does not fit base {base.name}: {str(error).splitlines()[0]}") from None
    model.eval()
    no_input_casting(model)
    setattr(model, BASE_FINGERPRINT_ATTR, base.fingerprint)
    changed = _restore_temperature(model, record, folder)
    adapter_file = folder / "adapter_model.safetensors"
    adapter_hash = sha256_file(adapter_file) if adapter_file.is_file() else ""
    identity = f"{base.fingerprint}+{adapter_hash}" + (f"+{json.dumps(changed, sort_keys=True)}" if changed else "")
    backbone = dataclasses.replace(base, model=model, family="pac-s++", family_source=SOURCE_METADATA,
                                   name=str(record.get("name") or base.name),
                                   fingerprint=hashlib.sha256(identity.encode()).hexdigest())
    if merge:
        merged = model.merge_and_unload()
        merged.eval()
        backbone = dataclasses.replace(backbone, model=merged)
    return backbone


def _restore_temperature(model: nn.Module, record: dict[str, Any], folder: Path) -> dict[str, list[float]]:
    """Copy the recorded ``logit_scale`` / ``logit_bias`` into `model`; return those that changed its values."""
    current = {name.rpartition(".")[2]: param for name, param in model.named_parameters()
               if name.rpartition(".")[2] in TEMPERATURE_PARAMETERS}
    changed: dict[str, list[float]] = {}
    for key in TEMPERATURE_PARAMETERS:
        if key not in record:
            continue
        values = record[key]
        param = current.get(key)
        if param is None:
            raise InputError(f"{folder / BASE_FILE}: records {key}, but the base model has no {key} parameter")
        if not isinstance(values, list) or len(values) != param.numel() or \
                not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise InputError(f"{folder / BASE_FILE}: {key} must be a list of {param.numel()} number(s), got {values!r}")
        tensor = torch.tensor(values, dtype=param.dtype).reshape(param.shape).to(param.device)
        if not torch.isfinite(tensor).all():
            raise InputError(f"{folder / BASE_FILE}: {key} is not finite: {values!r}")
        if not torch.equal(tensor, param.detach()):
            with torch.no_grad():
                param.copy_(tensor)
            changed[key] = [float(v) for v in values]
    return changed


def _normalise(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)
