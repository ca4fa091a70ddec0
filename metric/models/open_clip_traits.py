"""The family traits of an open_clip model, read from the model itself; open_clip's HF tokenizer made to report truncation."""
from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from pacs.metric.common.errors import MissingResourceError
from pacs.metric.models.hf_tokenizer import HFTextTokenizer
from pacs.metric.models.pruned_forward import supports_pruned_image
from pacs.metric.models.tokenizer import ClipTokenizer
from pacs.metric.models.traits import CLIP_TRAITS, OPEN_CLIP_CLIP, OPEN_CLIP_SIGLIP, BackboneTraits

TOKENIZER_FILE = "tokenizer_config.json"
TOKENIZER_FILES_TEXT = f"{TOKENIZER_FILE} with spiece.model or tokenizer.json"


def wrap_open_clip_tokenizer(tokenizer: Any) -> Any:
    """open_clip's `HFTokenizer` wrapped to report truncation (`HFTextTokenizer`), its CLIP BPE as `ClipTokenizer`."""
    from open_clip.tokenizer import HFTokenizer, SimpleTokenizer


    if isinstance(tokenizer, HFTokenizer) and not getattr(tokenizer, "tokenizer_mode", ""):
        return HFTextTokenizer.from_open_clip(tokenizer)
    if type(tokenizer) is SimpleTokenizer:  # the CLIP BPE: pacs' OpenAI-spelled tokenizer, same context
        return ClipTokenizer(context_length=tokenizer.context_length or 77)
    return tokenizer


def has_tokenizer_files(folder: str | os.PathLike) -> bool:
    """True when `folder` holds a Hugging Face tokenizer (``tokenizer_config.json``, as ``save_pretrained`` writes)."""
    return (Path(folder) / TOKENIZER_FILE).is_file()


def hf_tokenizer_from_folder(folder: str | os.PathLike, text_cfg: Mapping[str, Any], what: str,
                             parameter: str = "backbone") -> Any:
    """open_clip's `HFTokenizer` over the tokenizer files of a local `folder`, wrapped (`wrap_open_clip_tokenizer`).

    The context length, ``tokenizer_mode`` and ``tokenizer_kwargs`` come from the model's `text_cfg`; a folder whose
    files do not load offline is one MissingResourceError naming it.
    """
    from open_clip.tokenizer import HFTokenizer

    try:
        tokenizer = HFTokenizer(str(folder), context_length=int(text_cfg.get("context_length", 77)),
                                tokenizer_mode=text_cfg.get("tokenizer_mode"), **text_cfg.get("tokenizer_kwargs", {}))
    except (OSError, ValueError) as error:
        raise MissingResourceError(f"{what}: cannot load the tokenizer {folder} offline ({str(error).splitlines()[0]});"
                                   f" put the tokenizer files ({TOKENIZER_FILES_TEXT}) next to the weights, or use "
                                   "local-dir:FOLDER", parameter=parameter) from None
    return wrap_open_clip_tokenizer(tokenizer)


def open_clip_traits(model: torch.nn.Module, config: Mapping[str, Any], tokenizer: Any) -> BackboneTraits:
    """The traits of an open_clip model, read from the model itself (logit bias, text pooling, visual pooling)."""
    if isinstance(tokenizer, ClipTokenizer) and getattr(model, "logit_bias", None) is None:
        return CLIP_TRAITS
    text_cfg = config.get("text_cfg", {})
    visual = getattr(model, "visual", None)
    image_pooling = ("attention (MAP)" if getattr(visual, "attn_pool", None) is not None
                     or (config.get("vision_cfg", {}).get("timm_pool") == "map") else "class token")
    return BackboneTraits(
        kind=OPEN_CLIP_SIGLIP if getattr(model, "logit_bias", None) is not None else OPEN_CLIP_CLIP,
        tokenizer=getattr(tokenizer, "description", type(tokenizer).__name__),
        text_pooling=str(text_cfg.get("pool_type", "argmax")) + (
            "" if text_cfg.get("no_causal_mask") else ", causal"),
        image_pooling=image_pooling, pad_id=int(getattr(tokenizer, "pad_id", 0)),
        trimmed_text=False, pruned_image=supports_pruned_image(model),
        sigmoid_loss=getattr(model, "logit_bias", None) is not None)
