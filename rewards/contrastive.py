"""Contrastive rewards from metric/: clip-s, ref-clip-s, pac-s, ref-pac-s, pac-s++, ref-pac-s++.

Each is `pacs.metric.scoring.scorer.Scorer.score_embeddings` on cached image embeddings (an image is encoded once per run,
cached by the image itself — resolved path or pixel hash — never by its id alone) and the sampled captions (plus the image's references for the `ref-` variants), with the
metric's default w (`pacs.metric.scoring.registry.default_w`) unless the context gives `w`. The reward model is frozen
(eval mode, no gradients). `dtype` ("fp32" default, "bf16", "fp16"; see `pacs.metric.scoring.scorer`) sets the compute
precision of a scorer the reward builds itself; a given `scorer=` keeps its own.

The context's `score` ("cosine" default: `w·max(cos, 0)`; "sigmoid": the model's calibrated probability, refused
for a model without a logit bias) and `long_captions` ("truncate" default, or "chunk": sentence pieces, the
references chunked the same way) apply to every contrastive term of the spec, e.g.
`build_reward("pac-s++", checkpoint=..., score="sigmoid", long_captions="chunk")`. Each call marks the captions
cut to the text context: `last_truncated` (bool `[B, k]`) and the running count `n_truncated`.
Images given by `image_loader` / `image_paths` may be paths, PIL images or tensors (`pacs.metric.scoring.image_sources`).
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from pacs.metric.common.errors import InputError
from pacs.metric.models.backbones import Backbone
from pacs.metric.scoring.conventions import calibration, check_long_captions, check_score_kind
from pacs.metric.scoring.model_options import LIBRARY_DEFAULTS, build_scorer, library_options
from pacs.metric.scoring.registry import METRICS, MetricSpec, default_w
from pacs.metric.scoring.scorer import check_dtype
from pacs.rewards.registry import register_reward
from pacs.rewards.resources import ImageEmbeddingCache, ImageLoader, RewardResources

logger = logging.getLogger(__name__)


class ContrastiveReward:
    """One contrastive metric as a reward over `[B, k]` sampled captions."""

    def __init__(self, spec: MetricSpec, scorer: Any, images: ImageEmbeddingCache, w: float,
                 score: str = "cosine", long_captions: str = "truncate") -> None:
        self.spec = spec
        self.scorer = scorer
        self.images = images
        self.w = float(w)
        self.score_kind = score
        self.long_captions = long_captions
        self.last_truncated = torch.zeros(0, 0, dtype=torch.bool)
        self.n_truncated = 0

    def state_dict(self) -> dict[str, Any]:
        """The scorer's embedding caches and this reward's image embeddings (see `Reward.state_dict`)."""
        return {"scorer": self.scorer.cache_state(), "images": self.images.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict()`."""
        self.scorer.load_cache_state(state["scorer"])
        self.images.load_state_dict(state["images"])

    def __call__(self, image_ids: list[str], captions: list[list[str]], references: list[list[str]]) -> torch.Tensor:
        """`[B, k]` scores of `captions[b][j]` against image `image_ids[b]` (and its references)."""
        k = len(captions[0]) if captions else 0
        image_embs = self.images.get(image_ids).repeat_interleave(k, dim=0)
        flat = [caption for row in captions for caption in row]
        refs = None
        if self.spec.reference_based:
            for image_id, row in zip(image_ids, references):
                if not row:
                    raise InputError(f"{self.spec.name} reward: image {image_id!r} has no references")
            refs = [row for row in references for _ in range(k)]
        result = self.scorer.score_embeddings(image_embs, flat, references=refs, w=self.w, score=self.score_kind,
                                              long_captions=self.long_captions)
        self.last_truncated = torch.as_tensor(result.truncated, dtype=torch.bool).reshape(len(image_ids), k)
        self.n_truncated += result.n_truncated
        if result.n_truncated:
            logger.debug("%s reward: %d of %d captions truncated to the text context", self.spec.name,
                         result.n_truncated, len(flat))
        return torch.as_tensor(result.scores, dtype=torch.float32).reshape(len(image_ids), k)


def scorer_from_context(name: str, scorer: Any = None, scorers: Mapping[str, Any] | None = None,
                        backbone: Any = None, checkpoint: str | None = None, arch: str | None = None,
                        device: str = LIBRARY_DEFAULTS["device"], batch_size: int = 64,
                        resources: RewardResources | None = None, dtype: str = "fp32") -> Any:
    """The scorer of reward `name`: `scorers[name]`, `scorer`, or one built from `backbone`/`checkpoint` in `dtype`."""

    if scorers and name in scorers:
        chosen = scorers[name]
    elif scorer is not None:
        chosen = scorer
    else:
        if backbone is None and checkpoint is None:
            raise InputError(f"the {name} reward needs a model: give scorer=, backbone= (a Backbone or an open_clip "
                             "NAME[/PRETRAINED]) or checkpoint=")
        resources = resources if resources is not None else RewardResources()
        dtype = check_dtype(dtype)
        if isinstance(backbone, Backbone):
            key = ("backbone", id(backbone), device, dtype)
        else:
            key = ("spec", backbone, checkpoint, arch, device, dtype)
        if key not in resources.scorers:
            # no metric: a family the reward's metric contradicts is logged by the factory, not refused
            options, model = library_options("build_reward", {"backbone": backbone, "checkpoint": checkpoint,
                                                              "arch": arch, "device": device,
                                                              "batch_size": batch_size, "dtype": dtype})
            resources.scorers[key] = build_scorer(None, options, model, progress=False)
        chosen = resources.scorers[key]
    model = chosen.backbone.model
    model.eval()
    model.requires_grad_(False)
    return chosen


def contrastive_factory(name: str):
    """The registered factory of contrastive reward `name`."""
    spec = METRICS[name]

    def factory(scorer: Any = None, scorers: Mapping[str, Any] | None = None, backbone: Any = None,
                checkpoint: str | None = None, arch: str | None = None, device: str = LIBRARY_DEFAULTS["device"],
                batch_size: int = 64,
                w: float | None = None, image_loader: ImageLoader | None = None,
                image_paths: Mapping[str, Any] | None = None, image_embeddings: Mapping[str, torch.Tensor] | None = None,
                resources: RewardResources | None = None, dtype: str = "fp32", score: str = "cosine",
                long_captions: str = "truncate", **_: Any) -> ContrastiveReward:

        score, long_captions = check_score_kind(score), check_long_captions(long_captions)
        resources = resources if resources is not None else RewardResources()
        chosen = scorer_from_context(name, scorer, scorers, backbone, checkpoint, arch, device, batch_size, resources,
                                     dtype)
        if score == "sigmoid":
            calibration(chosen.backbone)  # one clear error for a model without a logit bias
        family = chosen.backbone.family
        if family is not None and family != spec.family:  # None: family not established
            logger.warning("%s reward computed with a %r-family model (%s)", name, family, chosen.backbone.name)
        cache = resources.image_cache(chosen, image_loader=image_loader, image_paths=image_paths,
                                      embeddings=image_embeddings)
        return ContrastiveReward(spec, chosen, cache, w if w is not None else default_w(name, chosen.backbone),
                                 score=score, long_captions=long_captions)

    factory.__name__ = factory.__qualname__ = f"{name.replace('-', '_').replace('+', 'p')}_reward"
    factory.__doc__ = f"The {name} reward (metric/ scorer on cached image embeddings)."
    return factory


for _name in METRICS:
    register_reward(_name)(contrastive_factory(_name))
