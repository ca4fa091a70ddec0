"""Paired bootstrap 95% intervals of (model − baseline) for the table columns that are means of per-image values.

The images of a test set are resampled with replacement (`pacs.eval.correlation.bootstrap`, the same resampler as
`pacs correlate --bootstrap`); each resample gives mean(model[idx]) − mean(baseline[idx]) for every column in
`pacs.captioner.orchestration.evaluation.PER_IMAGE_COLUMNS` (C, S, RefCLIP-S, RefPAC-S++, CLIP-S, PAC-S++), and the interval is
the 2.5–97.5 percentile of those differences (`pacs.eval.correlation.confidence_interval`). B-4, M, Rep-n and
%Incorrect are corpus statistics, not means of per-image values, and get no interval.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

PerImage = Mapping[str, Any]  # {"image_ids": [...], "values": {column: [per-image values]}}


def paired_interval(model: Mapping[str, Sequence[float]], baseline: Mapping[str, Sequence[float]],
                    n_resamples: int, seed: int = 0, level: float = 0.95) -> dict[str, list[float]]:
    """`{column: [low, high]}` of mean(model − baseline) over paired image resamples, for the columns both have."""
    from pacs.eval.correlation import bootstrap, confidence_interval

    columns = [c for c in model if c in baseline]
    a = {c: np.asarray(model[c], dtype=np.float64) for c in columns}
    b = {c: np.asarray(baseline[c], dtype=np.float64) for c in columns}
    usable = []
    for column in columns:
        if len(a[column]) != len(b[column]):
            raise ValueError(f"{column}: {len(a[column])} model values but {len(b[column])} baseline values")
        if not (np.isfinite(a[column]).all() and np.isfinite(b[column]).all()):
            logger.warning("no interval for %s: some per-image values are missing (NaN)", column)
            continue
        usable.append(column)
    if not usable or n_resamples < 1 or not len(a[usable[0]]):
        return {}

    def statistic(indices: np.ndarray) -> dict[str, float]:
        return {c: float(a[c][indices].mean() - b[c][indices].mean()) for c in usable}

    samples = bootstrap(statistic, len(a[usable[0]]), n_resamples, seed, description="paired bootstrap")
    return {column: confidence_interval(samples[column], level) for column in usable}


def add_intervals(rows: list[dict[str, Any]], per_image: Mapping[tuple[str, str], PerImage],
                  baseline: str = "xe", n_resamples: int = 1000, seed: int = 0) -> int:
    """Set `row["ci"]` on every non-baseline row whose test set has baseline per-image values; return the count.

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
        if intervals:
            row["ci"] = intervals
            done += 1
    if skipped:
        logger.warning("%d row(s) without paired bootstrap intervals (no per-image values for them or for %s)",
                       skipped, baseline)
    return done
