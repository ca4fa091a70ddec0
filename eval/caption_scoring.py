"""Score (candidate, references, image) pairs with any per-caption metric of the registry."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pacs.eval.registry import get_metric
from pacs.eval.text_metrics import compute_text_metrics
from pacs.metric.common.errors import InputError

log = logging.getLogger(__name__)


def caption_length(caption: str) -> int:
    """The `length` baseline: number of whitespace-separated words."""
    return len(caption.split())


@dataclass
class MetricSuite:
    """Per-caption scoring for a list of metrics.

    `scorer_factory(metric_name)` returns a `pacs.metric.scoring.scorer.Scorer` for contrastive metrics (built lazily, once
    per name); text metrics go through `compute_text_metrics`; `length` counts words. `failed` holds, per metric,
    the rows of the last `score` call it could not score (NaN there; SPICE only).
    """

    metrics: Sequence[str]
    scorer_factory: Callable[[str], Any] | None = None
    spice_corenlp: str | os.PathLike | None = None
    unavailable: dict[str, str] = field(default_factory=dict)
    failed: dict[str, tuple[int, ...]] = field(default_factory=dict)
    _scorers: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.metrics = [get_metric(name).name for name in self.metrics]
        for name in self.metrics:
            if not get_metric(name).per_caption:
                raise InputError(f"{name} is a corpus-level measure and cannot be correlated per caption; "
                                 "use it with `pacs evaluate`")

    @property
    def needs_images(self) -> bool:
        """True when a contrastive metric is requested."""
        return any(get_metric(name).kind == "contrastive" for name in self.metrics)

    def scorer(self, name: str) -> Any:
        """The (cached) contrastive scorer for `name`."""
        if name not in self._scorers:
            if self.scorer_factory is None:
                raise InputError(f"{name} needs a model: pass checkpoint= or backbone= (and images=)",
                                 parameter=("checkpoint", "backbone", "images"))
            self._scorers[name] = self.scorer_factory(name)
        return self._scorers[name]

    def clear_text_caches(self) -> None:
        """Forget the text embeddings of every built scorer (image embeddings stay): the next captions are
        embedded in fresh batches, exactly as by new scorers."""
        for scorer in self._scorers.values():
            scorer.clear_text_cache()

    def score(self, candidates: Sequence[str], references: Sequence[Sequence[str]],
              images: Sequence[Any] | None = None) -> dict[str, np.ndarray]:
        """Per-caption scores of every metric, in input order (NaN for an unavailable metric)."""
        text = [name for name in self.metrics if get_metric(name).kind == "text"]
        result: dict[str, np.ndarray] = {}
        if text:
            values = compute_text_metrics(candidates, references, text, spice_corenlp=self.spice_corenlp)
            for name, value in values.items():
                result[name] = value.per_caption
                if not value.available:
                    self.unavailable[name] = value.reason
                if value.n_failed:  # NaN rows of the last call (SPICE failures), logged by pacs.eval.spice
                    self.failed[name] = value.failed
        for name in self.metrics:
            metric = get_metric(name)
            if metric.kind == "baseline":
                result[name] = np.array([caption_length(c) for c in candidates], dtype=np.float64)
            elif metric.kind == "contrastive":
                if images is None:
                    raise InputError(f"{name} needs images: pass images= DIR", parameter="images")
                refs = [list(r) for r in references] if metric.reference_based else None
                result[name] = np.asarray(self.scorer(name).score(list(images), list(candidates), refs).scores,
                                          dtype=np.float64)
        return {name: result[name] for name in self.metrics}
