"""Evaluate captions the way PAC-S++ Tables 9/10/A1 do: B-4, M, C, S, CLIP-S, PAC-S++, RefCLIP-S, RefPAC-S++,
Rep-1..4 and %Incorrect — through eval/ (text metrics, fluency) and pacs.metric.Scorer (contrastive scores)."""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pacs.eval.columns import JUDGE_COLUMNS, table_columns
from pacs.metric.common.io import finite_or_none

logger = logging.getLogger(__name__)

TEXT_COLUMNS = {"B-4": "bleu4", "M": "meteor", "C": "cider", "S": "spice"}
CONTRASTIVE_COLUMNS = {"CLIP-S": ("clip", False), "PAC-S++": ("pac-s++", False), "RefCLIP-S": ("clip", True),
                       "RefPAC-S++": ("pac-s++", True)}
FLUENCY_COLUMNS = ("Rep-1", "Rep-2", "Rep-3", "Rep-4", "%Incorrect")
TABLE_COLUMNS = tuple(table_columns((*TEXT_COLUMNS, *CONTRASTIVE_COLUMNS, *FLUENCY_COLUMNS)))
"""A recipe table's columns: the ones of `pacs.eval.columns.TABLE_COLUMNS` its evaluation computes."""
# Columns that are the mean of per-image values, so a paired bootstrap over the test images applies (B-4, M and
# the fluency columns are corpus statistics, not means of per-image values: they get no interval); the judge's
# columns only on a test set that has a judge (`pacs.captioner.orchestration.data_sources`: the demo world)
PER_IMAGE_COLUMNS = ("C", "S", *CONTRASTIVE_COLUMNS, *JUDGE_COLUMNS)


