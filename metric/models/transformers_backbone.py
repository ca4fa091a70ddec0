"""transformers folders as backbones: `config.json` with model_type clip, siglip or siglip2, loaded fully offline.

The folder is what `save_pretrained` writes for the model and its processor (`AutoModel`, `AutoProcessor`,
`local_files_only=True`). Nothing is re-implemented: text and image embeddings are the model's own
`get_text_features` / `get_image_features` (`.pooler_output` in transformers 5), the tokenizer and image processor
are the folder's own. Texts are padded to the full context (`max_position_embeddings`) with the tokenizer's pad
id and passed without attention mask (SigLIP was trained that way; for CLIP, causal and pooled at the EOS, the
mask changes nothing). The image processor is called directly (a Siglip2 *processor* call applies class
defaults over the saved image-processor settings).

Siglip2 (NaFlex) images are patch sequences with a mask and a spatial shape; `preprocess` packs them into one
tensor `[patches, 3·p·p + 3]` (patch values, then mask, then the spatial height and width in patches on every
row) so that images stack like any other pixels, and `encode_image` unpacks them (`pack_naflex`, `unpack_naflex`).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from pacs.metric.common.errors import InputError, MissingResourceError
from pacs.metric.common.json_input import read_json_file
from pacs.metric.common.provenance import sha256_file
from pacs.metric.models.backbones import Backbone, model_fingerprint
from pacs.metric.models.families import NOT_ESTABLISHED, SOURCE_USER, check_family_name
from pacs.metric.models.hf_tokenizer import HFTextTokenizer
from pacs.metric.models.loader_registry import LoadRequest
from pacs.metric.models.preprocess import to_eight_bit
from pacs.metric.models.traits import TRANSFORMERS_CLIP, TRANSFORMERS_SIGLIP, TRANSFORMERS_SIGLIP2, BackboneTraits

HF_CONFIG_FILE = "config.json"
MODEL_TYPES = {"clip": TRANSFORMERS_CLIP, "siglip": TRANSFORMERS_SIGLIP, "siglip2": TRANSFORMERS_SIGLIP2}


def folder_model_type(folder: Path) -> str | None:
    """The `model_type` of a transformers folder's config.json (None without one)."""
    path = folder / HF_CONFIG_FILE
    if not path.is_file():
        return None
    data = read_json_file(path, "transformers config")
    model_type = data.get("model_type") if isinstance(data, dict) else None
    if not isinstance(model_type, str):
        raise InputError(f"{path}: no 'model_type' (expected a transformers config with model_type "
                         f"{', '.join(MODEL_TYPES)})")
    return model_type


def pack_naflex(pixel_values: torch.Tensor, mask: torch.Tensor, spatial: torch.Tensor) -> torch.Tensor:
    """One image `[P, D]` + mask `[P]` + spatial shape `[2]` -> `[P, D + 3]` (see the module docstring)."""
    rows = pixel_values.shape[0]
    extra = torch.stack([mask.float(), spatial[0].float().expand(rows), spatial[1].float().expand(rows)], dim=1)
    return torch.cat([pixel_values.float(), extra], dim=1)


def unpack_naflex(packed: torch.Tensor) -> dict[str, torch.Tensor]:
    """`[B, P, D + 3]` -> the Siglip2 keyword arguments `pixel_values`, `pixel_attention_mask`, `spatial_shapes`."""
    return {"pixel_values": packed[..., :-3], "pixel_attention_mask": packed[..., -3].round().long(),
            "spatial_shapes": packed[:, 0, -2:].round().long()}


class TransformersDualEncoder(torch.nn.Module):
    """A transformers CLIP / SigLIP / Siglip2 model behind pacs' `encode_text` / `encode_image`."""

    def __init__(self, model: torch.nn.Module, kind: str) -> None:
        super().__init__()
        self.hf = model
        self.kind = kind

    @property
    def logit_scale(self) -> torch.Tensor:
        """The model's log similarity scale (as open_clip stores it)."""
        return self.hf.logit_scale

    @property
    def logit_bias(self) -> torch.Tensor | None:
        """The sigmoid-loss bias (SigLIP, Siglip2), None for CLIP."""
        return getattr(self.hf, "logit_bias", None)

    def encode_text(self, tokens: torch.Tensor) -> torch.Tensor:
        """Unnormalised text embeddings: `get_text_features(input_ids=tokens).pooler_output`."""
        return self.hf.get_text_features(input_ids=tokens).pooler_output

    def image_inputs(self, pixels: torch.Tensor) -> dict[str, torch.Tensor]:
        """The keyword arguments of the vision tower for preprocessed `pixels`."""
        return unpack_naflex(pixels) if self.kind == TRANSFORMERS_SIGLIP2 else {"pixel_values": pixels}

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        """Unnormalised image embeddings: `get_image_features(...).pooler_output`."""
        return self.hf.get_image_features(**self.image_inputs(pixels)).pooler_output


