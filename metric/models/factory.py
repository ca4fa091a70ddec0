"""The one way in for every model source: `load_backbone(backbone=..., checkpoint=..., arch=...)`.

Each backbone family is one loader (`pacs.metric.models.loader_registry`: `detect(request)`, `build(request, device)`)
and `FAMILY_LOADERS` lists them in the order they are asked: a pacs LoRA adapter folder (`AdapterLoader`, here: it
loads its base through `load_backbone`), a pacs checkpoint or `pacs export` folder (`pacs.metric.models.pacs_checkpoint`),
open_clip SigLIP / SigLIP2 (`pacs.metric.models.open_clip_siglip`), open_clip CLIP names and ``local-dir:`` folders
(`pacs.metric.models.open_clip_clip`), transformers CLIP / SigLIP / Siglip2 folders
(`pacs.metric.models.transformers_backbone`) and state-dict files such as the official PAC-S / PAC-S++ ones
(`pacs.metric.models.official`). A folder is recognised by what it holds (docs/metric.md, "Backbone families").
Sitting on top of those modules, it keeps them free of import cycles.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pacs.metric.common.device import resolve_device
from pacs.metric.common.errors import InputError, MissingResourceError
from pacs.metric.common.file_kinds import refuse_special
from pacs.metric.common.provenance import sha256_file
from pacs.metric.models.backbones import (
    EXPORT_CONFIG_FILE,
    EXPORT_WEIGHTS_FILE,
    Backbone,
)
from pacs.metric.models.families import check_declared_family
from pacs.metric.models.loader_registry import FamilyLoader, LoadRequest, select_loader
from pacs.metric.models.lora import BASE_FILE, apply_adapter, read_base_record
from pacs.metric.models.official import OfficialStateDictLoader
from pacs.metric.models.open_clip_clip import OpenClipClipLoader
from pacs.metric.models.open_clip_local import LOCAL_DIR
from pacs.metric.models.open_clip_siglip import OpenClipSiglipLoader
from pacs.metric.models.pacs_checkpoint import PacsCheckpointLoader
from pacs.metric.models.transformers_backbone import HF_CONFIG_FILE, MODEL_TYPES, TransformersLoader


def load_backbone(backbone: str | None = None, checkpoint: str | None = None, arch: str | None = None,
                  device: str = "cpu", lora_mode: str = "official", family: str | None = None) -> Backbone:
    """Load a backbone from any supported source (see the module docstring) onto `device` (`auto`: the process's).

    `arch` (a FILE or a preset name, `pacs.metric.models.families.ARCH_PRESETS`) overrides the architecture, activation and
    normalisation of a state-dict file; `family` (--family) declares the family where nothing else establishes
    it, and must agree with pacs metadata, LoRA keys or an official file name where they do.

    >>> import os, tempfile
    >>> from pacs.metric import load_backbone
    >>> from pacs.metric.models.backbones import save_backbone
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
    device = resolve_device(device)  # auto: the process's device (pacs.metric.common.device); an explicit one checked
    if checkpoint is None and arch is not None:
        raise InputError("arch= applies to checkpoint= files only", parameter=("arch", "checkpoint"))
    path = Path(checkpoint) if checkpoint is not None else None
    if path is not None and not path.exists():
        raise MissingResourceError(f"checkpoint not found: {path}")
    if path is not None:  # a FIFO would block the loader forever, a device never ends
        refuse_special(path, "checkpoint", parameter="checkpoint")
    if arch is not None:
        refuse_special(arch, "arch", parameter="arch")
    request = LoadRequest(backbone=backbone, checkpoint=path, arch=arch, lora_mode=lora_mode, family=family)
    loader = select_loader(request, FAMILY_LOADERS)
    if loader is None:  # only a folder is left unclaimed: the last loader takes every file, the CLIP one every name
        raise InputError(f"checkpoint {path} is a folder that holds no known backbone: expected {BASE_FILE} (a pacs "
                         f"adapter), {EXPORT_CONFIG_FILE} + {EXPORT_WEIGHTS_FILE} (a pacs export or open_clip "
                         f"local-dir folder) or {HF_CONFIG_FILE} with model_type {', '.join(MODEL_TYPES)} (a "
                         "transformers folder)", parameter="checkpoint")
    return loader.build(request, device)


class AdapterLoader:
    """Loader of pacs LoRA adapter folders (``pacs_base.json``): the base through `load_backbone`, then the adapter."""

    name = "pacs-adapter"

    def detect(self, request: LoadRequest) -> bool:
        """A checkpoint folder holding ``pacs_base.json``."""
        return request.checkpoint is not None and (request.checkpoint / BASE_FILE).is_file()

    def build(self, request: LoadRequest, device: str) -> Backbone:
        """The merged adapter backbone; --family must agree with the adapter's family."""
        adapter = load_adapter_backbone(str(request.checkpoint), device=device)
        check_declared_family(adapter.family, adapter.family_source, request.family, str(request.checkpoint))
        return adapter


# The backbone families in the order they are asked (first `detect` wins): see the module docstring.
FAMILY_LOADERS: tuple[FamilyLoader, ...] = (AdapterLoader(), PacsCheckpointLoader(), OpenClipSiglipLoader(),
                                            OpenClipClipLoader(), TransformersLoader(), OfficialStateDictLoader())


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