def row_columns(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """A recipe table's value columns: `TABLE_COLUMNS`, and the judge's columns when a row has them."""
    return table_columns((*TABLE_COLUMNS, *(c for c in JUDGE_COLUMNS if any(c in row for row in rows))))


def text_scores_detailed(captions: Mapping[str, str], references: Mapping[str, Sequence[str]],
                         metrics: Sequence[str] = ("bleu4", "meteor", "cider", "spice")
                         ) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """Corpus text metrics keyed by table column, and the per-image values (caption order) of C and S."""
    from pacs.eval.text_metrics import compute_text_metrics

    ids = list(captions)
    result = compute_text_metrics([captions[i] for i in ids], [list(references[i]) for i in ids], list(metrics))
    out: dict[str, float] = {}
    per_image: dict[str, np.ndarray] = {}
    for column, name in TEXT_COLUMNS.items():
        values = result.get(name)
        if values is None:
            continue
        if not values.available:
            logger.warning("%s not computed: %s", name, values.reason)
            continue
        out[column] = float(values.corpus) * 100.0  # the tables' scale (CIDEr 112.4, B-4 33.1, ...)
        if column in PER_IMAGE_COLUMNS:
            per_image[column] = np.asarray(values.per_caption, dtype=np.float64) * 100.0
    return out, per_image


def text_scores(captions: Mapping[str, str], references: Mapping[str, Sequence[str]],
                metrics: Sequence[str] = ("bleu4", "meteor", "cider", "spice")) -> dict[str, float]:
    """Corpus text metrics (pycocoevalcap protocol via pacs.eval.text_metrics), keyed by table column."""
    return text_scores_detailed(captions, references, metrics)[0]


def fluency_scores(captions: Sequence[str]) -> dict[str, float]:
    """Rep-1..4 and %Incorrect (pacs.eval.fluency)."""
    from pacs.eval.fluency import incorrect_rate, rep_n

    captions = list(captions)
    out = {f"Rep-{n}": float(rep_n(captions, n)) for n in range(1, 5)}
    out["%Incorrect"] = float(incorrect_rate(captions))
    return out


def contrastive_per_image(captions: Mapping[str, str], references: Mapping[str, Sequence[str]],
                          image_paths: Mapping[str, Any], scorers: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Per-image CLIP-S / PAC-S++ (and Ref-) scores (float32, caption order) from `scorers` ({'clip', 'pac-s++'}).

    Images are embedded by what they are (the scorer keys its cache by resolved path), so test sets whose ids
    coincide never share an embedding; the ids only label errors.
    """
    ids = list(captions)
    images = [str(image_paths[i]) for i in ids]
    out: dict[str, np.ndarray] = {}
    for column, (family, with_refs) in CONTRASTIVE_COLUMNS.items():
        scorer = scorers.get(family)
        if scorer is None:
            continue
        result = scorer.score(images, [captions[i] for i in ids],
                              references=[list(references[i]) for i in ids] if with_refs else None,
                              names=[str(i) for i in ids])
        out[column] = np.asarray(result.scores, dtype=np.float32)
    return out


def contrastive_scores(captions: Mapping[str, str], references: Mapping[str, Sequence[str]],
                       image_paths: Mapping[str, Any], scorers: Mapping[str, Any]) -> dict[str, float]:
    """CLIP-S / PAC-S++ and their reference-based variants from `scorers` ({'clip': Scorer, 'pac-s++': Scorer})."""
    return {column: float(np.mean(values))
            for column, values in contrastive_per_image(captions, references, image_paths, scorers).items()}


def evaluate_captions_detailed(captions: Mapping[str, str], references: Mapping[str, Sequence[str]],
                               image_paths: Mapping[str, Any] | None = None, scorers: Mapping[str, Any] | None = None,
                               text_metrics: Sequence[str] = ("bleu4", "meteor", "cider", "spice"),
                               contrastive: Mapping[str, np.ndarray] | None = None
                               ) -> tuple[dict[str, float | None], dict[str, np.ndarray]]:
    """The row of `evaluate_captions` and the per-image values (caption order) of its `PER_IMAGE_COLUMNS`.

    A column whose value is not finite (undefined, e.g. the fluency of no captions) is None (JSON null).

    `contrastive` gives precomputed per-image contrastive scores (caption order, e.g. gathered from several
    processes) instead of `scorers`; each column is the float32 mean of its per-image values either way.
    """
    row: dict[str, float] = {}
    per_image: dict[str, np.ndarray] = {}
    if text_metrics:
        corpus, values = text_scores_detailed(captions, references, text_metrics)
        row.update(corpus)
        per_image.update(values)
    if contrastive is None and scorers and image_paths is not None:
        contrastive = contrastive_per_image(captions, references, image_paths, scorers)
    for column, values in (contrastive or {}).items():
        values = np.asarray(values, dtype=np.float32)
        if len(values) != len(captions):
            raise ValueError(f"{column}: {len(values)} per-image scores for {len(captions)} captions")
        row[column] = float(np.mean(values))
        per_image[column] = values
    row.update(fluency_scores(list(captions.values())))
    undefined = [column for column, value in row.items() if not math.isfinite(value)]
    if undefined:  # e.g. Rep-n of no captions: written as JSON null, shown blank
        logger.warning("undefined (null): %s", ", ".join(undefined))
    return {column: finite_or_none(value) for column, value in row.items()}, per_image


def evaluate_captions(captions: Mapping[str, str], references: Mapping[str, Sequence[str]],
                      image_paths: Mapping[str, Any] | None = None, scorers: Mapping[str, Any] | None = None,
                      text_metrics: Sequence[str] = ("bleu4", "meteor", "cider", "spice")) -> dict[str, float | None]:
    """Every table column that the given inputs allow (contrastive columns need image paths and scorers)."""
    return evaluate_captions_detailed(captions, references, image_paths, scorers, text_metrics)[0]


def results_json(captions: Mapping[str, str]) -> list[dict[str, str]]:
    """COCO results format: `[{"image_id", "caption"}]`."""
    return [{"image_id": image_id, "caption": caption} for image_id, caption in captions.items()]
