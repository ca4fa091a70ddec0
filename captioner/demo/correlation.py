"""Stage `correlation` of the demo: the world's candidates (`pacs.captioner.demo.candidates`) on its validation
images with the judge's verdicts, scored and correlated by `pacs.captioner.orchestration.judge_correlation` (the
stage a recipe on the world runs per test set, `evaluation.correlation`)."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pacs.captioner.demo.candidates import candidates_for, long_candidates_for
from pacs.captioner.demo.config import DemoConfig
from pacs.captioner.demo.data import DemoData
from pacs.captioner.demo.judge import judge_caption
from pacs.captioner.demo.world import WorldItem
from pacs.captioner.orchestration.judge_correlation import Candidates, CorrelationConfig, correlate


def world_candidates(items: Sequence[WorldItem], settings: CorrelationConfig, seed: int,
                     image_path: Callable[[str], Any]) -> Candidates:
    """Candidates of every world item of `items` (the held-out first reference, corruptions of it, another image's
    caption; with `long_captions` two paragraphs), drawn with `seed`, with the judge's verdict on each; each
    row's references are the image's other references."""
    rng = np.random.default_rng([seed, 7])
    rows: list[dict[str, Any]] = []
    for item in items:
        chosen = candidates_for(item, list(items), rng, settings.candidates_per_image)
        if settings.long_captions:
            chosen += long_candidates_for(item, rng)
        for kind, caption in chosen:
            judgement = judge_caption(caption, item.scene)
            rows.append({"image_id": item.image_id, "kind": kind, "caption": caption, "judge": judgement.score})
    by_id = {item.image_id: item for item in items}
    return Candidates(rows, [list(by_id[r["image_id"]].references[1:]) for r in rows],  # the first: a candidate
                      [str(image_path(r["image_id"])) for r in rows])


def run_correlation(config: DemoConfig, data: DemoData, scorers: Mapping[str, Any], folder: Path) -> dict:
    """Score candidates of varied quality on validation images with every metric and the judge."""
    items = data.splits["val"][: config.correlation.n_images]
    return correlate(world_candidates(items, config.correlation, config.seed, data.image_path), scorers, folder,
                     config.correlation, config.seed)
