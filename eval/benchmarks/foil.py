"""FOIL-COCO (Shekhar et al. 2017): a correct COCO caption vs the same caption with one word foiled.

Input (`--data`): a folder with `foilv1.0_test_2017.json` (COCO-style `annotations` with `image_id`, `id`,
`caption`, `foil` (bool), `target_word`, `foil_word`) and COCO `captions_val2014.json` (`annotations` with
`image_id`, `id`, `caption`). A foil caption is paired with the correct caption of the same image carrying the
same `id` (else the correct caption that becomes the foil by swapping `target_word` for `foil_word`);
unpaired foils are counted. References are the image's COCO captions other than the correct one: the first
one ("1-ref") or the first four ("4-ref"). Accuracy ×100 of scoring the correct caption higher (ties = half);
`mean` is the mean of the two settings.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from pacs.eval.benchmarks import Benchmark, RunContext, accuracy_table, register_benchmark, resolve_images, score_unique
from pacs.metric.common.errors import InputError
from pacs.metric.common.json_input import read_json_file

FOIL_FILE = "foilv1.0_test_2017.json"
COCO_FILE = "captions_val2014.json"
SETTINGS = ("1-ref", "4-ref")


def _annotations(path: Path) -> list[dict]:
    """The `annotations` list of a COCO-style json, each checked for image_id and caption."""
    if not path.is_file():
        raise InputError(f"{path} not found (data= must hold {FOIL_FILE} and {COCO_FILE})", parameter="data")
    data = read_json_file(path, "annotation")
    annotations = data.get("annotations") if isinstance(data, dict) else None
    if not isinstance(annotations, list):
        raise InputError(f"{path}: expected an object with an 'annotations' list")
    for index, item in enumerate(annotations):
        if not isinstance(item, dict) or "image_id" not in item or not isinstance(item.get("caption"), str):
            raise InputError(f"{path}: annotations[{index}] lacks 'image_id' or a string 'caption'")
    return annotations


def _norm(text: str) -> str:
    """Lower-case words for matching captions."""
    return " ".join(re.findall(r"[\w']+", text.lower()))


def _swap(caption: str, target: str, foil: str) -> str:
    """The caption with the first whole-word `target` replaced by `foil` (normalised)."""
    words = _norm(caption).split()
    target_words = _norm(target).split()
    for i in range(len(words) - len(target_words) + 1):
        if words[i:i + len(target_words)] == target_words:
            return " ".join(words[:i] + _norm(foil).split() + words[i + len(target_words):])
    return ""


def load_foil_pairs(folder: Path, context: RunContext | None = None) -> list[dict[str, Any]]:
    """Pairs `{image_id, correct, foil, references}` (references: other COCO captions of the image)."""
    foil_path = folder / FOIL_FILE
    foil_annotations = _annotations(foil_path)
    coco = _annotations(folder / COCO_FILE)
    coco_by_image: dict[str, list[dict]] = {}
    for item in coco:
        coco_by_image.setdefault(str(item["image_id"]), []).append(item)
    correct_by_image: dict[str, list[dict]] = {}
    foils: list[tuple[int, dict]] = []
    for index, item in enumerate(foil_annotations):
        if "foil" not in item:
            raise InputError(f"{foil_path}: annotations[{index}] lacks 'foil'")
        if item["foil"]:
            for key in ("target_word", "foil_word"):
                if not isinstance(item.get(key), str):
                    raise InputError(f"{foil_path}: annotations[{index}] (a foil) lacks a string {key!r}")
            foils.append((index, item))
        else:
            correct_by_image.setdefault(str(item["image_id"]), []).append(item)
    pairs = []
    for index, item in foils:
        image = str(item["image_id"])
        if image not in coco_by_image:
            raise InputError(f"{foil_path}: annotations[{index}] image_id {item['image_id']!r} is not in {COCO_FILE}")
        options = correct_by_image.get(image, [])
        match = next((c for c in options if "id" in item and c.get("id") == item["id"]), None)
        if match is None:
            swapped = _norm(item["caption"])
            match = next((c for c in options if _swap(c["caption"], item["target_word"], item["foil_word"]) == swapped),
                         None)
        if match is None:
            if context is not None:
                context.count("unpaired_foil_captions")
            continue
        correct_norm = _norm(match["caption"])
        refs = [c["caption"] for c in coco_by_image[image] if _norm(c["caption"]) != correct_norm]
        if len(refs) < 4:
            raise InputError(f"{COCO_FILE}: image {image} has {len(refs)} references besides the correct caption "
                             "(4 needed for the 4-ref setting)")
        pairs.append({"image_id": image, "correct": match["caption"], "foil": item["caption"], "references": refs})
    if not pairs:
        raise InputError(f"{foil_path}: no foil caption could be paired with its correct caption")
    return pairs


def coco_image_name(image_id: str) -> str:
    """The val2014 file name of a COCO image id."""
    return f"COCO_val2014_{int(image_id):012d}.jpg" if str(image_id).isdigit() else str(image_id)


@register_benchmark("foil")
class Foil(Benchmark):
    """FOIL accuracy with 1 and 4 references."""

    description = "FOIL-COCO (accuracy of preferring the correct caption; 1-ref and 4-ref)"

    def run(self, context: RunContext) -> dict[str, Any]:
        """Accuracy per setting and their mean."""
        pairs = load_foil_pairs(context.data, context)
        keep, paths = resolve_images(context, [p["image_id"] for p in pairs],
                                     [coco_image_name(p["image_id"]) for p in pairs])
        idx = np.flatnonzero(keep)
        images = [str(paths[i]) for i in idx] if context.suite.needs_images else None
        correct = [pairs[i]["correct"] for i in idx]
        foil = [pairs[i]["foil"] for i in idx]
        score_a: dict[str, list] = {}
        score_b: dict[str, list] = {}
        for setting, count in zip(SETTINGS, (1, 4)):
            refs = [pairs[i]["references"][:count] for i in idx]
            scores = score_unique(context, correct + foil, refs + refs, (images + images) if images else None)
            for name, values in scores.items():
                score_a.setdefault(name, []).append(values[: len(idx)])
                score_b.setdefault(name, []).append(values[len(idx):])
        a = {name: np.concatenate(v) for name, v in score_a.items()}
        b = {name: np.concatenate(v) for name, v in score_b.items()}
        categories = np.repeat(np.array(SETTINGS), len(idx))
        table = accuracy_table(context, a, b, np.ones(len(categories), dtype=bool), categories, SETTINGS)
        for row in table.values():
            if "n" in row:
                row["n"] = len(idx)
        return table
