"""The one way in for every model source: `load_backbone(backbone=..., checkpoint=..., arch=...)`.

It handles an open_clip `NAME[/PRETRAINED]`, a local open_clip checkpoint, an official PAC-S / PAC-S++ file
(`metric.models.official`), a pacs checkpoint written by `save_backbone`, a pacs peft adapter folder
(`metric.models.lora`) and a `pacs export` folder (`metric.training.export`). Sitting on top of those modules, it
keeps them free of import cycles.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from metric.common.errors import InputError, MissingResourceError
from metric.common.provenance import sha256_file
from metric.models.backbones import (
    EXPORT_WEIGHTS_FILE,
    Backbone,
    load_open_clip_backbone,
    load_pacs_safetensors,
)
from metric.models.families import check_declared_family
from metric.models.lora import BASE_FILE, apply_adapter, read_base_record
from metric.models.official import load_state_dict_checkpoint


def load_backbone(backbone: str | None = None, checkpoint: str | None = None, arch: str | None = None,
                  device: str = "cpu", lora_mode: str = "official", family: str | None = None) -> Backbone:
    """Load a backbone from any supported source (see the module docstring).

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
    if checkpoint is None:
        if arch is not None:
            raise InputError("arch= applies to checkpoint= files only", parameter=("arch", "checkpoint"))
        return load_open_clip_backbone(backbone, device=device, family=family)
    path = Path(checkpoint)
    if not path.exists():
        raise MissingResourceError(f"checkpoint not found: {path}")
    if path.is_dir():
        if (path / "pacs_base.json").is_file():
            adapter = load_adapter_backbone(str(path), device=device)
            check_declared_family(adapter.family, adapter.family_source, family, str(path))
            return adapter
        if (path / EXPORT_WEIGHTS_FILE).is_file():  # a `pacs export` folder: its weights are a pacs checkpoint
            path = path / EXPORT_WEIGHTS_FILE
        else:
            raise InputError(f"checkpoint {path} is a folder without pacs_base.json or {EXPORT_WEIGHTS_FILE} "
                             "(not a pacs adapter or export folder)")
    if path.suffix == ".safetensors":
        loaded = load_pacs_safetensors(path, device, family)
        if loaded is not None:
            if arch is not None:
                raise InputError(f"{path} is a pacs checkpoint that carries its architecture: drop arch= {arch}",
                                 parameter="arch")
            return loaded
    return load_state_dict_checkpoint(path, backbone=backbone, arch=arch, device=device, lora_mode=lora_mode,
                                      family=family)


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
    return load_backbone(backbone=source["backbone"], arch=arch, device=device)


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
