"""torchmetrics metrics: `CLIPScore`, `PACScore`, `PACScorePlusPlus` (and their Ref- variants), plus functional twins.

Optional extra: `pip install "pacs-captioning[torchmetrics]"`. Each metric is a `torchmetrics.Metric` that
scores with `pacs.metric.scoring.scorer.Scorer` (the numbers of `pacs score`, nothing re-implemented):

- construction takes the CLI's model options as keywords (the fields of
  `pacs.metric.scoring.model_options.ModelOptions`: `checkpoint`, `backbone`, `arch`, `family`,
  `allow_family_mismatch`, `w`, `device` (default here: cpu), `batch_size`, `cache_dir`, `lora_mode`, `dtype`,
  `score` ("cosine" or "sigmoid"), `long_captions` ("truncate" or "chunk"), `workers`, `decode`), or an already
  loaded `Backbone` (or `Scorer`) as `backbone=`; every other keyword goes to `torchmetrics.Metric`;
- `reference_based=True` makes the metric the Ref- variant (RefCLIP-S, RefPAC-S, RefPAC-S++): `update` then
  needs `references` (one list of strings per caption); a reference-free metric refuses them, so one metric
  object never mixes the two kinds of number;
- `update(images, captions, references=None)` takes paths, PIL images, or image tensors (`[N, C, H, W]`,
  a list of `[C, H, W]`; C = 1 or 3): integer tensors hold 0..255 (torchmetrics' `CLIPScore` examples use
  `torch.randint(255, ...)`), float tensors hold 0..1 (torchvision's `ToTensor` convention) and are rounded to
  uint8; each tensor becomes a PIL image and then goes through the checkpoint's own preprocessing (resize,
  crop, normalise), exactly as an image file would;
- the state is one `scores` list and one `truncated` list (1.0 where a caption was cut to the text context), both
  with `dist_reduce_fx="cat"`: torchmetrics' own sync gathers them across processes; `n_truncated` counts them
  and `compute()` with `return_per_sample=True` also returns `"truncated"` (a bool tensor per sample); `compute()` is the mean (float32 of a float64 mean), or `{"score": mean, "per_sample": scores}`
  with `return_per_sample=True` (after a multi-process sync, per-sample scores are in rank order, each
  process's in its update order).

The model lives in the scorer, not in the metric's modules: `metric.to(device)` moves only the state, and a
Lightning checkpoint of the metric does not hold the CLIP weights.

>>> import numpy as np
>>> from PIL import Image
>>> from pacs.metric.models.backbones import build_backbone_from_config, tiny_clip_config
>>> from pacs.metric.scoring.tm_metrics import PACScorePlusPlus
>>> backbone = build_backbone_from_config(tiny_clip_config(), seed=0, family="pac-s++")
>>> image = Image.fromarray(np.full((64, 64, 3), 128, dtype=np.uint8))
>>> ref_pacs = PACScorePlusPlus(backbone=backbone, reference_based=True)
>>> ref_pacs.update([image, image], ["a grey square", "a dog"], references=[["a grey image"], ["a grey image"]])
>>> ref_pacs.compute().shape, ref_pacs.metric_name
(torch.Size([]), 'ref-pac-s++')
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import fields
from typing import Any, ClassVar

import numpy as np
import torch
from PIL import Image

from pacs.metric.common.errors import InputError, MissingResourceError
from pacs.metric.models.backbones import Backbone
from pacs.metric.scoring.model_options import ModelOptions, build_scorer, library_options
from pacs.metric.scoring.scorer import Scorer

try:
    from torchmetrics import Metric
    from torchmetrics.utilities.data import dim_zero_cat
except ImportError as _error:  # the optional extra is not installed
    raise MissingResourceError(
        f"pacs.metric.scoring.tm_metrics needs torchmetrics ({_error}): pip install \"pacs-captioning[torchmetrics]\"") from None

ImageInput = str | os.PathLike | Image.Image | torch.Tensor

__all__ = ["CLIPScore", "PACScore", "PACScorePlusPlus", "clip_score", "pac_score", "pac_score_plus_plus",
           "to_image_inputs"]

#: the keywords a metric's constructor hands to `build_scorer` (the rest go to `torchmetrics.Metric`)
MODEL_OPTION_NAMES = frozenset(option.name for option in fields(ModelOptions))


def _tensor_to_pil(image: torch.Tensor, index: int) -> Image.Image:
    """A `[C, H, W]` tensor (C = 1 or 3; integers 0..255 or floats 0..1) as a PIL image."""
    if image.ndim != 3 or image.shape[0] not in (1, 3):
        raise InputError(f"image #{index}: an image tensor must be [C, H, W] with C = 1 or 3, got "
                         f"{list(image.shape)}")
    image = image.detach().to("cpu")
    if image.dtype == torch.bool or image.is_complex():
        raise InputError(f"image #{index}: unsupported tensor dtype {image.dtype}")
    if image.is_floating_point():
        low, high = float(image.min()), float(image.max())
        if not (0.0 <= low and high <= 1.0):  # also catches NaN
            raise InputError(f"image #{index}: a float image tensor must hold values in [0, 1], got "
                             f"[{low:g}, {high:g}] (pass uint8 for 0..255)")
        pixels = (image.double() * 255).round().to(torch.uint8)
    else:
        low, high = int(image.min()), int(image.max())
        if low < 0 or high > 255:
            raise InputError(f"image #{index}: an integer image tensor must hold values in 0..255, got "
                             f"{low}..{high}")
        pixels = image.to(torch.uint8)
    array = pixels.permute(1, 2, 0).numpy()
    return Image.fromarray(array[:, :, 0] if array.shape[2] == 1 else np.ascontiguousarray(array))


def to_image_inputs(images: ImageInput | Sequence[ImageInput]) -> list[str | Image.Image]:
    """Paths (as str) and PIL images for the scorer from paths, PIL images, `[N, C, H, W]` or `[C, H, W]` tensors."""
    if isinstance(images, torch.Tensor):
        if images.ndim == 3:
            images = images[None]
        if images.ndim != 4:
            raise InputError(f"an image batch tensor must be [N, C, H, W] (or one [C, H, W]), got "
                             f"{list(images.shape)}")
        return [_tensor_to_pil(image, index) for index, image in enumerate(images)]
    if isinstance(images, (str, os.PathLike, Image.Image)):
        images = [images]
    converted: list[str | Image.Image] = []
    for index, image in enumerate(images):
        if isinstance(image, torch.Tensor):
            converted.append(_tensor_to_pil(image, index))
        elif isinstance(image, (str, os.PathLike)):
            converted.append(os.fspath(image))
        elif isinstance(image, Image.Image):
            converted.append(image)
        else:
            raise InputError(f"image #{index}: expected a path, a PIL image or a [C, H, W] tensor, got "
                             f"{type(image).__name__}")
    return converted


def _captions(captions: str | Sequence[str]) -> list[str]:
    captions = [captions] if isinstance(captions, str) else list(captions)
    for index, caption in enumerate(captions):
        if not isinstance(caption, str):
            raise InputError(f"caption #{index} is not a string: {caption!r}")
    return captions


def _references(references: Sequence[Sequence[str]], n: int) -> list[list[str]]:
    rows = list(references)
    if len(rows) != n:
        raise InputError(f"{n} captions but {len(rows)} reference lists (one list of strings per caption)")
    for index, row in enumerate(rows):
        if isinstance(row, str):
            raise InputError(f"references of caption #{index}: expected a list of strings, got the string {row!r}")
    return [list(row) for row in rows]


class _ContrastiveMetric(Metric):
    """A pacs contrastive metric (see the module docstring); subclasses set `base_metric`."""

    base_metric: ClassVar[str] = ""
    is_differentiable: ClassVar[bool] = False
    higher_is_better: ClassVar[bool] = True
    full_state_update: ClassVar[bool] = False
    plot_lower_bound: float = 0.0

    def __init__(self, checkpoint: str | None = None, backbone: Backbone | Scorer | str | None = None, *,
                 reference_based: bool = False, return_per_sample: bool = False, **kwargs: Any) -> None:
        """Model options: the fields of `ModelOptions` as keywords (device cpu unless given); others: Metric's."""
        model_keywords = {key: kwargs.pop(key) for key in list(kwargs) if key in MODEL_OPTION_NAMES}
        super().__init__(**kwargs)
        self.reference_based = bool(reference_based)
        self.metric_name = ("ref-" if self.reference_based else "") + self.base_metric
        self.return_per_sample = bool(return_per_sample)
        options, model = library_options(type(self).__name__,
                                         {"checkpoint": checkpoint, "backbone": backbone, **model_keywords})
        self.scorer = build_scorer(self.metric_name, options, model, progress=False)
        self.add_state("scores", default=[], dist_reduce_fx="cat")
        self.add_state("truncated", default=[], dist_reduce_fx="cat")

    @property
    def score_kind(self) -> str:
        """The score convention: "cosine" (`w·max(cos, 0)`) or "sigmoid" (the model's calibrated probability)."""
        return self.scorer.score_kind

    @property
    def long_captions(self) -> str:
        """The long-caption mode: "truncate" or "chunk"."""
        return self.scorer.long_captions

    @property
    def n_truncated(self) -> int:
        """How many captions seen so far (all processes, after a sync) were cut to the text context."""
        return int(self._cat(self.truncated).sum())

    @property
    def w(self) -> float:
        """The weight w of the reference-free term (the metric's default for the backbone unless given)."""
        return self.scorer.w

    def update(self, images: ImageInput | Sequence[ImageInput], captions: str | Sequence[str],
               references: Sequence[Sequence[str]] | None = None) -> None:
        """Score caption i against image i (and its references for a Ref- metric) and keep the scores."""
        inputs = to_image_inputs(images)
        texts = _captions(captions)
        if len(inputs) != len(texts):
            raise InputError(f"{len(inputs)} images but {len(texts)} captions")
        if self.reference_based and references is None:
            raise InputError(f"{self.metric_name} is reference-based: call update(images, captions, references)")
        if not self.reference_based and references is not None:
            raise InputError(f"{self.metric_name} is reference-free: construct the metric with reference_based=True "
                             f"to score ref-{self.metric_name} with references")
        refs = _references(references, len(texts)) if references is not None else None
        result = self.scorer.score(inputs, texts, refs)
        self.scores.append(torch.as_tensor(result.scores, dtype=torch.float32).to(self.device))
        self.truncated.append(torch.as_tensor(result.truncated, dtype=torch.float32).reshape(-1).to(self.device))

    def _cat(self, state: Any) -> torch.Tensor:
        if isinstance(state, torch.Tensor):
            return state.reshape(-1)
        return dim_zero_cat(state).reshape(-1) if state else torch.zeros(0, device=self.device)

    def _all_scores(self) -> torch.Tensor:
        return self._cat(self.scores)

    def compute(self) -> torch.Tensor | dict[str, torch.Tensor]:
        """The mean score (NaN before any sample); `{"score", "per_sample", "truncated"}` with `return_per_sample=True`."""
        scores = self._all_scores()
        mean = scores.double().mean().float() if scores.numel() else torch.tensor(float("nan"), device=self.device)
        if self.return_per_sample:
            return {"score": mean, "per_sample": scores, "truncated": self._cat(self.truncated) > 0.5}
        return mean


