"""Import state-dict checkpoints in the OpenAI CLIP key layout: official PAC-S / PAC-S++ files, open_clip files.

Rules (see docs/official_format.md):
- the file is a `torch.save`d dict; the state dict is its `state_dict` entry (or the dict itself); a common
  `module.` prefix is stripped; tensors are cast to fp32;
- the architecture is inferred from the shapes with the official `build_model` rules (heads = width // 64 for
  both towers), unless `--arch FILE` (an open_clip model config, a fixture's `arch.json` with
  `open_clip_equivalent`, or `{"model_cfg", "preprocess_cfg"}`) or `--backbone NAME` says otherwise;
- activation and normalisation are never guessed from a name prefix: they come from `--arch` (a FILE, or a
  preset `openai` / `openclip-laion` on the inferred architecture), `--backbone NAME[/TAG]`, an exact official
  file name (`pacs.metric.models.families.OFFICIAL_CHECKPOINTS`) or an architecture with a single official variant
  (ViT-B/32: OpenAI); otherwise loading refuses and names `--arch`;
- the family comes from LoRA keys (PAC-S++), an exact official file name or `--family`, else it is not
  established (`Backbone.family` None) — see `pacs.metric.models.families`;
- PAC-S++ LoRA tensors are merged in fp32 with scaling alpha / r = 1 / r exactly as the official inference
  path applies them: `visual.conv1` (B·A reshaped row-major to the conv kernel) and the attention in/out
  projections (fused q, k, v) are applied, the MLP LoRA tensors are ignored (`lora_mode="official"`).
  `lora_mode="all"` also merges the MLP deltas (the official "fresh model, then load" variant) and
  `lora_mode="none"` ignores every delta.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import open_clip
import torch

from pacs.metric.common.errors import InputError, MissingResourceError
from pacs.metric.common.json_input import read_json_file
from pacs.metric.common.provenance import sha256_file
from pacs.metric.models.backbones import (
    Backbone,
    assemble_backbone,
    instantiate_open_clip,
    load_state_strict,
    open_clip_name_config,
    parse_backbone_spec,
)
from pacs.metric.models.families import (
    ARCH_PRESETS,
    LORA_MODES,
    OFFICIAL_CHECKPOINTS,
    ArchPreset,
    arch_preset,
    architecture_name,
    establish_family,
    official_checkpoint,
    single_variant_preset,
)
from pacs.metric.models.loader_registry import LoadRequest
from pacs.metric.models.preprocess import OPENAI_MEAN, OPENAI_STD, ImagePreprocess
from pacs.metric.models.weights_only import quiet_pickle_protocol_warning, torch_load_error

logger = logging.getLogger(__name__)

LORA_ALPHA = 1.0  # not stored in the files: the official constructor default
OPENAI_VIT_REQUIRED_KEYS = (
    "visual.conv1.weight", "visual.class_embedding", "visual.positional_embedding", "visual.proj",
    "token_embedding.weight", "positional_embedding", "ln_final.weight", "text_projection",
)
# Non-parameter entries that OpenAI state dicts may carry (open_clip drops them too).
IGNORED_KEYS = ("input_resolution", "context_length", "vocab_size", "attn_mask")
_LORA_KEY = re.compile(r"^(?P<base>.+?)(?:\.lora_(?P<ab>[AB])|_lora_(?P<ab2>[AB]))$")
# LoRA targets applied by the official inference path, and those stored but ignored there.
_APPLIED_TARGETS = (re.compile(r"^visual\.conv1\.weight$"), re.compile(r"\.attn\.in_proj_weight$"),
                    re.compile(r"\.attn\.out_proj\.weight$"))
_MLP_TARGETS = (re.compile(r"\.mlp\.c_fc\.weight$"), re.compile(r"\.mlp\.c_proj\.weight$"))


def read_torch_checkpoint(path: Path) -> dict[str, torch.Tensor]:
    """Read a torch-saved checkpoint safely (weights_only) and return its state dict (prefix-stripped)."""
    try:
        with quiet_pickle_protocol_warning():
            data = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - torch.load raises many types for corrupt / unsafe files
        raise torch_load_error(path, error) from None
    state = data
    if isinstance(data, Mapping) and "state_dict" in data and isinstance(data["state_dict"], Mapping):
        state = data["state_dict"]
    if not isinstance(state, Mapping) or not state:
        kind = f"keys {sorted(map(str, data))[:8]}" if isinstance(data, Mapping) else type(data).__name__
        raise InputError(f"{path}: no state dict found (top level: {kind})")
    non_tensors = [str(key) for key, value in state.items()
                   if not isinstance(value, torch.Tensor) and key not in IGNORED_KEYS]
    if non_tensors:
        raise InputError(f"{path}: state dict entries that are not tensors: {non_tensors[:5]}")
    state = {str(key): value for key, value in state.items() if isinstance(value, torch.Tensor)}
    if all(key.startswith("module.") for key in state):
        state = {key[len("module."):]: value for key, value in state.items()}
    for key in IGNORED_KEYS:
        state.pop(key, None)
    return state


def split_lora(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
    """Separate base tensors from LoRA pairs; LoRA pairs are keyed by the base weight they modify."""
    base: dict[str, torch.Tensor] = {}
    lora: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in state.items():
        match = _LORA_KEY.match(key)
        if match is None:
            base[key] = tensor
            continue
        target = match.group("base")
        if match.group("ab") is not None:  # `<module>.lora_A` -> `<module>.weight`
            target = f"{target}.weight"
        lora.setdefault(target, {})[match.group("ab") or match.group("ab2")] = tensor
    for target, pair in lora.items():
        if set(pair) != {"A", "B"}:
            missing = "B" if "A" in pair else "A"
            raise InputError(f"LoRA tensor for {target!r} has no lora_{missing} partner")
        if target not in base:
            raise InputError(f"LoRA tensors for {target!r} match no weight in the checkpoint")
    return base, lora


def check_known_layout(state: Mapping[str, torch.Tensor], path: Path | str) -> None:
    """Raise InputError naming the keys when the state dict is not an OpenAI-layout ViT CLIP."""
    missing = [key for key in OPENAI_VIT_REQUIRED_KEYS if key not in state]
    if missing:
        sample = sorted(state)[:6]
        raise InputError(
            f"{path}: keys match no known layout (OpenAI/open_clip ViT CLIP, official PAC-S, PAC-S++): "
            f"missing {missing[:4]}; the file has keys like {sample}")


def infer_openai_config(state: Mapping[str, torch.Tensor], path: Path | str) -> dict[str, Any]:
    """The official `build_model` rules: every hyper-parameter from shapes, heads = width // 64, QuickGELU."""
    conv = state["visual.conv1.weight"]
    vision_width, patch = int(conv.shape[0]), int(conv.shape[-1])
    grid = round((state["visual.positional_embedding"].shape[0] - 1) ** 0.5)
    vision_layers = len([k for k in state if k.startswith("visual.") and k.endswith(".attn.in_proj_weight")])
    text_width = int(state["ln_final.weight"].shape[0])
    text_layers = len({k.split(".")[2] for k in state if k.startswith("transformer.resblocks.")})
    if vision_width < 64 or text_width < 64:
        raise InputError(f"{path}: width {min(vision_width, text_width)} < 64, so heads = width // 64 is 0: "
                         f"give the head counts with arch=FILE", parameter="arch")

    def mlp_ratio(prefix: str, width: int) -> float:
        key = f"{prefix}transformer.resblocks.0.mlp.c_fc.weight"
        return float(state[key].shape[0]) / width if key in state else 4.0

    return {
        "embed_dim": int(state["text_projection"].shape[1]),
        "quick_gelu": True,
        "vision_cfg": {"image_size": int(grid * patch), "layers": vision_layers, "width": vision_width,
                       "head_width": 64, "patch_size": patch, "mlp_ratio": mlp_ratio("visual.", vision_width)},
        "text_cfg": {"context_length": int(state["positional_embedding"].shape[0]),
                     "vocab_size": int(state["token_embedding.weight"].shape[0]), "width": text_width,
                     "heads": text_width // 64, "layers": text_layers, "mlp_ratio": mlp_ratio("", text_width)},
    }


def read_arch_file(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read `--arch FILE`: returns (open_clip model config, preprocess overrides)."""
    path = Path(path)
    if not path.is_file():
        raise MissingResourceError(f"arch= file not found: {path} (nor a preset: {', '.join(ARCH_PRESETS)})",
                                   parameter="arch")
    data = read_json_file(path, "architecture")
    if not isinstance(data, dict):
        raise InputError(f"{path}: an architecture file must hold a JSON object")
    preprocess: dict[str, Any] = {}
    if "open_clip_equivalent" in data:
        config = data["open_clip_equivalent"]
    elif "model_cfg" in data:
        config, preprocess = data["model_cfg"], dict(data.get("preprocess_cfg") or {})
    else:
        config = data
    if not isinstance(config, dict) or not {"embed_dim", "vision_cfg", "text_cfg"} <= set(config):
        raise InputError(f"{path}: not an open_clip model config (needs embed_dim, vision_cfg, text_cfg), nor an "
                         f"arch.json with 'open_clip_equivalent', nor {{'model_cfg': ...}}")
    config = dict(config)
    preprocess.update(config.pop("preprocess_cfg", None) or {})
    return config, preprocess


def merge_lora(base: dict[str, torch.Tensor], lora: Mapping[str, Mapping[str, torch.Tensor]],
               mode: str = "official", alpha: float = LORA_ALPHA) -> dict[str, torch.Tensor]:
    """Add LoRA deltas (fp32) to the base weights, following the official inference path (see module doc)."""
    if mode not in LORA_MODES:
        raise InputError(f"unknown LoRA mode {mode!r} (known: {', '.join(LORA_MODES)})")
    merged = {key: tensor.float() for key, tensor in base.items()}
    ignored: list[str] = []
    for target, pair in sorted(lora.items()):
        applied = any(p.search(target) for p in _APPLIED_TARGETS)
        mlp = any(p.search(target) for p in _MLP_TARGETS)
        if not applied and not mlp:
            raise InputError(f"LoRA tensors on {target!r}: not a layer the official PAC-S++ model adapts")
        if mode == "none" or (mlp and mode == "official"):
            ignored.append(target)
            continue
        lora_a, lora_b = pair["A"].float(), pair["B"].float()
        weight = merged[target]
        if target == "visual.conv1.weight":
            patch = weight.shape[-1]
            rank = lora_a.shape[0] // patch
            delta = (lora_b @ lora_a).reshape(weight.shape)  # loralib ConvLoRA: flat buffer reinterpreted
        else:
            rank = lora_a.shape[0]
            delta = lora_b @ lora_a
            if delta.shape != weight.shape:
                raise InputError(f"LoRA delta for {target!r} has shape {tuple(delta.shape)}, weight has "
                                 f"{tuple(weight.shape)}")
        merged[target] = weight + (alpha / rank) * delta
    if ignored:
        logger.info("LoRA tensors stored but not applied (lora_mode=%s): %d layers, e.g. %s",
                    mode, len(ignored), ignored[0])
    return merged


def _unestablished_activation(path: Path, architecture: str | None) -> InputError:
    if architecture:
        variants = sorted({e.preset for e in OFFICIAL_CHECKPOINTS.values() if e.architecture == architecture})
        what = f"its architecture {architecture} has more than one official variant ({', '.join(variants)})"
    else:
        what = "its architecture is none of the official ones"
    return InputError(
        f"{path}: its activation and image normalisation are not established: {path.name!r} is not an official "
        f"file name ({', '.join(OFFICIAL_CHECKPOINTS)}) and {what}. Pass arch=openai "
        f"({ARCH_PRESETS['openai'].description}), arch=openclip-laion ({ARCH_PRESETS['openclip-laion'].description})"
        f" or arch=FILE", parameter="arch")


def _apply_preset(config: dict[str, Any], preset: ArchPreset) -> dict[str, Any]:
    """Set the preset's activation on `config`; return its preprocessing overrides."""
    config["quick_gelu"] = preset.quick_gelu
    return {"mean": preset.mean, "std": preset.std}


def resolve_architecture(base: Mapping[str, torch.Tensor], path: Path, backbone: str | None = None,
                         arch: str | None = None) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(open_clip config, preprocess overrides, how they were established) of an OpenAI-layout state dict.

    Order: `--arch FILE`, `--arch PRESET`, `--backbone NAME[/TAG]`, exact official file name, an architecture
    with a single official variant; anything else raises an InputError naming `--arch`.
    """
    preset = arch_preset(arch) if arch is not None and not Path(arch).is_file() else None
    if preset is not None:
        config = infer_openai_config(base, path)
        return config, _apply_preset(config, preset), f"--arch {preset.name} (shapes + {preset.description})"
    if arch is not None:
        config, overrides = read_arch_file(arch)
        return config, overrides, f"--arch {arch}"
    if backbone is not None:
        name, tag = parse_backbone_spec(backbone)
        config = open_clip_name_config(name)
        source = f"open_clip config {name}"
        overrides: dict[str, Any] = {}
        tag_cfg = open_clip.get_pretrained_cfg(name, tag) if tag else {}
        if tag_cfg:  # the tag's preprocessing and activation, without downloading its weights
            overrides = {key: tag_cfg[key] for key in ("mean", "std", "interpolation", "resize_mode") if key in tag_cfg}
            config["quick_gelu"] = bool(tag_cfg.get("quick_gelu", config.get("quick_gelu", False)))
            source += f" + pretrained tag {tag} (preprocessing, activation)"
        return config, overrides, source
    config = infer_openai_config(base, path)
    architecture = architecture_name(config)
    official = official_checkpoint(path.name)
    if official is not None:
        if architecture != official.architecture:
            raise InputError(f"{path}: named like the official {official.file} ({official.architecture}) but its "
                             f"tensors are {architecture or 'not an official architecture'}: rename it and pass "
                             f"arch= (and family=)", parameter=("arch", "family"))
        preset = ARCH_PRESETS[official.preset]
        return config, _apply_preset(config, preset), f"official file name {official.file} ({preset.description})"
    preset = single_variant_preset(architecture)
    if preset is None:
        raise _unestablished_activation(path, architecture)
    return (config, _apply_preset(config, preset),
            f"architecture {architecture}, whose official files are all {preset.name} ({preset.description})")


def load_state_dict_checkpoint(path: str | Path, backbone: str | None = None, arch: str | None = None,
                               device: str = "cpu", lora_mode: str = "official", family: str | None = None) -> Backbone:
    """Load an OpenAI-layout state dict (official PAC-S / PAC-S++, OpenAI, open_clip) into an open_clip model.

    `family` is the user's `--family`; it must agree with the LoRA keys or an official file name when present.
    """
    path = Path(path)
    state = read_torch_checkpoint(path)
    base, lora = split_lora(state)
    check_known_layout(base, path)
    family, family_source = establish_family(path.name, bool(lora), family)
    config, preprocess_overrides, source_of_config = resolve_architecture(base, path, backbone, arch)
    merged = merge_lora(base, lora, mode=lora_mode)
    model = instantiate_open_clip(config)
    load_state_strict(model, merged, path)
    size = int(config["vision_cfg"].get("image_size", 224))
    preprocess = ImagePreprocess.from_open_clip_cfg(
        {"size": size, "mean": OPENAI_MEAN, "std": OPENAI_STD, **preprocess_overrides})
    source = {"kind": "state_dict", "path": str(path), "sha256": sha256_file(path), "config_from": source_of_config,
              "family_source": family_source, "lora_layers": len(lora), "lora_mode": lora_mode if lora else None}
    logger.info("loaded %s (family %s: %s; %d LoRA pairs; architecture %s)", path.name, family or "unknown",
                family_source, len(lora), source_of_config)
    return assemble_backbone(model, config, preprocess=preprocess, name=path.name, family=family,
                             family_source=family_source, source=source, device=device)


class OfficialStateDictLoader:
    """Loader of state-dict files in the OpenAI CLIP key layout (`pacs.metric.models.loader_registry`); the last one.

    Takes every checkpoint *file* the loaders before it left: official PAC-S / PAC-S++ files, OpenAI and open_clip
    state dicts (``backbone=`` and ``arch=`` establish the architecture, see `resolve_architecture`).
    """

    name = "official-state-dict"

    def detect(self, request: LoadRequest) -> bool:
        """A checkpoint that is not a folder."""
        return request.checkpoint is not None and not request.checkpoint.is_dir()

    def build(self, request: LoadRequest, device: str) -> Backbone:
        """The open_clip model of the state dict (LoRA deltas merged per `request.lora_mode`)."""
        return load_state_dict_checkpoint(request.checkpoint, backbone=request.backbone, arch=request.arch,
                                          device=device, lora_mode=request.lora_mode, family=request.family)
