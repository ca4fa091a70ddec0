"""Readers for `pacs score` inputs: candidates, references, image lookup (docs/data_layouts.md)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metric.common.errors import InputError
from metric.scoring.images import IMAGE_SUFFIXES, ImageFinder  # noqa: F401 (re-exported)


@dataclass
class Candidate:
    """One caption to score: its image id as written in the input, and the caption."""

    image_id: Any
    caption: str

    @property
    def key(self) -> str:
        """The image id as a string (the lookup key for images and references)."""
        return str(self.image_id)


def read_json(path: str | os.PathLike, what: str) -> Any:
    """Parse a JSON file; InputError naming the file (and line/column) when missing or malformed."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{what} file not found: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise InputError(f"{path}: malformed JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 text ({error})") from None


def load_candidates(path: str | os.PathLike) -> list[Candidate]:
    """Read `{"image_id": "caption"}` or a COCO-results list `[{"image_id", "caption"}]` (ids may repeat)."""
    data = read_json(path, "candidates")
    candidates: list[Candidate] = []
    if isinstance(data, dict):
        for image_id, caption in data.items():
            if not isinstance(caption, str):
                raise InputError(f"{path}: candidate for image id {image_id!r} is not a string: {caption!r}")
            candidates.append(Candidate(image_id, caption))
    elif isinstance(data, list):
        for index, item in enumerate(data):
            if not isinstance(item, dict) or "image_id" not in item or "caption" not in item:
                raise InputError(f"{path}: entry #{index} is not an object with 'image_id' and 'caption': "
                                 f"{str(item)[:80]}")
            image_id, caption = item["image_id"], item["caption"]
            if not isinstance(image_id, (str, int)) or isinstance(image_id, bool):
                raise InputError(f"{path}: entry #{index} has an image_id that is not a string or integer: "
                                 f"{image_id!r}")
            if not isinstance(caption, str):
                raise InputError(f"{path}: candidate #{index} (image id {image_id!r}) is not a string: {caption!r}")
            candidates.append(Candidate(image_id, caption))
    else:
        raise InputError(f"{path}: candidates must be a JSON object {{image_id: caption}} or a list of "
                         f"{{image_id, caption}} objects, not {type(data).__name__}")
    if not candidates:
        raise InputError(f"{path}: no candidates")
    return candidates


def load_references(path: str | os.PathLike) -> dict[str, list[str]]:
    """Read `{"image_id": ["ref", ...]}` or COCO annotations `{"annotations": [{"image_id", "caption"}]}`."""
    data = read_json(path, "references")
    references: dict[str, list[str]] = {}
    if isinstance(data, dict) and isinstance(data.get("annotations"), list):
        for index, item in enumerate(data["annotations"]):
            if not isinstance(item, dict) or "image_id" not in item or "caption" not in item:
                raise InputError(f"{path}: annotations[{index}] is not an object with 'image_id' and 'caption'")
            if not isinstance(item["caption"], str):
                raise InputError(f"{path}: annotations[{index}] (image id {item['image_id']!r}) has a caption that "
                                 f"is not a string: {item['caption']!r}")
            references.setdefault(str(item["image_id"]), []).append(item["caption"])
    elif isinstance(data, dict):
        for image_id, refs in data.items():
            if isinstance(refs, str):
                refs = [refs]
            if not isinstance(refs, list) or not refs:
                raise InputError(f"{path}: references of image id {image_id!r} must be a non-empty list of strings")
            for ref in refs:
                if not isinstance(ref, str):
                    raise InputError(f"{path}: a reference of image id {image_id!r} is not a string: {ref!r}")
            references[str(image_id)] = list(refs)
    else:
        raise InputError(f"{path}: references must be {{image_id: [captions]}} or {{'annotations': [...]}}")
    return references


def references_for(candidates: list[Candidate], references: dict[str, list[str]], path: str | os.PathLike
                   ) -> list[list[str]]:
    """The reference list of every candidate; InputError naming the first ids that have none."""
    missing = list(dict.fromkeys(c.key for c in candidates if c.key not in references))
    if missing:
        more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
        raise InputError(f"{path}: no references for candidate image id(s) {', '.join(map(repr, missing[:3]))}{more}")
    return [references[c.key] for c in candidates]


def load_image_map(path: str | os.PathLike) -> dict[str, Path]:
    """Read `{image_id: path}`; relative paths are relative to the map file's folder."""
    data = read_json(path, "image map")
    if not isinstance(data, dict):
        raise InputError(f"{path}: an image map must be a JSON object {{image_id: path}}")
    base = Path(path).resolve().parent
    result: dict[str, Path] = {}
    for image_id, image_path in data.items():
        if not isinstance(image_path, str):
            raise InputError(f"{path}: path of image id {image_id!r} is not a string: {image_path!r}")
        result[str(image_id)] = (base / image_path) if not os.path.isabs(image_path) else Path(image_path)
    return result


def resolve_image(image_id: str, images_dir: Path | None, image_map: dict[str, Path] | None) -> Path:
    """Find the file of an image id (`metric.scoring.images.ImageFinder`: the map first, then DIR/<id>, then
    DIR/<id>.{jpg,jpeg,png} in any case); InputError naming the id when none or several match."""
    return ImageFinder(images_dir, image_map).resolve(image_id)