class CLIPScore(_ContrastiveMetric):
    """CLIP-S = w·max(cos, 0) (w = 2.5), or RefCLIP-S with `reference_based=True`.

    Without `checkpoint`/`backbone` it uses `ViT-B-32/openai`, like `pacs score --metric clip-s`.

    >>> from PIL import Image
    >>> from pacs.metric import CLIPScore, load_backbone, score
    >>> tiny = load_backbone("tiny-random")  # a tiny random CLIP built in code
    >>> images, captions = [Image.new("RGB", (64, 64), "red")] * 2, ["a red square", "a blue circle"]
    >>> clip_s = CLIPScore(backbone=tiny, return_per_sample=True)
    >>> clip_s.update(images, captions)
    >>> result = clip_s.compute()
    >>> result["per_sample"].tolist() == score(images, captions, metric="clip-s", backbone=tiny).scores.tolist()
    True
    """

    base_metric = "clip-s"


class PACScore(_ContrastiveMetric):
    """PAC-S = w·max(cos, 0) on a PAC-S checkpoint (w = 2.0), or RefPAC-S with `reference_based=True`.

    >>> import os
    >>> from pacs.metric import PACScore
    >>> fixtures = os.path.join(os.environ["PACS_SHARED"], "fixtures", "pacscore")  # C: a tiny PAC-S file
    >>> pac_s = PACScore(checkpoint=os.path.join(fixtures, "C", "clip_tiny_C.pth"),
    ...                  arch=os.path.join(fixtures, "C", "arch.json"))
    >>> pac_s.update([os.path.join(fixtures, "inputs", "images", "pacscore_example_image1.jpg")],
    ...              ["A white dog is laying on the ground with its head on its paws ."])
    >>> round(float(pac_s.compute()), 3)  # the official code: 1.02995
    1.03
    """

    base_metric = "pac-s"


