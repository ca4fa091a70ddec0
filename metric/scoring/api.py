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


def build_scorer(metric: str, backbone: Any = None, checkpoint: str | os.PathLike | None = None,
                 arch: str | None = None, family: str | None = None, allow_family_mismatch: bool = False,
                 w: float | None = None, device: str = "cpu", batch_size: int = 64,
                 cache_dir: str | os.PathLike | None = None, lora_mode: str = "official",
                 dtype: str = "fp32", score: str | None = None, long_captions: str | None = None) -> Any:
    """The `pacs.metric.scoring.scorer.Scorer` of `metric` from the CLI's model options (`pacs.metric.scoring.model_options.build_scorer`).

    `backbone` may also be an already-loaded `Backbone` (wrapped in a new Scorer) or a `Scorer` (returned as it
    is, keeping its caches and its own `score` / `long_captions` unless given here, per call in `score()`); either way the metric's
    family is checked against the model's. `score="sigmoid"` on a model without a logit bias is an InputError.
    """
    from pacs.metric.models.backbones import Backbone
    from pacs.metric.scoring.conventions import calibration, check_long_captions, check_score_kind
    from pacs.metric.scoring.registry import check_metric_family
    from pacs.metric.scoring.scorer import Scorer

    spec = metric_spec(metric)
    if int(batch_size) < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    if isinstance(backbone, (Backbone, Scorer)):
        if checkpoint is not None or arch is not None or family is not None:
            raise InputError("checkpoint=, arch= and family= load a model: they cannot be combined with an "
                             f"already-loaded {type(backbone).__name__} given as backbone=")
        loaded = backbone.backbone if isinstance(backbone, Scorer) else backbone
        check_metric_family(spec.name, loaded, allow_family_mismatch, option="allow_family_mismatch=True")
        if isinstance(backbone, Scorer):
            check_long_captions(long_captions)
            if check_score_kind(score) == "sigmoid":
                calibration(backbone.backbone)
            return backbone
        return Scorer(loaded, w=w if w is not None else default_w(spec.name, loaded), batch_size=batch_size,
                      device=device, cache_dir=cache_dir, progress=False, dtype=dtype, score=score,
                      long_captions=long_captions)
    if backbone is not None and not isinstance(backbone, str):
        raise InputError(f"backbone= must be an open_clip NAME[/PRETRAINED], a Backbone or a Scorer, "
                         f"got {type(backbone).__name__}")
    # the CLI's rules for names and files: default CLIP backbone, family checks, w
    from pacs.metric.scoring.model_options import ModelOptions, build_scorer

    options = ModelOptions(checkpoint=None if checkpoint is None else os.fspath(checkpoint),
                           backbone=backbone, arch=arch, family=family,
                           allow_family_mismatch=allow_family_mismatch, w=w, device=device,
                           batch_size=batch_size, cache_dir=cache_dir, lora_mode=lora_mode, dtype=dtype,
                           score=check_score_kind(score), long_captions=check_long_captions(long_captions))
    scorer = build_scorer(options, spec.name)
    scorer.progress = False
    return scorer


def score(images: Sequence[Any], captions: Sequence[str], references: Sequence[Sequence[str]] | None = None,
          metric: str = "ref-pac-s++", checkpoint: str | os.PathLike | None = None, backbone: Any = None, *,
          arch: str | None = None, family: str | None = None, allow_family_mismatch: bool = False,
          w: float | None = None, device: str = "cpu", batch_size: int = 64, lora_mode: str = "official",
          cache_dir: str | os.PathLike | None = None, dtype: str = "fp32", score: str | None = None,
          long_captions: str | None = None) -> MetricScores:
    """Score caption i against image i and its references: per-caption scores + mean.

    Images are paths, PIL images, uint8 tensors `[C, H, W]` (raw 0..255 pixels, preprocessed here) or float
    tensors `[3, H, W]` already preprocessed by the model's own preprocessing (see
    `pacs.metric.scoring.image_inputs`); tensors are cached by content. `score` is "cosine" (`w·max(cos, 0)`, the
    papers' convention, default; a given Scorer keeps its own when None) or "sigmoid" (the model's calibrated `sigmoid(scale·cos + bias)`, SigLIP-style
    models only); `long_captions` is "truncate" (default, as the papers) or "chunk" (a caption longer than the
    text context is split at sentence boundaries and its embedding is the mean of its pieces'); the result
    records both and marks each truncated caption (`truncated`).

    `metric` is one of clip-s, ref-clip-s, pac-s, ref-pac-s, pac-s++, ref-pac-s++; the model options are the
    CLI's (`pacs score --help`): `checkpoint` (an official PAC-S / PAC-S++ file, an open_clip state dict, a pacs
    checkpoint or adapter folder), `backbone` (an open_clip `NAME[/PRETRAINED]`, or an already-loaded
    `Backbone` / `Scorer`), `arch`, `family`, `allow_family_mismatch`, `w` (default: the metric's),
    `device`, `batch_size`, `lora_mode`, `cache_dir`, `dtype` (fp32, bf16, fp16). Reference-based metrics
    need `references` (a list of strings per caption); reference-free ones ignore them. Bad input raises
    `pacs.metric.common.errors.InputError`.

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
    spec = metric_spec(metric)
    images, captions = list(images), list(captions) if not isinstance(captions, str) else captions
    if spec.reference_based and references is None:
        raise InputError(f"{spec.name} is reference-based: pass references= (a list of strings per caption)")
    if not spec.reference_based and references is not None:
        logger.info("references ignored: %s is reference-free", spec.name)
        references = None
    _check_inputs(images, captions, references)
    scorer = build_scorer(spec.name, backbone=backbone, checkpoint=checkpoint, arch=arch, family=family,
                          allow_family_mismatch=allow_family_mismatch, w=w, device=device, batch_size=batch_size,
                          cache_dir=cache_dir, lora_mode=lora_mode, dtype=dtype, score=score,
                          long_captions=long_captions)
    chosen_w = float(w) if w is not None else default_w(spec.name, scorer.backbone)
    result = scorer.score(images, captions, references, w=chosen_w, score=score, long_captions=long_captions)
    if result.n_truncated:
        logger.warning("%d caption(s) longer than %d tokens were truncated", result.n_truncated,
                       scorer.backbone.context_length)
    return MetricScores(metric=spec.name, scores=result.scores, mean=result.mean, w=result.w,
                        backbone=scorer.backbone.name, n_truncated=result.n_truncated, n_empty=result.n_empty,
                        details=result, score_kind=result.score_kind, long_captions=result.long_captions,
                        truncated=tuple(result.truncated))
