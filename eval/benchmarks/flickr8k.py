"""Flickr8k-Expert and Flickr8k-CF (Hodosh et al. 2013) with the CLIPScore / PAC-S protocol.

Input (`--data`): a folder with the raw files under their usual names (`ExpertAnnotations.txt` or
`CrowdFlowerAnnotations.txt`, plus `Flickr8k.token.txt`; any subset of the rows is valid), or a
clipscore-format json (`{key: {"image_path", "ground_truth": [...], "human_judgement": [{"caption", "rating"}]}}`).

Protocol (the CLIPScore preprocessing that PAC-S uses): references are the judged image's own captions.
Expert: a pair whose candidate is one of those captions is excluded (counted); one row per expert rating.
CF: every pair is kept, one row per pair with the share of "yes"; a judged candidate that is one of the image's
captions is removed from that image's references (for all its pairs). A clipscore json is used as given (its
`ground_truth` already follows these rules). NaN ratings are skipped and counted; Kendall τb and τc × 100.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pacs.eval.benchmarks import Benchmark, RunContext, kendall_table, register_benchmark, resolve_images, score_unique
from pacs.metric.common.errors import InputError
from pacs.metric.common.json_input import read_json_file

log = logging.getLogger(__name__)

TOKEN_FILE = "Flickr8k.token.txt"
EXPERT_FILE = "ExpertAnnotations.txt"
CF_FILE = "CrowdFlowerAnnotations.txt"


@dataclass
class JudgedRows:
    """One row per human judgment: the judged image, its references, the candidate and the rating."""

    image_ids: list[str]
    image_paths: list[str | None]
    candidates: list[str]
    references: list[list[str]]
    ratings: np.ndarray


def normalise_spaces(text: str) -> str:
    """Collapse whitespace as the clipscore loader does (`' '.join(text.split())`)."""
    return " ".join(text.split())


def read_token_file(path: Path) -> dict[str, str]:
    """`{caption id: caption}` from `Flickr8k.token.txt` (`<image>#<k><TAB><caption>`); bad lines name file:line."""
    captions: dict[str, str] = {}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            key, tab, caption = line.partition("\t")
            if not tab or "#" not in key:
                raise InputError(f"{path}:{number}: expected '<image>#<k><TAB><caption>', got {line[:80]!r}")
            captions[key] = caption
    return captions


def image_references(captions: dict[str, str]) -> dict[str, list[str]]:
    """`{image: [its captions in #k order]}`."""
    by_image: dict[str, list[tuple[int, str]]] = {}
    for key, caption in captions.items():
        image, _, k = key.rpartition("#")
        by_image.setdefault(image, []).append((int(k) if k.isdigit() else 0, caption))
    return {image: [c for _, c in sorted(items)] for image, items in by_image.items()}


def _parse_annotation(path: Path, kind: str) -> list[tuple[int, str, str, list[float]]]:
    """Rows `(line, image, caption id, ratings)` of an Expert (3 ratings) or CF (%yes, #yes, #no) file."""
    rows = []
    width = 5
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            fields = line.rstrip("\n").split("\t")
            if len(fields) != width:
                raise InputError(f"{path}:{number}: expected {width} tab-separated fields "
                                 f"(image, caption id, {'3 ratings' if kind == 'expert' else '%yes, #yes, #no'}), "
                                 f"got {len(fields)}")
            try:
                values = [float(value) for value in fields[2:]]
            except ValueError:
                raise InputError(f"{path}:{number}: ratings must be numbers, got {fields[2:]}") from None
            rows.append((number, fields[0], fields[1], values))
    return rows


def load_raw(folder: Path, kind: str, context: RunContext | None = None) -> JudgedRows:
    """Judged rows from the raw Flickr8k files in `folder` (`kind` 'expert' or 'cf')."""
    annotation = folder / (EXPERT_FILE if kind == "expert" else CF_FILE)
    tokens = folder / TOKEN_FILE
    for path in (annotation, tokens):
        if not path.is_file():
            raise InputError(f"{path} not found (data= must hold {annotation.name} and {TOKEN_FILE})",
                             parameter="data")
    captions = read_token_file(tokens)
    refs_of = image_references(captions)
    parsed = _parse_annotation(annotation, kind)
    for number, image, caption_id, _ in parsed:
        if caption_id not in captions:
            raise InputError(f"{annotation}:{number}: caption id {caption_id!r} is not in {TOKEN_FILE}")
        if image not in refs_of:
            raise InputError(f"{annotation}:{number}: image {image!r} has no captions in {TOKEN_FILE}")
    # CF: every pair is kept and a judged candidate that is one of the image's captions is removed from that
    # image's references (for all of its pairs); Expert: such pairs are dropped (the SPICE/CLIPScore protocol).
    removed: dict[str, set[str]] = {}
    if kind == "cf":
        for _, image, caption_id, _ in parsed:
            if captions[caption_id] in refs_of[image]:
                removed.setdefault(image, set()).add(captions[caption_id])
    rows = JudgedRows([], [], [], [], np.zeros(0))
    ratings: list[float] = []
    for number, image, caption_id, values in parsed:
        caption = captions[caption_id]
        if kind == "expert" and caption in refs_of[image]:
            _count(context, "excluded_candidate_is_reference")
            continue
        references = [normalise_spaces(r) for r in refs_of[image] if r not in removed.get(image, ())]
        if not references:
            raise InputError(f"{annotation}:{number}: image {image!r} has no reference left")
        candidate = normalise_spaces(caption)
        judgements = values if kind == "expert" else [values[0]]
        for rating in judgements:
            if math.isnan(rating):
                _count(context, "skipped_nan_rating")
                continue
            rows.image_ids.append(image)
            rows.image_paths.append(image)
            rows.candidates.append(candidate)
            rows.references.append(references)
            ratings.append(rating)
    if removed:
        _count(context, "references_removed_as_judged_candidates", sum(map(len, removed.values())))
    rows.ratings = np.asarray(ratings, dtype=np.float64)
    return rows


def load_clipscore_json(path: Path, context: RunContext | None = None) -> JudgedRows:
    """Judged rows from a clipscore-format json (one row per `human_judgement`)."""
    data = read_json_file(path, "clipscore-format")
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected an object keyed by image")
    rows = JudgedRows([], [], [], [], np.zeros(0))
    ratings: list[float] = []
    for key, entry in data.items():
        try:
            references = [normalise_spaces(r) for r in entry["ground_truth"]]
            judgements = entry["human_judgement"]
            image_path = entry.get("image_path")
        except (TypeError, KeyError) as error:
            raise InputError(f"{path}: entry {key!r} lacks {error} (needs ground_truth, human_judgement)") from None
        if not references:
            raise InputError(f"{path}: entry {key!r} has no ground_truth references")
        for index, judgement in enumerate(judgements):
            try:
                candidate, rating = normalise_spaces(judgement["caption"]), judgement["rating"]
            except (TypeError, KeyError) as error:
                raise InputError(f"{path}: entry {key!r} human_judgement[{index}] lacks {error}") from None
            rating = float("nan") if rating is None else float(rating)
            if math.isnan(rating):
                _count(context, "skipped_nan_rating")
                continue
            rows.image_ids.append(str(key))
            rows.image_paths.append(image_path)
            rows.candidates.append(candidate)
            rows.references.append(references)
            ratings.append(rating)
    rows.ratings = np.asarray(ratings, dtype=np.float64)
    return rows


def _count(context: RunContext | None, key: str, amount: int = 1) -> None:
    """Count a skip when a context is given."""
    if context is not None:
        context.count(key, amount)


def load_rows(data: Path, kind: str, context: RunContext | None = None) -> JudgedRows:
    """Rows from a raw-files folder or a clipscore json."""
    if data.is_dir():
        return load_raw(data, kind, context)
    if data.is_file():
        return load_clipscore_json(data, context)
    raise InputError(f"data= {data} does not exist", parameter="data")


def correlate_rows(rows: JudgedRows, context: RunContext) -> dict[str, Any]:
    """Kendall table of the judged rows for every metric of the context."""
    if len(rows.ratings) == 0:
        raise InputError(f"{context.data}: no judged pairs left to correlate")
    keep, paths = resolve_images(context, rows.image_ids, rows.image_paths)
    index = np.flatnonzero(keep)
    images = [paths[i] for i in index] if context.suite.needs_images else None
    scores = score_unique(context, [rows.candidates[i] for i in index], [rows.references[i] for i in index],
                          images)
    return kendall_table(context, scores, rows.ratings[index])


@register_benchmark("flickr8k-expert")
class Flickr8kExpert(Benchmark):
    """Flickr8k-Expert: three expert ratings (1-4) per pair; Kendall τb/τc."""

    description = "Flickr8k-Expert (Kendall tau-b / tau-c, one row per expert rating)"

    def run(self, context: RunContext) -> dict[str, Any]:
        """Correlate every metric with the expert ratings."""
        return correlate_rows(load_rows(context.data, "expert", context), context)


@register_benchmark("flickr8k-cf")
class Flickr8kCF(Benchmark):
    """Flickr8k-CF: share of crowd 'yes' per pair; Kendall τb/τc."""

    description = "Flickr8k-CF (Kendall tau-b / tau-c of the share of 'yes')"

    def run(self, context: RunContext) -> dict[str, Any]:
        """Correlate every metric with the crowd's share of 'yes'."""
        return correlate_rows(load_rows(context.data, "cf", context), context)
