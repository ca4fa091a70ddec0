"""One call for the common case: `score(images, captions, references, metric=..., checkpoint=...)`.

In the style of pacscore's `PACScore` / `RefPACScore`: load the model named by the same options as the CLI
(`pacs score`), score caption i against image i (and its references), return the per-caption scores and their
mean. Pass an already-loaded `Backbone` (or a `Scorer`, which also keeps its image embeddings) as `backbone=`
so that repeated calls do not reload the model.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pacs.metric.common.errors import InputError
from pacs.metric.scoring.model_options import build_scorer, library_options
from pacs.metric.scoring.registry import default_w, metric_spec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetricScores:
    """Per-caption scores (float32, input order) and their mean, with the metric, w and model that produced them.

    `details` is the scorer's full `pacs.metric.scoring.scorer.ScoreResult` (reference-free scores, reference terms, cosines).
    `score_kind` is the convention ("cosine": `w·max(cos, 0)`; "sigmoid": the model's calibrated probability),
    `long_captions` the long-caption mode ("truncate" or "chunk") and `truncated[i]` whether caption i was cut to
    the text context (`n_truncated` of them).

    >>> import numpy as np
    >>> from pacs.metric import MetricScores
    >>> result = MetricScores("clip-s", np.array([0.5, 0.25], dtype=np.float32), 0.375, 2.5, "tiny-random")
    >>> result.mean, len(result)
    (0.375, 2)
    """

    metric: str
    scores: np.ndarray
    mean: float
    w: float
    backbone: str
    n_truncated: int = 0
    n_empty: int = 0
    details: Any = field(default=None, repr=False, compare=False)
    score_kind: str = "cosine"
    long_captions: str = "truncate"
    truncated: tuple[bool, ...] = ()

    def __len__(self) -> int:
        """The number of scored captions."""
        return len(self.scores)


def _check_inputs(images: Sequence[Any], captions: Sequence[str],
                  references: Sequence[Sequence[str]] | None) -> None:
    """One clear InputError for inputs of the wrong shape (named by position)."""
    if isinstance(captions, str):
        raise InputError("captions must be a list of strings, not a single string")
    if isinstance(images, (str, os.PathLike)):
        raise InputError("images must be a list (of paths, PIL images or tensors), not a single path")
    if len(images) != len(captions):
        raise InputError(f"{len(images)} images but {len(captions)} captions")
    if references is not None:
        if len(references) != len(captions):
            raise InputError(f"{len(captions)} captions but {len(references)} reference lists")
        for index, refs in enumerate(references):
            if isinstance(refs, str):
                raise InputError(f"references of caption #{index} must be a list of strings, not a string")


def score(images: Sequence[Any], captions: Sequence[str], references: Sequence[Sequence[str]] | None = None,
          metric: str = "ref-pac-s++", checkpoint: str | os.PathLike | None = None, backbone: Any = None, *,
          score: str | None = None, long_captions: str | None = None, **options: Any) -> MetricScores:
    """Score caption i against image i and its references: per-caption scores + mean.

    Images are paths, PIL images, uint8 tensors `[C, H, W]` (raw 0..255 pixels, preprocessed here) or float
    tensors `[3, H, W]` already preprocessed by the model's own preprocessing (see
    `pacs.metric.scoring.image_sources`); tensors are cached by content. `score` is "cosine" (`w·max(cos, 0)`, the
    papers' convention, default; a given Scorer keeps its own when None) or "sigmoid" (the model's calibrated `sigmoid(scale·cos + bias)`, SigLIP-style
    models only); `long_captions` is "truncate" (default, as the papers) or "chunk" (a caption longer than the
    text context is split at sentence boundaries and its embedding is the mean of its pieces'); the result
    records both and marks each truncated caption (`truncated`).

    `metric` is one of clip-s, ref-clip-s, pac-s, ref-pac-s, pac-s++, ref-pac-s++; the model options are the
    fields of `pacs.metric.scoring.model_options.ModelOptions` (the CLI's, `pacs score --help`) as keywords:
    `checkpoint` (an official PAC-S / PAC-S++ file, an open_clip state dict, a pacs checkpoint or adapter
    folder), `backbone` (an open_clip `NAME[/PRETRAINED]`, or an already-loaded `Backbone` / `Scorer`), `arch`,
    `family`, `allow_family_mismatch`, `w` (default: the metric's), `device` (default here: cpu), `batch_size`,
    `lora_mode`, `cache_dir`, `dtype` (fp32, bf16, fp16), `workers`, `decode`; a keyword that is none of them is a
    TypeError naming the known ones. Reference-based metrics need `references` (a list of strings per caption);
    reference-free ones ignore them. Bad input raises `pacs.metric.common.errors.InputError`.

    A tiny random model (built in code) standing in for a real PAC-S++ checkpoint:

    >>> from PIL import Image
    >>> from pacs.metric import score
    >>> from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
    >>> tiny = build_backbone_from_config(tiny_clip_config(), seed=0, family="pac-s++")
    >>> images = [Image.new("RGB", (64, 64), "red"), Image.new("RGB", (64, 64), "blue")]
    >>> result = score(images, ["a red square", "a blue square"], [["a red image"], ["a blue image"]],
    ...                backbone=tiny)
    >>> result.metric, result.w, result.scores.shape
    ('ref-pac-s++', 2.5, (2,))
    >>> bool(abs(result.mean - result.scores.mean()) < 1e-6)
    True

    An official-format checkpoint (the shared fixture A, a tiny PAC-S++ file) scored as the official code does:

    >>> import os
    >>> fixtures = os.path.join(os.environ["PACS_SHARED"], "fixtures", "pacscore")
    >>> result = score([os.path.join(fixtures, "inputs", "images", "pacscore_example_image1.jpg")],
    ...                ["A white dog is laying on the ground with its head on its paws ."], metric="pac-s++",
    ...                checkpoint=os.path.join(fixtures, "A", "PAC++_tiny_A.pth"),
    ...                arch=os.path.join(fixtures, "A", "arch.json"), w=2.0)
    >>> round(result.mean, 4)  # the official code gives 0.81278 (fixture A's expected.json)
    0.8128
    """
    model_options, model = library_options("score", {"checkpoint": checkpoint, "backbone": backbone, "score": score,
                                                     "long_captions": long_captions, **options})
    spec = metric_spec(metric)
    images, captions = list(images), list(captions) if not isinstance(captions, str) else captions
    if spec.reference_based and references is None:
        raise InputError(f"{spec.name} is reference-based: pass references= (a list of strings per caption)")
    if not spec.reference_based and references is not None:
        logger.info("references ignored: %s is reference-free", spec.name)
        references = None
    _check_inputs(images, captions, references)
    scorer = build_scorer(spec.name, model_options, model, progress=False)
    w = model_options.w
    chosen_w = float(w) if w is not None else default_w(spec.name, scorer.backbone)
    result = scorer.score(images, captions, references, w=chosen_w, score=score, long_captions=long_captions)
    if result.n_truncated:
        logger.warning("%d caption(s) longer than %d tokens were truncated", result.n_truncated,
                       scorer.backbone.context_length)
    return MetricScores(metric=spec.name, scores=result.scores, mean=result.mean, w=result.w,
                        backbone=scorer.backbone.name, n_truncated=result.n_truncated, n_empty=result.n_empty,
                        details=result, score_kind=result.score_kind, long_captions=result.long_captions,
                        truncated=tuple(result.truncated))
