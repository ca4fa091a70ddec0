"""Objects shared by the rewards of a run: one scorer per model and one image-embedding cache per scorer."""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from pacs.metric.common.errors import InputError

logger = logging.getLogger(__name__)

ImageLoader = Callable[[str], Any]


class ImageEmbeddingCache:
    """The image embeddings of one reward context (one set of image sources) for one scorer.

    Image files (`image_paths`) are decoded in the scorer's worker processes (`Scorer.expect_images`) when the
    context holds enough of them to pay for the pool, however few each call asks for; the embeddings are those of
    the in-process path, bit for bit (tests/rewards/test_pool_reward_cache.py).

    `embeddings` maps this context's image ids to their embeddings; the scorer encodes each image at most once
    per run and caches it by what the image is (resolved path + size + mtime, or pixel hash — see
    `pacs.metric.scoring.scorer.Scorer.embed_images`), never by the id, so two contexts whose ids coincide but whose images
    differ (COCO cocoids, nocaps and VizWiz ids are all small integers) never share an embedding.
    """

    def __init__(self, scorer: Any, image_loader: ImageLoader | None = None,
                 image_paths: Mapping[str, Any] | None = None,
                 embeddings: Mapping[str, torch.Tensor] | None = None) -> None:
        self.scorer = scorer
        self.image_loader = image_loader
        self.sources = (image_loader, image_paths, embeddings)  # keeps the objects RewardResources keys by alive
        self.image_paths = dict(image_paths or {})
        self.embeddings: dict[str, torch.Tensor] = {}
        self.n_encoded = 0
        for image_id, embedding in (embeddings or {}).items():
            self.embeddings[str(image_id)] = torch.as_tensor(embedding, dtype=torch.float32).reshape(-1)
        expect = getattr(scorer, "expect_images", None)  # the images of a run arrive a batch at a time:
        if callable(expect) and self.image_paths:  # the scorer's decoding processes serve every batch
            expect(len(set(self.image_paths) - set(self.embeddings)))

    def _source(self, image_id: str) -> Any:
        """What the scorer embeds for `image_id`: a PIL image from the loader or a path from the mapping."""
        if image_id in self.image_paths:
            return self.image_paths[image_id]
        if self.image_loader is not None:
            return self.image_loader(image_id)
        raise InputError(f"reward: no image for image id {image_id!r} (give the reward an image_loader, "
                         f"image_paths or image_embeddings that cover it)")

    def state_dict(self) -> dict[str, Any]:
        """The embeddings of the image ids seen so far, in the order they were first seen."""
        ids = list(self.embeddings)
        return {"ids": ids, "embeddings": torch.stack([self.embeddings[i] for i in ids]) if ids else torch.zeros(0, 0)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the embeddings by `state_dict()`'s."""
        self.embeddings = dict(zip(state["ids"], state["embeddings"]))

    def get(self, image_ids: list[str]) -> torch.Tensor:
        """Embeddings `[B, E]` of `image_ids`; ids never seen before are encoded in one scorer call."""
        new_ids = list(dict.fromkeys(i for i in image_ids if i not in self.embeddings))
        if new_ids:
            sources = [self._source(image_id) for image_id in new_ids]
            encoded = self.scorer.embed_images(sources, names=new_ids)  # cached by the image, not the id
            for image_id, embedding in zip(new_ids, encoded):
                self.embeddings[image_id] = embedding.detach().to("cpu", torch.float32)
            self.n_encoded += len(new_ids)
            logger.debug("reward image cache: encoded %d new images (%d cached)", len(new_ids), len(self.embeddings))
        return torch.stack([self.embeddings[image_id] for image_id in image_ids])


@dataclass
class RewardResources:
    """Scorers keyed by model source, and one image-embedding cache per (scorer, image sources), shared in a run.

    A scorer's key includes its device and compute dtype (`("spec", backbone, checkpoint, arch, device, dtype)`
    or `("backbone", id(backbone), device, dtype)`): rewards asking for another precision get their own scorer.
    """

    scorers: dict[tuple, Any] = field(default_factory=dict)
    image_caches: dict[tuple, ImageEmbeddingCache] = field(default_factory=dict)

    def image_cache(self, scorer: Any, image_loader: ImageLoader | None = None,
                    image_paths: Mapping[str, Any] | None = None,
                    embeddings: Mapping[str, torch.Tensor] | None = None) -> ImageEmbeddingCache:
        """The cache of `scorer` for these image sources (the terms of one mix share it; others get their own)."""
        sources = {"image_loader": image_loader, "image_paths": image_paths, "embeddings": embeddings}
        key = (id(scorer), id(image_loader), id(image_paths), id(embeddings))
        if key not in self.image_caches:
            self.image_caches[key] = ImageEmbeddingCache(scorer, **sources)
        return self.image_caches[key]
