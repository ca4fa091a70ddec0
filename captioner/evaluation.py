"""Evaluate captions the way PAC-S++ Tables 9/10/A1 do: B-4, M, C, S, RefCLIP-S, RefPAC-S++, CLIP-S, PAC-S++,
Rep-1..4 and %Incorrect — through eval/ (text metrics, fluency) and metric.Scorer (contrastive scores)."""
from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import numpy as np

logger = logging.getLogger(__name__)

TEXT_COLUMNS = {"B-4": "bleu4", "M": "meteor", "C": "cider", "S": "spice"}
CONTRASTIVE_COLUMNS = {"RefCLIP-S": ("clip", True), "RefPAC-S++": ("pac-s++", True), "CLIP-S": ("clip", False),
                       "PAC-S++": ("pac-s++", False)}
FLUENCY_COLUMNS = ("Rep-1", "Rep-2", "Rep-3", "Rep-4", "%Incorrect")
TABLE_COLUMNS = (*TEXT_COLUMNS, *CONTRASTIVE_COLUMNS, *FLUENCY_COLUMNS)


def text_scores(captions: Mapping[str, str], references: Mapping[str, Sequence[str]],
                metrics: Sequence[str] = ("bleu4", "meteor", "cider", "spice")) -> dict[str, float]:
    """Corpus text metrics (pycocoevalcap protocol via eval.text_metrics), keyed by table column."""
    from eval.text_metrics import compute_text_metrics

    ids = list(captions)
    result = compute_text_metrics([captions[i] for i in ids], [list(references[i]) for i in ids], list(metrics))
    out = {}
    for column, name in TEXT_COLUMNS.items():
        values = result.get(name)
        if values is None:
            continue
        if not values.available:
            logger.warning("%s not computed: %s", name, values.reason)
            continue
        out[column] = float(values.corpus) * 100.0  # the tables' scale (CIDEr 112.4, B-4 33.1, ...)
    return out


def fluency_scores(captions: Sequence[str]) -> dict[str, float]:
    """Rep-1..4 and %Incorrect (eval.fluency)."""
    from eval.fluency import incorrect_rate, rep_n

    captions = list(captions)
    out = {f"Rep-{n}": float(rep_n(captions, n)) for n in range(1, 5)}
    out["%Incorrect"] = float(incorrect_rate(captions))
    return out


def contrastive_scores(captions: Mapping[str, str], references: Mapping[str, Sequence[str]],
                       image_paths: Mapping[str, Any], scorers: Mapping[str, Any]) -> dict[str, float]:
    """CLIP-S / PAC-S++ and their reference-based variants from `scorers` ({'clip': Scorer, 'pac-s++': Scorer})."""
    ids = list(captions)
    images = [str(image_paths[i]) for i in ids]
    out: dict[str, float] = {}
    for column, (family, with_refs) in CONTRASTIVE_COLUMNS.items():
        scorer = scorers.get(family)
        if scorer is None:
            continue
        result = scorer.score(images, [captions[i] for i in ids],
                              references=[list(references[i]) for i in ids] if with_refs else None, keys=ids)
        out[column] = float(np.mean(result.scores))
    return out


def evaluate_captions(captions: Mapping[str, str], references: Mapping[str, Sequence[str]],
                      image_paths: Mapping[str, Any] | None = None, scorers: Mapping[str, Any] | None = None,
                      text_metrics: Sequence[str] = ("bleu4", "meteor", "cider", "spice")) -> dict[str, float]:
    """Every table column that the given inputs allow (contrastive columns need image paths and scorers)."""
    row: dict[str, float] = {}
    if text_metrics:
        row.update(text_scores(captions, references, text_metrics))
    if scorers and image_paths is not None:
        row.update(contrastive_scores(captions, references, image_paths, scorers))
    row.update(fluency_scores(list(captions.values())))
    return row


def results_json(captions: Mapping[str, str]) -> list[dict[str, str]]:
    """COCO results format: `[{"image_id", "caption"}]`."""
    return [{"image_id": image_id, "caption": caption} for image_id, caption in captions.items()]


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A markdown table of `rows` with the given columns (numbers with 3 decimals, blanks when absent)."""
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3f}"
        return "" if value is None else str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"
