"""pacs.metric: CLIP-family dual encoders, CLIP-S / PAC-S / PAC-S++ scores, checkpoints, and PAC-S++ training.

The public API, in one import (each name is imported on first access, PEP 562, so `import pacs.metric` and
`import pacs.metric.common.errors` load neither torch nor open_clip):

- `score(images, captions, references, metric="ref-pac-s++", checkpoint=...)`: per-caption scores + mean;
- `load_backbone`, `Scorer`: a model from any source, and the batched, cached scorer;
- `clip_score`, `reference_term`, `ref_score`: the score formulas on embeddings;
- `CLIPScore`, `PACScore`, `PACScorePlusPlus`: torchmetrics metrics (optional extra `torchmetrics`).
"""
from __future__ import annotations

from pacs.lazy import lazy_names

#: the public API: name -> module defining it (each has a docstring example, run by tests/test_public_api.py)
_PUBLIC = {
    "score": "pacs.metric.scoring.api",
    "MetricScores": "pacs.metric.scoring.api",
    "load_backbone": "pacs.metric.models.factory",
    "Scorer": "pacs.metric.scoring.scorer",
    "clip_score": "pacs.metric.scoring.scores",
    "reference_term": "pacs.metric.scoring.scores",
    "ref_score": "pacs.metric.scoring.scores",
    "CLIPScore": "pacs.metric.scoring.tm_metrics",
    "PACScore": "pacs.metric.scoring.tm_metrics",
    "PACScorePlusPlus": "pacs.metric.scoring.tm_metrics",
}

__all__ = ["CLIPScore", "MetricScores", "PACScore", "PACScorePlusPlus", "Scorer", "clip_score", "load_backbone",
           "ref_score", "reference_term", "score"]


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC, globals())
