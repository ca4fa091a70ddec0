"""What a backbone family declares: tokenizer, preprocessing, pooling, context, calibration and valid fast paths.

Every `Backbone` holds one `BackboneTraits` (`backbone.traits`); `backbone.family_kind` is its `kind`:

- ``open_clip-clip``: open_clip `CLIP` with the OpenAI BPE, causal text tower pooled at the EOT (argmax);
  trailing padding may be cut and the prompt prefix reused (`pacs.metric.models.pruned_forward`); no logit bias.
- ``open_clip-siglip``: open_clip SigLIP / SigLIP2 (`CustomTextCLIP`, text without causal mask pooled at the
  **last** position, sigmoid loss with a logit bias); texts are padded to the full context with the tokenizer's
  pad id, no trimming, no prefix reuse.
- ``transformers-clip`` / ``transformers-siglip`` / ``transformers-siglip2``: a transformers folder
  (`config.json` model_type clip / siglip / siglip2) run through the model's own `get_text_features` /
  `get_image_features`; texts padded to the full context with the folder's tokenizer.

A family's *metric* family (`Backbone.family`: clip, pac-s, pac-s++) is a separate question (`pacs.metric.models.families`).
"""
from __future__ import annotations

from dataclasses import dataclass

OPEN_CLIP_CLIP = "open_clip-clip"
OPEN_CLIP_SIGLIP = "open_clip-siglip"
TRANSFORMERS_CLIP = "transformers-clip"
TRANSFORMERS_SIGLIP = "transformers-siglip"
TRANSFORMERS_SIGLIP2 = "transformers-siglip2"
FAMILY_KINDS = (OPEN_CLIP_CLIP, OPEN_CLIP_SIGLIP, TRANSFORMERS_CLIP, TRANSFORMERS_SIGLIP, TRANSFORMERS_SIGLIP2)


@dataclass(frozen=True)
class BackboneTraits:
    """A family's declarations (see the module docstring); `trimmed_text` also means the prompt prefix is reusable."""

    kind: str
    tokenizer: str
    text_pooling: str
    image_pooling: str
    pad_id: int = 0
    trimmed_text: bool = False
    pruned_image: bool = False
    sigmoid_loss: bool = False

    def describe(self) -> dict[str, object]:
        """The traits as a plain dict (provenance, docs)."""
        return {"kind": self.kind, "tokenizer": self.tokenizer, "text_pooling": self.text_pooling,
                "image_pooling": self.image_pooling, "pad_id": self.pad_id, "trimmed_text": self.trimmed_text,
                "pruned_image": self.pruned_image, "sigmoid_loss": self.sigmoid_loss}


CLIP_TRAITS = BackboneTraits(kind=OPEN_CLIP_CLIP, tokenizer="OpenAI CLIP BPE (pacs ClipTokenizer)",
                             text_pooling="argmax (first EOT), causal", image_pooling="class token",
                             pad_id=0, trimmed_text=True, pruned_image=True)
