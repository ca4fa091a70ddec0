"""The one way in for every model source: `load_backbone(backbone=..., checkpoint=..., arch=...)`.

It handles an open_clip `NAME[/PRETRAINED]`, a local open_clip checkpoint, an official PAC-S / PAC-S++ file
(`metric.models.official`), a pacs checkpoint written by `save_backbone`, a pacs peft adapter folder
(`metric.models.lora`), a `pacs export` folder (`metric.training.export`), open_clip SigLIP / SigLIP2 names and
``local-dir:`` folders (`metric.models.open_clip_local`) and transformers CLIP / SigLIP / Siglip2 folders
(`metric.models.transformers_backbone`). A folder is recognised by what it holds (docs/metric.md, "Backbone
families"). Sitting on top of those modules, it
keeps them free of import cycles.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from metric.common.device import resolve_device
from metric.common.errors import InputError, MissingResourceError
from metric.common.provenance import sha256_file
from metric.models.backbones import (
    EXPORT_CONFIG_FILE,
    EXPORT_WEIGHTS_FILE,
    Backbone,
    load_open_clip_backbone,
    load_pacs_safetensors,
    parse_backbone_spec,
)
from metric.models.families import check_declared_family
from metric.models.lora import BASE_FILE, apply_adapter, read_base_record
from metric.models.official import load_state_dict_checkpoint
from metric.models.open_clip_local import (
    LOCAL_DIR,
    has_hf_tokenizer,
    is_open_clip_folder,
    load_local_dir_backbone,
    load_named_hf_text_backbone,
)
from metric.models.transformers_backbone import (
    HF_CONFIG_FILE,
    MODEL_TYPES,
    folder_model_type,
    load_transformers_backbone,
)


def load_backbone(backbone: str | None = None, checkpoint: str | None = None, arch: str | None = None,
                  device: str = "cpu", lora_mode: str = "official", family: str | None = None) -> Backbone:
    """Load a backbone from any supported source (see the module docstring) onto `device` (`auto`: the process's).

    `arch` (a FILE or a preset name, `metric.models.families.ARCH_PRESETS`) overrides the architecture, activation and
    normalisation of a state-dict file; `family` (--family) declares the family where nothing else establishes
    it, and must agree with pacs metadata, LoRA keys or an official file name where they do.

    >>> import os, tempfile
    >>> from metric import load_backbone
    >>> from metric.models.backbones import save_backbone
    >>> tiny = load_backbone("tiny-random")  # a tiny random CLIP built in code; real: load_backbone("ViT-B-32/openai")
    >>> tiny.name, tiny.family
    ('tiny-random', 'clip')
    >>> path = save_backbone(tiny, os.path.join(tempfile.mkdtemp(), "tiny.safetensors"))
    >>> load_backbone(checkpoint=str(path)).fingerprint == tiny.fingerprint  # pacs' own format reloads exactly
    True
    >>> fixture = os.path.join(os.environ["PACS_SHARED"], "fixtures", "pacscore", "A")  # an official-format file
    >>> pacs = load_backbone(checkpoint=os.path.join(fixture, "PAC++_tiny_A.pth"),
    ...                      arch=os.path.join(fixture, "arch.json"))
    >>> pacs.family, pacs.family_source
    ('pac-s++', 'lora-keys')
    """
    if checkpoint is None and backbone is None:
        raise InputError("no model given: pass checkpoint= PATH or backbone= NAME[/PRETRAINED]",
                         parameter=("checkpoint", "backbone"))
    device = resolve_device(device)  # auto: the process's device (metric.common.device); an explicit one checked
    if checkpoint is None:
        if arch is not None:
            raise InputError("arch= applies to checkpoint= files only", parameter=("arch", "checkpoint"))
        return _load_named(backbone, device, family)
    path = Path(checkpoint)
    if not path.exists():
        raise MissingResourceError(f"checkpoint not found: {path}")
    if backbone is not None and path.is_file() and has_hf_tokenizer(parse_backbone_spec(backbone)[0]):
        return load_named_hf_text_backbone(backbone, device=device, family=family, checkpoint=str(path))
    if path.is_dir():
        return _load_folder(path, device, family, arch)
    if path.suffix == ".safetensors":
        loaded = load_pacs_safetensors(path, device, family)
        if loaded is not None:
            if arch is not None:
                raise InputError(f"{path} is a pacs checkpoint that carries its architecture: drop arch= {arch}",
                                 parameter="arch")
            return loaded
    return load_state_dict_checkpoint(path, backbone=backbone, arch=arch, device=device, lora_mode=lora_mode,
                                      family=family)


def _load_named(spec: str, device: str, family: str | None) -> Backbone:
    """`backbone=` alone: ``local-dir:FOLDER``, a name with a Hugging Face tokenizer (SigLIP), else open_clip CLIP."""
    if spec.startswith(LOCAL_DIR):
        return load_local_dir_backbone(spec[len(LOCAL_DIR):], device=device, family=family)
    if has_hf_tokenizer(parse_backbone_spec(spec)[0]):
        return load_named_hf_text_backbone(spec, device=device, family=family)
    return load_open_clip_backbone(spec, device=device, family=family)


def _load_folder(path: Path, device: str, family: str | None, arch: str | None) -> Backbone:
    """Dispatch a checkpoint folder on what it holds (never on its name); anything else is one InputError."""
    if (path / "pacs_base.json").is_file():
        adapter = load_adapter_backbone(str(path), device=device)
        check_declared_family(adapter.family, adapter.family_source, family, str(path))
        return adapter
    if (path / EXPORT_WEIGHTS_FILE).is_file():  # a `pacs export` folder: its weights are a pacs checkpoint
        loaded = load_pacs_safetensors(path / EXPORT_WEIGHTS_FILE, device, family)
        if loaded is not None:
            if arch is not None:
                raise InputError(f"{path} is a pacs export that carries its architecture: drop arch= {arch}",
                                 parameter="arch")
            return loaded
    if is_open_clip_folder(path):
        return load_local_dir_backbone(path, device=device, family=family)
    model_type = folder_model_type(path)
    if model_type is not None:
        return load_transformers_backbone(path, device=device, family=family)
    raise InputError(f"checkpoint {path} is a folder that holds no known backbone: expected {BASE_FILE} (a pacs "
                     f"adapter), {EXPORT_CONFIG_FILE} + {EXPORT_WEIGHTS_FILE} (a pacs export or open_clip local-dir "
                     f"folder) or {HF_CONFIG_FILE} with model_type {', '.join(MODEL_TYPES)} (a transformers folder)",
                     parameter="checkpoint")


def _load_base(folder: Path, record: dict[str, Any], device: str) -> Backbone:
    source = record["base"]
    arch = source.get("arch")
    if "checkpoint" in source:
        path = Path(source["checkpoint"])
        if not path.is_absolute():
            path = folder / path
        if not path.is_file():
            raise MissingResourceError(f"{folder / BASE_FILE}: base checkpoint {path} not found "
                                       "(pass base_backbone=, or checkpoint= of the base, to use a local copy)",
                                       parameter="checkpoint")
        expected = source.get("sha256")
        if expected and sha256_file(path) != expected:
            raise InputError(f"{folder / BASE_FILE}: base checkpoint {path} has sha256 {sha256_file(path)}, "
                             f"the adapter was trained on {expected}")
        return load_backbone(checkpoint=str(path), arch=arch, device=device)
    spec = str(source["backbone"])
    if spec.startswith(LOCAL_DIR) and not Path(spec[len(LOCAL_DIR):]).is_dir():
        raise MissingResourceError(f"{folder / BASE_FILE}: base folder {spec[len(LOCAL_DIR):]} not found (pass "
                                   "base_backbone= to use a copy of it elsewhere)", parameter="checkpoint")
    base = load_backbone(backbone=spec, arch=arch, device=device)
    expected = source.get("sha256")
    if expected and spec.startswith(LOCAL_DIR) and base.source.get("sha256") != expected:
        raise InputError(f"{folder / BASE_FILE}: the weights of base {spec} have sha256 {base.source.get('sha256')}, "
                         f"the adapter was trained on {expected}")
    return base


def load_adapter_backbone(folder: str | os.PathLike, base_backbone: Backbone | None = None, merge: bool = True,
                          device: str = "cpu") -> Backbone:
    """Load a pacs LoRA adapter folder onto its base; merged by default (same weights as the merged checkpoint).

    `base_backbone` replaces the base named in ``pacs_base.json``; it must be the same backbone (same open_clip
    config and, when recorded, the same fingerprint), otherwise an InputError names both.
    """
    folder = Path(folder)
    record = read_base_record(folder)
    base = base_backbone if base_backbone is not None else _load_base(folder, record, device)
    return apply_adapter(folder, base, record, base_given=base_backbone is not None, merge=merge)