class PACScorePlusPlus(_ContrastiveMetric):
    """PAC-S++ (w = 2.5 on ViT-B/32, 3.0 on ViT-L/14), or RefPAC-S++ with `reference_based=True`.

    >>> import os
    >>> from pacs.metric import PACScorePlusPlus
    >>> fixtures = os.path.join(os.environ["PACS_SHARED"], "fixtures", "pacscore")  # A: a tiny PAC-S++ file
    >>> ref_pacs = PACScorePlusPlus(checkpoint=os.path.join(fixtures, "A", "PAC++_tiny_A.pth"),
    ...                             arch=os.path.join(fixtures, "A", "arch.json"), reference_based=True)
    >>> ref_pacs.update([os.path.join(fixtures, "inputs", "images", "pacscore_example_image1.jpg")],
    ...                 ["A white dog is laying on the ground with its head on its paws ."],
    ...                 references=[["A closeup of a white dog that is laying its head on its paws .",
    ...                              "a large white dog lying on the floor ."]])
    >>> ref_pacs.metric_name, ref_pacs.w, round(float(ref_pacs.compute()), 3)
    ('ref-pac-s++', 2.5, 0.988)
    """

    base_metric = "pac-s++"


def _functional(metric_class: type[_ContrastiveMetric], images: Any, captions: Any,
                references: Sequence[Sequence[str]] | None, return_per_sample: bool,
                options: dict[str, Any]) -> torch.Tensor | dict[str, torch.Tensor]:
    metric = metric_class(reference_based=references is not None, return_per_sample=return_per_sample,
                          sync_on_compute=False, **options)  # never gathers across processes
    metric.update(images, captions, references)
    return metric.compute()


