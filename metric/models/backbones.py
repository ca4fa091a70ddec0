"""Dual encoders built through open_clip: by name (+ pretrained tag or file), from a config dict, from files.

The `Backbone` record, open_clip model construction and assembly (`assemble_backbone`) and pacs' own checkpoint
format (`save_backbone`; its reader is `pacs.metric.models.pacs_checkpoint`). Each family's loader builds on this module
(`pacs.metric.models.open_clip_clip`, `open_clip_siglip`, `transformers_backbone`, `official`); the one way in for every
source, `load_backbone`, is the factory on top (`pacs.metric.models.factory`), which none of them import.
"""
from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import open_clip
import torch
from open_clip.model import CLIP, CustomTextCLIP

from pacs.metric.common.errors import InputError
from pacs.metric.common.io import atomic_path
from pacs.metric.models.families import (
    FAMILIES,
    NOT_ESTABLISHED,
    SOURCE_BUILT,
)
from pacs.metric.models.open_clip_traits import (
    open_clip_traits,
    wrap_open_clip_tokenizer,
)
from pacs.metric.models.preprocess import ImagePreprocess
from pacs.metric.models.pruned_forward import (
    encode_image_pruned,
    encode_text_pruned,
    supports_pruned_image,
    supports_pruned_text,
)
from pacs.metric.models.tokenizer import ClipTokenizer, TokenizedBatch
from pacs.metric.models.traits import CLIP_TRAITS, BackboneTraits

logger = logging.getLogger(__name__)

PACS_FORMAT = "open_clip"
# A `pacs export` folder (open_clip's local-dir / hf-hub file names; see pacs.metric.training.export).
EXPORT_CONFIG_FILE = "open_clip_config.json"
EXPORT_WEIGHTS_FILE = "open_clip_model.safetensors"


@dataclass
class Backbone:
    """A dual encoder (eval mode, fp32) with its preprocessing, tokenizer, identity and family traits.

    `family` is None when nothing established it (see `pacs.metric.models.families`); `family_source` says how it was
    established ("pacs-metadata", "lora-keys", "official-name:<file>", "user --family", ...). `traits`
    (`pacs.metric.models.traits.BackboneTraits`) is what the model family declares: tokenizer, pooling, pad id and
    which fast paths are valid; `family_kind` names the family (``open_clip-clip``, ``open_clip-siglip``,
    ``transformers-clip``, ``transformers-siglip``, ``transformers-siglip2``).
    """

    model: torch.nn.Module
    preprocess: Callable[[Any], torch.Tensor]
    tokenize: Callable[..., torch.Tensor]
    name: str
    fingerprint: str
    family: str | None = "clip"
    open_clip_config: dict = field(default_factory=dict)
    context_length: int = 77
    source: dict = field(default_factory=dict)
    family_source: str = SOURCE_BUILT
    traits: BackboneTraits = CLIP_TRAITS

    @property
    def device(self) -> torch.device:
        """The device holding the model's parameters."""
        return next(self.model.parameters()).device

    @property
    def family_kind(self) -> str:
        """The model family (`pacs.metric.models.traits.FAMILY_KINDS`), e.g. ``open_clip-clip``."""
        return self.traits.kind

    @property
    def logit_scale(self) -> float:
        """The model's similarity scale, exponentiated (CLIP ~100 when trained; SigLIP ~ 10-120)."""
        value = getattr(self.model, "logit_scale", None)
        if value is None:
            raise InputError(f"backbone {self.name} has no logit_scale")
        return float(torch.as_tensor(value).detach().float().exp().reshape(-1)[0])

    @property
    def logit_bias(self) -> float | None:
        """The model's sigmoid-loss bias (SigLIP, SigLIP2), None for models trained with InfoNCE (CLIP)."""
        value = getattr(self.model, "logit_bias", None)
        if value is None:
            return None
        return float(torch.as_tensor(value).detach().float().reshape(-1)[0])

    @property
    def supports_trimmed_text(self) -> bool:
        """True when trailing padding may be cut and the prompt prefix reused (open_clip's causal CLIP text tower)."""
        return (self.traits.trimmed_text and supports_pruned_text(self.model)
                and isinstance(self.tokenize, ClipTokenizer))

    def tokenize_batch(self, texts: list[str]) -> TokenizedBatch:
        """Tokenize texts into id lists with per-text truncation flags (every family).

        CLIP: SOT + BPE + EOT, unpadded (the scorer pads). Other families: each row padded to the full context
        with the tokenizer's pad id (`pacs.metric.models.hf_tokenizer`).
        """
        encode = getattr(self.tokenize, "encode", None)
        if callable(encode):
            return encode(texts)
        tokens = self.tokenize(texts)  # a tokenizer without truncation report: refuse to say "not truncated"
        raise InputError(f"backbone {self.name}: its tokenizer {type(self.tokenize).__name__} cannot report "
                         f"truncation ({len(tokens)} texts)")

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """Unnormalised image embeddings of preprocessed pixels (class-token-only last block where valid)."""
        if self.traits.pruned_image and supports_pruned_image(self.model):
            return encode_image_pruned(self.model, pixels)
        return self.model.encode_image(pixels)

    def encode_text(self, tokens: torch.Tensor, prefix_length: int = 0,
                    prefix_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> torch.Tensor:
        """Unnormalised text embeddings of ids `[N, L]` with L <= context length.

        Causal CLIP (`supports_trimmed_text`): pooled at the first EOT (argmax of the ids), so the padding after
        the longest sequence never influences any output: running at length L is exactly the 77-token result.
        `prefix_kv` (from `pacs.metric.models.pruned_forward.prefix_states`) holds the per-layer keys/values of the first
        `prefix_length` ids, shared by every row, which are then not recomputed. Other families: shorter rows
        are padded on the right to the full context with the family's pad id and run through the model's own
        forward (their ids from `tokenize_batch` already have the full length).
        """
        length = tokens.shape[1]
        if not self.supports_trimmed_text:
            if length != self.context_length:
                tokens = torch.nn.functional.pad(tokens, (0, self.context_length - length), value=self.traits.pad_id)
            return self.model.encode_text(tokens)
        return encode_text_pruned(self.model, tokens, prefix_length if prefix_kv else 0, prefix_kv)


def tiny_clip_config(**overrides: Any) -> dict:
    """An open_clip model config for a tiny ViT CLIP (built in code, for tests); keys are deep-merged."""
    config: dict[str, Any] = {
        "embed_dim": 32,
        "quick_gelu": True,
        "vision_cfg": {"image_size": 64, "layers": 2, "width": 64, "head_width": 32, "patch_size": 16,
                       "mlp_ratio": 2.0},
        "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2,
                     "mlp_ratio": 2.0},
    }
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(config.get(key), Mapping):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return config


