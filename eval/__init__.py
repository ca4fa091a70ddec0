"""pacs.eval: text metrics (pycocoevalcap, fast CIDEr-D), fluency measures and human-correlation benchmarks.

The public API, in one import (each name is imported on first access, PEP 562, so `import pacs.eval`
stays cheap): `from pacs.eval import cider_d`.

- `cider_d`, `cider_df`, `CiderD`, `DocumentFrequency`: fast CIDEr-D (= pycocoevalcap's `Cider`);
- `compute_text_metrics`: BLEU-1..4, METEOR, ROUGE-L, CIDEr-D, SPICE through pycocoevalcap, corpus + per caption;
- `correlate`: a human-judgment benchmark, the table `pacs correlate --out` writes;
- `evaluate_systems`: a system-level table (captions from files or in memory, a model per contrastive column),
  the table `pacs evaluate --candidates NAME=FILE ... --out` writes.
"""
from __future__ import annotations

from pacs.lazy import lazy_names

#: the public API: name -> module defining it (each has a docstring example, run by tests/test_public_api.py)
_PUBLIC = {
    "CiderD": "pacs.eval.cider",
    "DocumentFrequency": "pacs.eval.cider",
    "cider_d": "pacs.eval.cider",
    "cider_df": "pacs.eval.cider",
    "compute_text_metrics": "pacs.eval.text_metrics",
    "correlate": "pacs.eval.correlate_run",
    "evaluate_systems": "pacs.eval.correlate_run",
}

__all__ = ["CiderD", "DocumentFrequency", "cider_d", "cider_df", "compute_text_metrics", "correlate",
           "evaluate_systems"]


__getattr__, __dir__ = lazy_names(__name__, _PUBLIC, globals())
