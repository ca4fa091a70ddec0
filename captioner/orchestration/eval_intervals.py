"""Paired bootstrap 95% intervals of (row − baseline row) for the pipeline's table rows, on the columns that are means
of per-image values.

Each row is paired with the baseline row of its test set over the same images; the interval is
`pacs.eval.intervals.paired_interval` (the images resampled with replacement by `pacs.eval.intervals.bootstrap`, the
same resampler as `pacs correlate --bootstrap`; mean(model[idx]) − mean(baseline[idx]) for every column in
`pacs.captioner.orchestration.evaluation.PER_IMAGE_COLUMNS`: C, S, CLIP-S, PAC-S++, RefCLIP-S, RefPAC-S++; the
2.5–97.5 percentile). B-4, M, Rep-n and %Incorrect are corpus statistics, not means of per-image values, and get no
interval.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from pacs.eval.intervals import paired_interval

logger = logging.getLogger(__name__)

PerImage = Mapping[str, Any]  # {"image_ids": [...], "values": {column: [per-image values]}}


def add_intervals(rows: list[dict[str, Any]], per_image: Mapping[tuple[str, str], PerImage],
                  baseline: str = "xe", n_resamples: int = 1000, seed: int = 0) -> int:
    """Set `row["delta"]` (mean of row − baseline) and `row["ci"]` on every non-baseline row whose test set has baseline per-image values; return the count.

    `per_image[(model, test_set)]` holds the row's image ids and per-image values; rows are paired with the
    baseline row of the same test set over the same images (a row whose images differ gets no interval, logged).
    """
    done = skipped = 0
    for row in rows:
        model, test_set = row.get("model"), row.get("test_set")
        if model == baseline or n_resamples < 1:
            continue
        mine, base = per_image.get((model, test_set)), per_image.get((baseline, test_set))
        if mine is None or base is None:
            skipped += 1
            continue
        if list(mine["image_ids"]) != list(base["image_ids"]):
            logger.warning("no interval for %s on %s: its images differ from the %s row's", model, test_set, baseline)
            skipped += 1
            continue
        intervals = paired_interval(mine["values"], base["values"], n_resamples, seed)
        if intervals:  # the point of each interval: the mean paired difference on all the images
            row["delta"] = {column: float(np.mean(np.asarray(mine["values"][column], dtype=np.float64))
                                          - np.mean(np.asarray(base["values"][column], dtype=np.float64)))
                            for column in intervals}
            row["ci"] = intervals
            done += 1
    if skipped:
        logger.warning("%d row(s) without paired bootstrap intervals (no per-image values for them or for %s)",
                       skipped, baseline)
    return done
