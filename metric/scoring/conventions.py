"""Score conventions (`score="cosine" | "sigmoid"`) and long-caption modes (`long_captions="truncate" | "chunk"`).

- `cosine` (default): the CLIP-S convention `w·max(cos, 0)` of the papers (CLIP-S, PAC-S, PAC-S++ and PAC-S++
  Table 8, SigLIP rows included), range [0, w]; the Ref- variants take the harmonic mean of it and the
  reference term `max_r cos(candidate, r)` (not clipped, not weighted).
- `sigmoid`: the model's own calibrated probability `sigmoid(logit_scale·cos + logit_bias)` (SigLIP / SigLIP2,
  or any model trained with a sigmoid loss), range (0, 1); `w` is not applied. The Ref- variants take the same
  harmonic mean on sigmoid-mapped terms: `H(sigmoid(s·cos(i, c) + b), sigmoid(s·max_r cos(c, r) + b))`, also in
  (0, 1). A model without a logit bias (CLIP) has no calibrated probability: `sigmoid` is refused there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from pacs.metric.common.errors import InputError

SCORE_KINDS = ("cosine", "sigmoid")
LONG_CAPTION_MODES = ("truncate", "chunk")


def check_score_kind(value: Any) -> str:
    """The canonical score convention ("cosine" or "sigmoid"); None is "cosine"; InputError otherwise."""
    if value is None:
        return "cosine"
    key = str(value).strip().lower()
    if key not in SCORE_KINDS:
        raise InputError(f"unknown score= {value!r} (known: {', '.join(SCORE_KINDS)})", parameter="score")
    return key


def check_long_captions(value: Any) -> str:
    """The canonical long-caption mode ("truncate" or "chunk"); None is "truncate"; InputError otherwise."""
    if value is None:
        return "truncate"
    key = str(value).strip().lower()
    if key not in LONG_CAPTION_MODES:
        raise InputError(f"unknown long_captions= {value!r} (known: {', '.join(LONG_CAPTION_MODES)})",
                         parameter="long_captions")
    return key


@dataclass(frozen=True)
class Calibration:
    """The model's sigmoid calibration: `logit_scale` (already exponentiated) and `logit_bias`."""

    scale: float
    bias: float

    def apply(self, cosines: Any) -> Any:
        """`sigmoid(scale·cos + bias)` elementwise: a float32 tensor for a tensor, else a float32 numpy array."""
        if hasattr(cosines, "detach"):  # a torch tensor (torch is imported only where tensors exist)
            import torch

            return torch.sigmoid(self.scale * cosines.float() + self.bias)
        values = np.asarray(cosines, dtype=np.float64)
        return (1.0 / (1.0 + np.exp(-(self.scale * values + self.bias)))).astype(np.float32)


def _as_float(value: Any) -> float | None:
    if value is None:
        return None
    if hasattr(value, "detach"):  # a torch tensor or parameter
        return float(value.detach().float().reshape(-1)[0])
    return float(value)


def _model_calibration(backbone: Any) -> tuple[float | None, float | None]:
    """(scale, bias) read from an open_clip-style model (`logit_scale` is stored as its log there)."""
    model = getattr(backbone, "model", None)
    log_scale = getattr(model, "logit_scale", None)
    scale = math.exp(_as_float(log_scale)) if log_scale is not None else None
    return scale, _as_float(getattr(model, "logit_bias", None))


def _declared(backbone: Any, name: str) -> tuple[bool, Any]:
    """(declared, value) of a backbone attribute; a property that cannot answer counts as not declared."""
    try:
        return hasattr(type(backbone), name) or name in vars(backbone), getattr(backbone, name)
    except (AttributeError, InputError, TypeError):
        return False, None


def calibration(backbone: Any) -> Calibration:
    """The backbone's `Calibration`; InputError (parameter `score`) when it has no logit bias (e.g. CLIP).

    Reads `backbone.logit_scale` (exponentiated) and `backbone.logit_bias`; where a backbone does not declare
    them, the open_clip model's `logit_scale` (a log) and `logit_bias` parameters.
    """
    model_scale, model_bias = _model_calibration(backbone)
    has_scale, scale = _declared(backbone, "logit_scale")
    has_bias, bias = _declared(backbone, "logit_bias")
    scale = _as_float(scale) if has_scale and scale is not None else model_scale
    bias = _as_float(bias) if has_bias else model_bias
    name = getattr(backbone, "name", "the model")
    kind = getattr(backbone, "family_kind", None) or "a CLIP-style model"
    if bias is None or scale is None:
        raise InputError(f"score= sigmoid needs a model trained with the sigmoid loss (a logit bias, e.g. SigLIP / "
                         f"SigLIP2); {name} ({kind}) has none: use score= cosine", parameter="score")
    if not (math.isfinite(scale) and math.isfinite(bias)):
        raise InputError(f"{name}: its logit scale {scale} / bias {bias} are not finite", parameter="score")
    return Calibration(scale=float(scale), bias=float(bias))
