"""Video captions: EMScore-style scores of frames against captions (`scorer`), frame sampling (`frames`) and IDF (`idf`).

`from pacs.metric.video import VideoScorer` (and the scorer's other names) keeps working: they are read from
`pacs.metric.video.scorer` on first use, so importing `pacs.metric.video.frames` alone stays light.
"""
from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    """The names of `pacs.metric.video.scorer`, loaded on first use."""
    scorer = importlib.import_module("pacs.metric.video.scorer")
    try:
        return getattr(scorer, name)
    except AttributeError:
        raise AttributeError(f"module 'pacs.metric.video' has no attribute {name!r}") from None