def clip_score(images: Any, captions: Any, references: Sequence[Sequence[str]] | None = None,
               return_per_sample: bool = False, **options: Any) -> torch.Tensor | dict[str, torch.Tensor]:
    """Functional CLIPScore: CLIP-S, or RefCLIP-S when `references` are given; `options` as the metric's.

    Each call builds its scorer: pass `backbone=` a loaded `Backbone` to load the model once.
    """
    return _functional(CLIPScore, images, captions, references, return_per_sample, options)


def pac_score(images: Any, captions: Any, references: Sequence[Sequence[str]] | None = None,
              return_per_sample: bool = False, **options: Any) -> torch.Tensor | dict[str, torch.Tensor]:
    """Functional PACScore: PAC-S, or RefPAC-S when `references` are given; `options` as the metric's."""
    return _functional(PACScore, images, captions, references, return_per_sample, options)


def pac_score_plus_plus(images: Any, captions: Any, references: Sequence[Sequence[str]] | None = None,
                        return_per_sample: bool = False, **options: Any) -> torch.Tensor | dict[str, torch.Tensor]:
    """Functional PACScorePlusPlus: PAC-S++, or RefPAC-S++ when `references` are given; `options` as the metric's."""
    return _functional(PACScorePlusPlus, images, captions, references, return_per_sample, options)
