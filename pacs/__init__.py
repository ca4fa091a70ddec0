"""pacs: train image captioners with SCST against learned contrastive rewards, and evaluate captions.

One namespace holds everything: `pacs.metric` (CLIP-family encoders, CLIP-S / PAC-S / PAC-S++, their training),
`pacs.eval` (caption metrics, human-correlation benchmarks, system tables), `pacs.rewards` (the SCST reward
registry), `pacs.captioner` (the captioner, XE and SCST, the pipeline) and `pacs.configs` (the packaged recipes).

The short public API is importable from here; each name is imported on first access (PEP 562), so
`import pacs` loads neither torch nor a model:

- `score(images, captions, references, metric="ref-pac-s++", ...)`: per-caption CLIP-S / PAC-S / PAC-S++;
- `cider_d(candidates, references)`: fast CIDEr-D (= pycocoevalcap's `Cider`);
- `correlate(...)`: a human-judgment benchmark; `evaluate_systems(...)`: a system-level table;
- `build_reward("cider:1,pac-s++:0.5", ...)`: an SCST reward; `load_backbone(...)`: a model from any source.
"""
from __future__ import annotations

from pacs.lazy import lazy_names

#: the short public API: name -> module defining it (each has a docstring example, run by tests/test_public_api.py)
_PUBLIC = {
    "score": "pacs.metric.scoring.api",
    "load_backbone": "pacs.metric.models.factory",
    "cider_d": "pacs.eval.cider",
    "correlate": "pacs.eval.correlate_run",
    "evaluate_systems": "pacs.eval.correlate_run",
    "build_reward": "pacs.rewards.registry",
}

__all__ = ["build_reward", "cider_d", "correlate", "evaluate_systems", "load_backbone", "score"]


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC, globals())
