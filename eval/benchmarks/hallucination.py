"""nocaps-FOIL and HAT (files in ../shared/data/hallucination/).

nocaps-FOIL (`nocaps-val-foil.json`): a list of `{"image_path", "references", "baseline", "foil",
"replacement", "domain"}`; accuracy (×100) of scoring the correct caption (`baseline`) above the foil, per
domain and overall (all items); `mean` is the mean of the three domains; a metric tie counts half.
HAT (`hat-trainval.json`): a list of `{"caption", "contains_hallucination", "image_path", "references", ...}`;
AUROC of the score for "not hallucinated" (higher score = no hallucination).
`--data` is the json file or the folder holding it under that name.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from pacs.eval.benchmarks import (
    Benchmark,
    RunContext,
    accuracy_table,
    auroc_table,
    register_benchmark,
    resolve_images,
    score_unique,
)
from pacs.metric.common.errors import InputError
from pacs.metric.common.json_input import read_json_file

DOMAINS = ("in-domain", "near-domain", "out-domain")


def _load_list(data: Path, default_name: str) -> tuple[Path, list]:
    """The json list at `data` (or `data/default_name`)."""
    path = data / default_name if data.is_dir() else data
    if not path.is_file():
        raise InputError(f"{path} not found")
    items = read_json_file(path, "benchmark data")
    if not isinstance(items, list):
        raise InputError(f"{path}: expected a json list of items")
    return path, items


def _field(path: Path, index: int, item: Any, key: str, kind: type) -> Any:
    """item[key] checked for type; InputError naming file, item and key."""
    if not isinstance(item, dict) or key not in item:
        raise InputError(f"{path}: item {index} lacks {key!r}")
    value = item[key]
    if not isinstance(value, kind):
        raise InputError(f"{path}: item {index} {key!r} is {type(value).__name__}, expected {kind.__name__}")
    return value


def _references(path: Path, index: int, item: Any) -> list[str]:
    """Non-empty list of reference strings of an item."""
    refs = _field(path, index, item, "references", list)
    if not refs or not all(isinstance(r, str) for r in refs):
        raise InputError(f"{path}: item {index} 'references' must be a non-empty list of strings")
    return refs


@register_benchmark("nocaps-foil")
class NocapsFoil(Benchmark):
    """nocaps-FOIL: correct vs foil caption accuracy per domain."""

    description = "nocaps-FOIL (accuracy of preferring the correct caption, per domain and overall)"

    def run(self, context: RunContext) -> dict[str, Any]:
        """Accuracy per domain, overall and mean of domains."""
        path, items = _load_list(context.data, "nocaps-val-foil.json")
        correct, foil, refs, domains, images = [], [], [], [], []
        for index, item in enumerate(items):
            correct.append(_field(path, index, item, "baseline", str))
            foil.append(_field(path, index, item, "foil", str))
            refs.append(_references(path, index, item))
            domain = _field(path, index, item, "domain", str)
            if domain not in DOMAINS:
                raise InputError(f"{path}: item {index} has domain {domain!r} (expected one of {', '.join(DOMAINS)})")
            domains.append(domain)
            images.append(_field(path, index, item, "image_path", str))
        keep, paths = resolve_images(context, images, images)
        idx = np.flatnonzero(keep)
        img = [str(paths[i]) for i in idx] if context.suite.needs_images else None
        scores = score_unique(context, [correct[i] for i in idx] + [foil[i] for i in idx],
                              [refs[i] for i in idx] * 2, (img + img) if img else None)
        half = len(idx)
        a = {k: v[:half] for k, v in scores.items()}
        b = {k: v[half:] for k, v in scores.items()}
        table = accuracy_table(context, a, b, np.ones(half, dtype=bool), np.array(domains)[idx], DOMAINS)
        overall = accuracy_table(context, a, b, np.ones(half, dtype=bool), np.array(domains)[idx], DOMAINS,
                                 mean_of_categories=False)
        for name, row in table.items():
            if "unavailable" not in row:
                row["overall"] = overall[name]["mean"]
        return table


@register_benchmark("hat")
class Hat(Benchmark):
    """HAT: AUROC of the metric for captions without hallucination."""

    description = "HAT (AUROC of the score against the hallucination flag; higher = not hallucinated)"

    def run(self, context: RunContext) -> dict[str, Any]:
        """AUROC for every metric."""
        path, items = _load_list(context.data, "hat-trainval.json")
        captions, refs, flags, images = [], [], [], []
        for index, item in enumerate(items):
            captions.append(_field(path, index, item, "caption", str))
            refs.append(_references(path, index, item))
            flags.append(_field(path, index, item, "contains_hallucination", bool))
            images.append(_field(path, index, item, "image_path", str))
        keep, paths = resolve_images(context, images, images)
        idx = np.flatnonzero(keep)
        scores = score_unique(context, [captions[i] for i in idx], [refs[i] for i in idx],
                              [str(paths[i]) for i in idx] if context.suite.needs_images else None)
        return auroc_table(context, scores, ~np.asarray(flags, dtype=bool)[idx])