class TransformersImagePreprocess:
    """PIL image -> the folder's image processor output for one image (Siglip2: packed, see `pack_naflex`)."""

    def __init__(self, image_processor: Any, kind: str) -> None:
        self.image_processor = image_processor
        self.kind = kind

    def config(self) -> dict[str, Any]:
        """The image processor's settings (fingerprint, provenance)."""
        return json.loads(self.image_processor.to_json_string())

    def __call__(self, image: Image.Image) -> torch.Tensor:
        """Preprocess one PIL image (16-bit grayscale scaled to 8 bits, then RGB, then the image processor)."""
        image = to_eight_bit(image)
        if image.mode != "RGB":
            image = image.convert("RGB")
        out = self.image_processor(images=[image], return_tensors="pt")
        if self.kind == TRANSFORMERS_SIGLIP2:
            return pack_naflex(out["pixel_values"][0], out["pixel_attention_mask"][0], out["spatial_shapes"][0])
        return out["pixel_values"][0].float()


def _traits(kind: str, tokenizer: HFTextTokenizer) -> BackboneTraits:
    siglip = kind != TRANSFORMERS_CLIP
    return BackboneTraits(
        kind=kind, tokenizer=f"{type(tokenizer.tokenizer).__name__} (folder, padding side "
                             f"{tokenizer.tokenizer.padding_side})",
        text_pooling="last position, no causal mask" if siglip else "first EOS, causal",
        image_pooling="attention (MAP head)" if siglip else "class token",
        pad_id=tokenizer.pad_id, trimmed_text=False, pruned_image=False, sigmoid_loss=siglip)


def _fingerprint_config(config: Any) -> dict[str, Any]:
    data = config.to_dict()
    return {key: value for key, value in data.items() if not key.startswith("_") and key != "transformers_version"}


def load_transformers_backbone(folder: str | os.PathLike, device: str = "cpu", family: str | None = None) -> Backbone:
    """Load a transformers CLIP / SigLIP / Siglip2 folder (model + processor) offline as a `Backbone`."""
    from transformers import AutoModel, AutoProcessor

    folder = Path(folder)
    model_type = folder_model_type(folder)
    if model_type not in MODEL_TYPES:
        raise InputError(f"{folder}: transformers model_type {model_type!r} is not supported (supported: "
                         f"{', '.join(MODEL_TYPES)})", parameter="checkpoint")
    kind = MODEL_TYPES[model_type]
    try:
        model = AutoModel.from_pretrained(str(folder), local_files_only=True, dtype=torch.float32)
        processor = AutoProcessor.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as error:
        raise MissingResourceError(f"{folder}: cannot load the transformers model and processor offline: "
                                   f"{str(error).splitlines()[0]}", parameter="checkpoint") from None
    image_processor = getattr(processor, "image_processor", None)
    tokenizer = getattr(processor, "tokenizer", None)
    if image_processor is None or tokenizer is None:
        raise InputError(f"{folder}: the processor lacks its {'image processor' if tokenizer else 'tokenizer'} "
                         "(save the model's processor with save_pretrained into the folder)", parameter="checkpoint")
    context_length = int(model.config.text_config.max_position_embeddings)
    text_tokenizer = HFTextTokenizer(tokenizer, context_length, description=type(tokenizer).__name__)
    preprocess = TransformersImagePreprocess(image_processor, kind)
    wrapper = TransformersDualEncoder(model, kind).float().eval().requires_grad_(False)
    config = {"transformers": _fingerprint_config(model.config)}
    fingerprint = model_fingerprint(wrapper, config, preprocess)
    try:
        wrapper = wrapper.to(device)
    except (RuntimeError, AssertionError) as error:
        raise InputError(f"cannot move the model to device {device!r}: {error}") from None
    user_family = check_family_name(family)
    own_family, own_source = (user_family, SOURCE_USER) if user_family else (None, NOT_ESTABLISHED)
    weights = folder / "model.safetensors"

    source = {"kind": "transformers", "path": str(folder), "model_type": model_type,
              "sha256": sha256_file(weights) if weights.is_file() else None, "family_source": own_source}
    return Backbone(model=wrapper, preprocess=preprocess, tokenize=text_tokenizer, name=str(folder),
                    fingerprint=fingerprint, family=own_family, open_clip_config={}, context_length=context_length,
                    source=source, family_source=own_source, traits=_traits(kind, text_tokenizer))


class TransformersLoader:
    """Loader of transformers CLIP / SigLIP / Siglip2 folders (`pacs.metric.models.loader_registry`).

    Takes a checkpoint folder with a `config.json` (after the open_clip loaders); a config.json without
    `model_type` is an InputError, an unsupported model_type one at build.
    """

    name = "transformers"

    def detect(self, request: LoadRequest) -> bool:
        """A checkpoint folder holding a transformers `config.json`."""
        folder = request.checkpoint
        return folder is not None and folder.is_dir() and folder_model_type(folder) is not None

    def build(self, request: LoadRequest, device: str) -> Backbone:
        """Model, tokenizer and image processor of the folder."""
        return load_transformers_backbone(request.checkpoint, device=device, family=request.family)
