"""Export a PAC-S / PAC-S++ model that pacs trained: the official checkpoint layout, or a self-describing folder.

Two formats (`EXPORT_FORMATS`):

- ``official``: a ``torch.save``d ``{"state_dict": ...}`` in the layout of the official PAC-S / PAC-S++ files
  (OpenAI CLIP key names; PAC-S++ adds LoRA tensors of rank 4, see ``docs/official_format.md``).
  The official inference path applies only the ``visual.conv1`` and attention LoRA deltas and uses the stored MLP
  weights as they are, so every trained delta is merged into the base weights and the LoRA tensors are written
  as zeros: whichever deltas the official code applies (or a fresh model merges), it adds zero.
  The architecture must be one the official code builds (heads = width // 64, MLP ratio 4, QuickGELU + OpenAI
  normalisation for PAC-S++, ...); otherwise export refuses and names every difference. Allowed anyway
  (``allow_nonstandard_arch``), or with a normalisation no ``--arch`` preset has, the export also writes
  ``<name>.arch.json`` next to the file (open_clip ``model_cfg`` + ``preprocess_cfg``), what ``--arch`` needs.
- ``folder``: ``open_clip_model.safetensors`` (pacs' own checkpoint format: the open_clip state dict with its
  config in the header), ``open_clip_config.json`` (open_clip's ``model_cfg`` + ``preprocess_cfg``, and a
  ``pacs`` section: family, metric, w, fingerprint, provenance) and a model card ``README.md``.
  ``load_backbone(checkpoint=FOLDER)`` reloads it bit-identically; ``open_clip.create_model("local-dir:FOLDER")``
  reads the same weights. A model with a Hugging Face tokenizer (SigLIP / SigLIP2: ``text_cfg.hf_tokenizer_name``)
  also gets its tokenizer files (``save_pretrained``), so the folder is a complete open_clip ``local-dir``
  (``open_clip.get_tokenizer("local-dir:FOLDER")`` and ``load_backbone(backbone="local-dir:FOLDER")`` work offline).

Writes are atomic: the file or folder appears complete under its name, or not at all.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from pacs.metric.common.errors import InputError, MissingResourceError
from pacs.metric.common.io import atomic_path, chmod_like_umask, write_json_atomic, write_text_atomic
from pacs.metric.common.provenance import provenance, sha256_file
from pacs.metric.models.backbones import (
    EXPORT_CONFIG_FILE,
    EXPORT_WEIGHTS_FILE,
    PACS_FORMAT,
    Backbone,
    model_fingerprint,
    save_backbone,
)
from pacs.metric.models.factory import load_backbone
from pacs.metric.models.families import ARCH_PRESETS, SOURCE_METADATA
from pacs.metric.models.lora import BASE_FILE
from pacs.metric.scoring.registry import default_w

logger = logging.getLogger(__name__)

EXPORT_FORMATS = ("folder", "official")
OFFICIAL_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
OFFICIAL_LORA_RANK = 4  # the official PAC-S++ code builds its model with lora=4 and loads strictly
TRAINED_FAMILIES = ("pac-s", "pac-s++")
CARD_FILE = "README.md"
OFFICIAL_TOKENIZER = {"context_length": 77, "vocab_size": 49408}
# open_clip config keys the official model has an equivalent for; any other key changes the computation.
_OFFICIAL_CONFIG_KEYS = {
    "": {"embed_dim", "quick_gelu", "vision_cfg", "text_cfg"},
    "vision_cfg": {"image_size", "layers", "width", "head_width", "patch_size", "mlp_ratio"},
    "text_cfg": {"context_length", "vocab_size", "width", "heads", "layers", "mlp_ratio"},
}


@dataclasses.dataclass(frozen=True)
class ExportResult:
    """What `export_model` wrote: where, in which format, and how to load it back."""

    path: Path
    format: str
    family: str
    fingerprint: str
    n_tensors: int
    load_hint: str


def _is_pacs_safetensors(path: Path) -> bool:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            return (handle.metadata() or {}).get("pacs_format") == PACS_FORMAT
    except (SafetensorError, OSError):  # not a safetensors file
        return False


def load_trained_model(checkpoint: str | os.PathLike, device: str = "cpu") -> Backbone:
    """Load a PAC-S / PAC-S++ model written by pacs (checkpoint.safetensors, adapter folder, export folder).

    Anything else (an official or open_clip file, a CLIP model, a file of unknown family) is an InputError.
    """
    path = Path(checkpoint)
    if not path.exists():
        raise MissingResourceError(f"model to export not found: {path}")
    weights = path / EXPORT_WEIGHTS_FILE if path.is_dir() else path
    pacs_written = (path / BASE_FILE).is_file() if path.is_dir() else False
    pacs_written = pacs_written or (weights.suffix == ".safetensors" and weights.is_file()
                                    and _is_pacs_safetensors(weights))
    if not pacs_written:
        raise InputError(f"{path}: not a model pacs trained: export takes the checkpoint.safetensors or adapter/ "
                         f"folder that `pacs train-metric` writes (or a folder `pacs export` wrote)")
    backbone = load_backbone(checkpoint=str(path), device=device)
    if backbone.family not in TRAINED_FAMILIES or backbone.family_source != SOURCE_METADATA:
        raise InputError(f"{path}: a {backbone.family or 'family-less'} model ({backbone.family_source}), not a "
                         f"PAC-S / PAC-S++ model pacs trained; nothing to export")
    return backbone


def official_key_shapes(config: Mapping[str, Any], lora_rank: int | None) -> dict[str, tuple[int, ...]]:
    """Every key of an official checkpoint for an open_clip ViT config, with its shape (docs/official_format.md §3).

    `lora_rank` adds the PAC-S++ LoRA tensors (None: a PAC-S / OpenAI CLIP file).
    """
    vision, text = config["vision_cfg"], config["text_cfg"]
    dv, dt, embed, patch = int(vision["width"]), int(text["width"]), int(config["embed_dim"]), int(vision["patch_size"])
    grid = int(vision["image_size"]) // patch
    shapes: dict[str, tuple[int, ...]] = {
        "visual.conv1.weight": (dv, 3, patch, patch), "visual.class_embedding": (dv,),
        "visual.positional_embedding": (grid * grid + 1, dv),
        "visual.ln_pre.weight": (dv,), "visual.ln_pre.bias": (dv,),
    }
    if lora_rank:
        shapes["visual.conv1.lora_A"] = (lora_rank * patch, 3 * patch)
        shapes["visual.conv1.lora_B"] = (dv * patch, lora_rank * patch)
    for prefix, width, layers in (("visual.", dv, vision["layers"]), ("", dt, text["layers"])):
        if not prefix:
            shapes["token_embedding.weight"] = (int(text["vocab_size"]), dt)
            shapes["positional_embedding"] = (int(text["context_length"]), dt)
        for index in range(int(layers)):
            block = f"{prefix}transformer.resblocks.{index}."
            linear = {"attn.out_proj": (width, width), "mlp.c_fc": (4 * width, width), "mlp.c_proj": (width, 4 * width)}
            shapes.update({f"{block}ln_1.weight": (width,), f"{block}ln_1.bias": (width,),
                           f"{block}attn.in_proj_weight": (3 * width, width),
                           f"{block}attn.in_proj_bias": (3 * width,)})
            for name, (rows, cols) in linear.items():
                shapes[f"{block}{name}.weight"] = (rows, cols)
                shapes[f"{block}{name}.bias"] = (rows,)
            shapes.update({f"{block}ln_2.weight": (width,), f"{block}ln_2.bias": (width,)})
            if lora_rank:
                shapes[f"{block}attn.in_proj_weight_lora_A"] = (lora_rank, width)
                shapes[f"{block}attn.in_proj_weight_lora_B"] = (3 * width, lora_rank)
                for name, (rows, cols) in linear.items():
                    shapes[f"{block}{name}.lora_A"] = (lora_rank, cols)
                    shapes[f"{block}{name}.lora_B"] = (rows, lora_rank)
        if prefix:
            shapes.update({"visual.ln_post.weight": (dv,), "visual.ln_post.bias": (dv,), "visual.proj": (dv, embed)})
    shapes.update({"ln_final.weight": (dt,), "ln_final.bias": (dt,), "text_projection": (dt, embed), "logit_scale": ()})
    return shapes


def _official_preset(backbone: Backbone) -> str | None:
    config, preprocess = backbone.open_clip_config, getattr(backbone.preprocess, "config", dict)()
    for preset in ARCH_PRESETS.values():
        if (bool(config.get("quick_gelu", False)) == preset.quick_gelu
                and [round(v, 8) for v in preprocess.get("mean", ())] == [round(v, 8) for v in preset.mean]
                and [round(v, 8) for v in preprocess.get("std", ())] == [round(v, 8) for v in preset.std]):
            return preset.name
    return None


def official_differences(backbone: Backbone) -> list[str]:
    """What the official PAC-S / PAC-S++ code would build or compute differently from `backbone` (empty: none)."""
    config = backbone.open_clip_config
    problems: list[str] = []
    for section, allowed in _OFFICIAL_CONFIG_KEYS.items():
        values = config.get(section, {}) if section else config
        extra = sorted(set(values) - allowed)
        if extra:
            names = ", ".join(f"{section or 'model'}.{key}" for key in extra)
            problems.append(f"open_clip options with no official equivalent: {names}")
    vision, text = config.get("vision_cfg", {}), config.get("text_cfg", {})
    if int(vision.get("head_width", 64)) != 64:
        problems.append(f"vision heads of width {vision.get('head_width')} (the official code uses width // 64 heads)")
    if int(text.get("heads", 8)) != int(text.get("width", 512)) // 64:
        problems.append(f"{text.get('heads', 8)} text heads for width {text.get('width', 512)} (the official code "
                        f"uses width // 64 = {int(text.get('width', 512)) // 64})")
    for name, tower in (("vision", vision), ("text", text)):
        if float(tower.get("mlp_ratio", 4.0)) != 4.0:
            problems.append(f"{name} MLP ratio {tower.get('mlp_ratio')} (the official code builds 4)")
    for key, value in OFFICIAL_TOKENIZER.items():
        if int(text.get(key, value)) != value:
            problems.append(f"text {key} {text.get(key)} (the official tokenizer has {value})")
    preset = _official_preset(backbone)
    if backbone.family == "pac-s++" and preset != "openai":
        problems.append("PAC-S++ needs QuickGELU and the OpenAI mean/std (the official clip_lora model)")
    elif preset is None:
        problems.append("activation + normalisation match no official preset "
                        f"({'; '.join(f'{p.name}: {p.description}' for p in ARCH_PRESETS.values())})")
    preprocess = getattr(backbone.preprocess, "config", dict)()
    resize = (preprocess.get("interpolation", "bicubic"), preprocess.get("resize_mode", "shortest"))
    if resize != ("bicubic", "shortest"):
        problems.append(f"image preprocessing {preprocess.get('interpolation')}/{preprocess.get('resize_mode')} "
                        "(the official one resizes the shorter side, bicubic, then centre-crops)")
    if not problems:
        expected = official_key_shapes(config, None)
        state = backbone.model.state_dict()
        wrong = sorted(k for k in set(expected) | set(state)
                       if k not in state or k not in expected or tuple(state[k].shape) != expected[k])
        if wrong:
            problems.append(f"state dict differs from the official layout at {wrong[:5]}")
    return problems


def official_state_dict(backbone: Backbone, dtype: str = "fp32",
                        allow_nonstandard_arch: bool = False) -> tuple[dict[str, torch.Tensor], str | None]:
    """The official-layout state dict of a merged pacs model (zero LoRA tensors for PAC-S++) and its preset."""
    if dtype not in OFFICIAL_DTYPES:
        raise InputError(f"unknown export dtype {dtype!r} (known: {', '.join(OFFICIAL_DTYPES)})")
    vision = backbone.open_clip_config.get("vision_cfg", {})
    if "patch_size" not in vision or not isinstance(vision.get("layers"), int) or "text_cfg" not in \
            backbone.open_clip_config:
        raise InputError(f"{backbone.name}: the official checkpoint layout holds ViT CLIP models only "
                         f"(this vision tower: {json.dumps(vision, sort_keys=True)})")
    problems = official_differences(backbone)
    if problems and not allow_nonstandard_arch:
        raise InputError(f"{backbone.name}: the official PAC-S code cannot reproduce this model: "
                         f"{'; '.join(problems)} (allow_nonstandard_arch= writes it anyway)",
                         parameter="allow_nonstandard_arch")
    for problem in problems:
        logger.warning("official export of %s: %s", backbone.name, problem)
    torch_dtype = OFFICIAL_DTYPES[dtype]
    state = {key: tensor.detach().to("cpu", torch.float32).to(torch_dtype).contiguous()
             for key, tensor in backbone.model.state_dict().items()}
    rank = OFFICIAL_LORA_RANK if backbone.family == "pac-s++" else None
    ordered: dict[str, torch.Tensor] = {}
    for key, shape in official_key_shapes(backbone.open_clip_config, rank).items():
        if key in state:
            ordered[key] = state.pop(key)
        elif "lora_" in key:  # every delta is merged into the weights: zero LoRA tensors
            ordered[key] = torch.zeros(shape, dtype=torch_dtype)
    ordered.update(state)  # only with allow_nonstandard_arch: keys the official layout has no place for
    return ordered, _official_preset(backbone)


@contextlib.contextmanager
def _atomic_folder(target: Path, overwrite: bool) -> Iterator[Path]:
    """Yield an empty temporary folder next to `target`; move it onto `target` only if the block succeeds."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    old: Path | None = None
    try:
        yield tmp
        chmod_like_umask(tmp)
        if target.exists() or target.is_symlink():
            if not overwrite:
                raise InputError(f"{target} exists (pass overwrite= to replace it)", parameter="overwrite")
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".old", dir=target.parent))
            os.replace(target, old / target.name)
            try:
                os.replace(tmp, target)
            except OSError:
                os.replace(old / target.name, target)  # put the old output back
                raise
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _training_record(checkpoint: Path) -> dict[str, Any]:
    """Provenance of the `pacs train-metric` run the checkpoint came from (its train_log.json), when present."""
    run = checkpoint.parent
    log = run / "train_log.json"
    if not log.is_file():
        return {}
    try:
        data = json.loads(log.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return {key: data[key] for key in ("best_step", "steps", "best_val_total", "provenance") if key in data}


def _input_sha256(path: Path) -> str:
    if path.is_dir():
        for name in ("adapter_model.safetensors", EXPORT_WEIGHTS_FILE):
            if (path / name).is_file():
                return sha256_file(path / name)
        return ""
    return sha256_file(path)


def has_hf_tokenizer(backbone: Backbone) -> bool:
    """True for an open_clip model whose text tower reads a Hugging Face tokenizer (SigLIP, SigLIP2)."""
    return bool(backbone.open_clip_config.get("text_cfg", {}).get("hf_tokenizer_name"))


def save_tokenizer_files(backbone: Backbone, folder: Path) -> list[str]:
    """Write the Hugging Face tokenizer of `backbone` into `folder` (open_clip's local-dir layout); the file names.

    Only for a model with ``text_cfg.hf_tokenizer_name`` (SigLIP / SigLIP2); CLIP's BPE ships with open_clip.
    """
    if not has_hf_tokenizer(backbone):
        return []
    hf_tokenizer = getattr(backbone.tokenize, "tokenizer", None)
    if not hasattr(hf_tokenizer, "save_pretrained"):
        raise InputError(f"{backbone.name}: its text tower reads the Hugging Face tokenizer "
                         f"{backbone.open_clip_config['text_cfg']['hf_tokenizer_name']}, but the loaded tokenizer "
                         f"({type(backbone.tokenize).__name__}) cannot be saved with the export")
    return sorted({Path(name).name for name in hf_tokenizer.save_pretrained(str(folder))})


def model_card(backbone: Backbone, pacs_section: Mapping[str, Any]) -> str:
    """The folder's README.md: what the model is, how to load and score with it, where it came from."""
    vision, text = backbone.open_clip_config["vision_cfg"], backbone.open_clip_config["text_cfg"]
    family, metric, w = pacs_section["family"], pacs_section["metric"], pacs_section["w"]
    source = pacs_section["provenance"]["exported_from"]
    training = pacs_section["provenance"].get("training") or {}
    config = backbone.open_clip_config
    siglip = "init_logit_bias" in config
    if has_hf_tokenizer(backbone):
        tokenizer_note = (f"the tokenizer files in this folder ({text.get('hf_tokenizer_name')}), texts padded to the "
                          f"full context of {text.get('context_length')}")
    else:
        tokenizer_note = 'the OpenAI CLIP tokenizer, and prefix captions with "A photo depicts "'
    lines = [
        "---", "library_name: open_clip", "tags:", "- pacs", f"- {family}", "- siglip" if siglip else "- clip",
        "- image-captioning-evaluation", "---", "",
        f"# {backbone.name} ({family.upper()})", "",
        (f"A {family} captioning metric trained with pacs, exported by `pacs export`. Score with `{metric}` "
         f"(reference-free) or `ref-{metric}`, w = {w}: score = w·max(cos(image, caption), 0)."), "",
        "| | |", "|---|---|",
        (f"| vision tower | ViT, patch {vision.get('patch_size')}, {vision.get('image_size')} px, "
         f"width {vision.get('width')}, {vision.get('layers')} layers |"),
        (f"| text tower | width {text.get('width')}, {text.get('layers')} layers, heads {text.get('heads')}, "
         f"context {text.get('context_length')} |"),
        f"| embedding | {config.get('embed_dim')} |",
        f"| activation | {'QuickGELU' if config.get('quick_gelu') else 'GELU'} |",
        *(["| trained with | SigLIP's sigmoid loss (scale and bias of the model: sigmoid(scale·cos + bias)) |"]
          if siglip else []),
        f"| fingerprint | `{pacs_section['fingerprint']}` |",
        f"| exported from | `{source['path']}` (sha256 `{source['sha256']}`) |",
    ]
    if training:
        lines.append(f"| training | best step {training.get('best_step')} of {training.get('steps')}, "
                     f"validation loss {training.get('best_val_total')} |")
    lines += [
        "", "## Use", "", "```bash",
        f"pacs score --metric {metric} --checkpoint THIS_FOLDER --images DIR --candidates captions.json", "```", "",
        "```python", "from pacs.metric import load_backbone", "from pacs.metric import Scorer", "",
        'backbone = load_backbone(checkpoint="THIS_FOLDER")  # bit-identical to the trained model',
        f'print(Scorer(backbone, w={w}).score(["image.jpg"], ["a dog runs on the grass"]).scores)', "```", "",
        ('open_clip reads the same weights: `open_clip.create_model("local-dir:THIS_FOLDER")` (tokenize with '
         f"{tokenizer_note} to reproduce pacs' scores)."), "",
        ("Files: `open_clip_model.safetensors` (weights, pacs metadata in the header), `open_clip_config.json` "
         "(open_clip `model_cfg` + `preprocess_cfg`; its `pacs` section holds family, metric, w and provenance)."),
        "",
    ]
    return "\n".join(lines)


def export_folder(backbone: Backbone, out: Path, overwrite: bool = False, w: float | None = None,
                  provenance_fields: Mapping[str, Any] | None = None) -> ExportResult:
    """Write `backbone` as a folder (safetensors + open_clip_config.json + README.md), atomically."""
    metric = backbone.family or "pac-s++"
    w = float(w) if w is not None else default_w(metric, backbone)
    fingerprint = model_fingerprint(backbone.model, backbone.open_clip_config, backbone.preprocess)
    config = {key: value for key, value in backbone.open_clip_config.items() if key != "preprocess_cfg"}
    pacs_section = {"format": "pacs-export-folder", "family": backbone.family, "metric": metric, "w": w,
                    "name": backbone.name, "fingerprint": fingerprint,
                    "provenance": provenance(**dict(provenance_fields or {}))}
    with _atomic_folder(out, overwrite) as tmp:
        save_backbone(backbone, tmp / EXPORT_WEIGHTS_FILE)
        write_json_atomic(tmp / EXPORT_CONFIG_FILE, {"model_cfg": config,
                                                     "preprocess_cfg": backbone.preprocess.config(),
                                                     "pacs": pacs_section})
        write_text_atomic(tmp / CARD_FILE, model_card(backbone, pacs_section))
        save_tokenizer_files(backbone, tmp)
    return ExportResult(path=out, format="folder", family=str(backbone.family), fingerprint=fingerprint,
                        n_tensors=len(backbone.model.state_dict()), load_hint=f"--checkpoint {out}")


def official_arch_file(out: Path) -> Path:
    """The architecture file `export_official` writes next to `out` when no `--arch` preset rebuilds the model."""
    return out.with_name(f"{out.stem}.arch.json")


def export_official(backbone: Backbone, out: Path, overwrite: bool = False, dtype: str = "fp32",
                    allow_nonstandard_arch: bool = False) -> ExportResult:
    """Write `backbone` as an official PAC-S / PAC-S++ checkpoint (`{"state_dict": ...}`), atomically."""
    if out.is_dir():
        raise InputError(f"{out} is a folder; the official format is one file (e.g. {out / 'model.pth'})")
    arch_file = official_arch_file(out)
    for target in (out, arch_file):
        if target.exists() and not overwrite:
            raise InputError(f"{target} exists (pass overwrite= to replace it)", parameter="overwrite")
    state, preset = official_state_dict(backbone, dtype=dtype, allow_nonstandard_arch=allow_nonstandard_arch)
    if official_differences(backbone) or preset is None:  # no preset rebuilds it: its own architecture file
        config = {key: value for key, value in backbone.open_clip_config.items() if key != "preprocess_cfg"}
        write_json_atomic(arch_file, {"model_cfg": config, "preprocess_cfg": backbone.preprocess.config()})
        preset = str(arch_file)
    with atomic_path(out) as tmp:
        torch.save({"state_dict": state}, str(tmp))
    hint = f"--checkpoint {out} --arch {preset}"
    return ExportResult(path=out, format="official", family=str(backbone.family),
                        fingerprint=sha256_file(out), n_tensors=len(state), load_hint=hint)


def export_model(checkpoint: str | os.PathLike, out: str | os.PathLike, fmt: str = "folder", overwrite: bool = False,
                 dtype: str = "fp32", w: float | None = None, allow_nonstandard_arch: bool = False,
                 device: str = "cpu") -> ExportResult:
    """Export a pacs-trained PAC-S / PAC-S++ model (`checkpoint`) to `out` in format `fmt` (`EXPORT_FORMATS`)."""
    if fmt not in EXPORT_FORMATS:
        raise InputError(f"unknown export format {fmt!r} (known: {', '.join(EXPORT_FORMATS)})")
    if dtype not in OFFICIAL_DTYPES:
        raise InputError(f"unknown export dtype {dtype!r} (known: {', '.join(OFFICIAL_DTYPES)})")
    if fmt == "folder" and dtype != "fp32":
        raise InputError(f"dtype= {dtype} applies to fmt= official only (the folder keeps fp32 weights)",
                         parameter=("dtype", "fmt"))
    out, source = Path(out), Path(checkpoint)
    if out.exists() and not overwrite:
        raise InputError(f"{out} exists (pass overwrite= to replace it)", parameter="overwrite")
    backbone = load_trained_model(source, device=device)
    if fmt == "official":
        result = export_official(backbone, out, overwrite=overwrite, dtype=dtype,
                                 allow_nonstandard_arch=allow_nonstandard_arch)
    else:
        fields = {"exported_from": {"path": str(source.resolve()), "sha256": _input_sha256(source),
                                    "fingerprint": backbone.fingerprint},
                  "training": _training_record(source)}
        result = export_folder(backbone, out, overwrite=overwrite, w=w, provenance_fields=fields)
    logger.info("exported %s (%s) to %s as %s", source, backbone.family, out, fmt)
    return result