def state_dict_fingerprint(state_dict: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> str:
    """sha256 over the model config (JSON) and every tensor's name, dtype, shape and bytes (sorted by name)."""
    digest = hashlib.sha256()
    digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    for key in sorted(state_dict):
        tensor = state_dict[key].detach().to("cpu").contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def model_fingerprint(model: torch.nn.Module, config: Mapping[str, Any], preprocess: Any = None) -> str:
    """Fingerprint of a model's weights + architecture (+ preprocessing settings when given)."""
    full = {key: value for key, value in config.items() if key != "preprocess_cfg"}
    if preprocess is not None and hasattr(preprocess, "config"):
        full["_preprocess"] = preprocess.config()
    return state_dict_fingerprint(model.state_dict(), full)


def model_class_for_config(config: Mapping[str, Any]) -> type:
    """open_clip's model class for a config dict (CLIP, or CustomTextCLIP for custom/HF text towers)."""
    text_cfg = config.get("text_cfg", {})
    if config.get("custom_text") or "hf_model_name" in text_cfg:
        return CustomTextCLIP
    return CLIP


def instantiate_open_clip(config: Mapping[str, Any]) -> torch.nn.Module:
    """Instantiate an open_clip model (random weights, fp32) from a model config dict."""
    kwargs = copy.deepcopy(dict(config))
    kwargs.pop("custom_text", None)
    kwargs.pop("preprocess_cfg", None)
    model_class = model_class_for_config(config)
    try:
        return model_class(**kwargs)
    except TypeError as error:
        raise InputError(f"invalid open_clip model config: {error}") from None


def _default_tokenizer(config: Mapping[str, Any], name: str) -> Callable[..., torch.Tensor]:
    text_cfg = config.get("text_cfg", {})
    context_length = int(text_cfg.get("context_length", 77))
    if text_cfg.get("hf_tokenizer_name") or text_cfg.get("hf_model_name"):
        return wrap_open_clip_tokenizer(open_clip.get_tokenizer(name, context_length=context_length))
    return ClipTokenizer(context_length=context_length)


def assemble_backbone(model: torch.nn.Module, config: Mapping[str, Any], preprocess: ImagePreprocess | None = None,
                      name: str = "custom", family: str | None = "clip", source: Mapping[str, Any] | None = None,
                      device: str = "cpu", tokenizer: Callable[..., torch.Tensor] | None = None,
                      family_source: str = SOURCE_BUILT) -> Backbone:
    """Wrap a model into a `Backbone` (fp32, eval mode, on `device`) with its preprocessing and tokenizer."""
    if family is not None and family not in FAMILIES:
        raise InputError(f"unknown backbone family {family!r} (known: {', '.join(FAMILIES)})")
    config = copy.deepcopy(dict(config))
    model = model.float().eval().requires_grad_(False)
    if preprocess is None:
        preprocess = ImagePreprocess.from_open_clip_cfg(
            {"size": config.get("vision_cfg", {}).get("image_size", 224), **config.get("preprocess_cfg", {})})
    config.pop("preprocess_cfg", None)
    fingerprint = model_fingerprint(model, config, preprocess)
    try:
        model = model.to(device)
    except (RuntimeError, AssertionError) as error:
        raise InputError(f"cannot move the model to device {device!r}: {error}") from None
    tokenizer = wrap_open_clip_tokenizer(tokenizer) if tokenizer is not None else _default_tokenizer(config, name)
    return Backbone(
        model=model,
        preprocess=preprocess,
        tokenize=tokenizer,
        name=name,
        fingerprint=fingerprint,
        family=family,
        open_clip_config=config,
        context_length=int(config.get("text_cfg", {}).get("context_length", 77)),
        source=dict(source or {}),
        family_source=family_source if family is not None else NOT_ESTABLISHED,
        traits=open_clip_traits(model, config, tokenizer),
    )


def build_backbone_from_config(config: dict, seed: int = 0, quick_gelu: bool = True, name: str = "custom",
                               family: str = "clip", device: str = "cpu") -> Backbone:
    """Build a randomly initialised backbone from an open_clip model config (seeded, no download)."""
    config = copy.deepcopy(config)
    config["quick_gelu"] = bool(config.get("quick_gelu", False) or quick_gelu)
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = instantiate_open_clip(config)
    finally:
        torch.random.set_rng_state(generator_state)
    return assemble_backbone(model, config, name=name, family=family, device=device,
                             source={"kind": "random", "seed": seed})


def parse_backbone_spec(spec: str) -> tuple[str, str | None]:
    """Split `NAME[/PRETRAINED]`; `hf-hub:org/repo` and `local-dir:PATH` are names on their own."""
    if spec.startswith(("hf-hub:", "local-dir:")):
        return spec, None
    name, _, pretrained = spec.partition("/")
    return name, (pretrained or None)


def open_clip_name_config(name: str) -> dict:
    """A copy of open_clip's built-in model config for `name`; InputError for an unknown name."""
    config = open_clip.get_model_config(name)
    if config is None:
        known = ", ".join(open_clip.list_models()[:20])
        raise InputError(f"unknown open_clip model {name!r} (e.g. {known}, ...; see open_clip.list_models())")
    return copy.deepcopy(config)


def save_backbone(backbone: Backbone, path: str | os.PathLike) -> Path:
    """Write the backbone as one `.safetensors` file (open_clip state dict + metadata), atomically."""
    from safetensors.torch import save_file

    path = Path(path)
    if not {"embed_dim", "vision_cfg", "text_cfg"} <= set(backbone.open_clip_config):
        raise InputError(f"cannot save {backbone.name}: its open_clip config is not a full model config")
    state = {key: tensor.detach().to("cpu").contiguous()
             for key, tensor in backbone.model.state_dict().items()}
    config = dict(backbone.open_clip_config)
    if hasattr(backbone.preprocess, "config"):
        config["preprocess_cfg"] = backbone.preprocess.config()
    metadata = {"pacs_format": PACS_FORMAT, "open_clip_config": json.dumps(config), "family": backbone.family or "",
                "name": backbone.name}
    with atomic_path(path) as tmp:
        save_file(state, str(tmp), metadata=metadata)
    return path


def load_state_strict(model: torch.nn.Module, state: Mapping[str, torch.Tensor], path: Path | str) -> None:
    """Load `state` (cast to fp32) with exactly matching keys and shapes; InputError naming the keys otherwise."""
    expected = model.state_dict()
    unexpected = sorted(set(state) - set(expected))
    missing = sorted(set(expected) - set(state))
    if unexpected or missing:
        parts = []
        if unexpected:
            parts.append(f"unexpected keys {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}")
        if missing:
            parts.append(f"missing keys {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        raise InputError(f"{path}: state dict does not match the architecture: {'; '.join(parts)}")
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise InputError(f"{path}: key {key!r} has shape {tuple(tensor.shape)}, the architecture expects "
                             f"{tuple(expected[key].shape)} (check arch=)", parameter="arch")
    model.load_state_dict({key: tensor.float() for key, tensor in state.items()}, strict=True)
