"""Readers for `pacs score` inputs: candidates, references, image lookup (docs/data_layouts.md)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pacs.metric.common.contained_paths import UserFolder
from pacs.metric.common.errors import InputError
from pacs.metric.common.json_input import check_text, read_json_file
from pacs.metric.scoring.image_lookup import IMAGE_SUFFIXES, ImageFinder, id_rule_hint  # noqa: F401 (re-exported)


@dataclass
class Candidate:
    """One caption to score: its image id as written in the input, and the caption."""

    image_id: Any
    caption: str

    @property
    def key(self) -> str:
        """The image id as a string (the lookup key for images and references)."""
        return str(self.image_id)


def _caption_text(path: str | os.PathLike, text: str, what: str) -> str:
    """`text` when it is valid Unicode text; InputError `<path>: <what> is not valid Unicode text ...` otherwise."""
    return check_text(text, f"{path}: {what}")


def _check_id(path: str | os.PathLike, image_id: Any) -> None:
    """An image id that is a string must be valid Unicode text (it becomes a file name and an output key)."""
    if isinstance(image_id, str):
        check_text(image_id, f"{path}: image id {image_id!r}")


def load_candidates(path: str | os.PathLike, data: Any = None) -> list[Candidate]:
    """Read `{"image_id": "caption"}` or a COCO-results list `[{"image_id", "caption"}]` (ids may repeat); with
    `data` (the same layout, in memory), check that instead, naming it `path` in messages."""
    if data is None:
        data = read_json_file(path, "candidates", check_strings=False)  # captions are checked below, named by image id
    candidates: list[Candidate] = []
    if isinstance(data, dict):
        for image_id, caption in data.items():
            if not isinstance(caption, str):
                raise InputError(f"{path}: candidate for image id {image_id!r} is not a string: {caption!r}")
            _check_id(path, image_id)
            candidates.append(Candidate(image_id, _caption_text(path, caption, f"caption for image {image_id!r}")))
    elif isinstance(data, list):
        for index, item in enumerate(data):
            if not isinstance(item, dict) or "image_id" not in item or "caption" not in item:
                raise InputError(f"{path}: entry #{index} is not an object with 'image_id' and 'caption': "
                                 f"{item!r:.80}")
            image_id, caption = item["image_id"], item["caption"]
            if not isinstance(image_id, (str, int)) or isinstance(image_id, bool):
                raise InputError(f"{path}: entry #{index} has an image_id that is not a string or integer: "
                                 f"{image_id!r}")
            if not isinstance(caption, str):
                raise InputError(f"{path}: candidate #{index} (image id {image_id!r}) is not a string: {caption!r}")
            _check_id(path, image_id)
            candidates.append(Candidate(image_id, _caption_text(
                path, caption, f"caption #{index} for image {image_id!r}")))
    else:
        raise InputError(f"{path}: candidates must be a JSON object {{image_id: caption}} or a list of "
                         f"{{image_id, caption}} objects, not {type(data).__name__}")
    if not candidates:
        raise InputError(f"{path}: no candidates")
    return candidates


def load_references(path: str | os.PathLike, data: Any = None) -> dict[str, list[str]]:
    """Read `{"image_id": ["ref", ...]}` or COCO annotations `{"annotations": [{"image_id", "caption"}]}`; with
    `data` (the same layout, in memory), check that instead, naming it `path` in messages."""
    if data is None:
        data = read_json_file(path, "references", check_strings=False)  # references are checked below, named by id
    references: dict[str, list[str]] = {}
    if isinstance(data, dict) and isinstance(data.get("annotations"), list):
        for index, item in enumerate(data["annotations"]):
            if not isinstance(item, dict) or "image_id" not in item or "caption" not in item:
                raise InputError(f"{path}: annotations[{index}] is not an object with 'image_id' and 'caption'")
            if not isinstance(item["caption"], str):
                raise InputError(f"{path}: annotations[{index}] (image id {item['image_id']!r}) has a caption that "
                                 f"is not a string: {item['caption']!r}")
            _check_id(path, item["image_id"])
            references.setdefault(str(item["image_id"]), []).append(_caption_text(
                path, item["caption"], f"annotations[{index}] (reference for image {item['image_id']!r})"))
    elif isinstance(data, dict):
        for image_id, refs in data.items():
            if isinstance(refs, str):
                refs = [refs]
            if not isinstance(refs, list) or not refs:
                raise InputError(f"{path}: references of image id {image_id!r} must be a non-empty list of strings")
            for number, ref in enumerate(refs):
                if not isinstance(ref, str):
                    raise InputError(f"{path}: a reference of image id {image_id!r} is not a string: {ref!r}")
                _caption_text(path, ref, f"reference #{number} for image {image_id!r}")
            _check_id(path, image_id)
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
        raise InputError(f"{path}: no references for candidate image id(s) {', '.join(map(repr, missing[:3]))}{more}"
                         f"{id_rule_hint(missing, references)}")
    return [references[c.key] for c in candidates]


def load_image_map(path: str | os.PathLike) -> dict[str, Path]:
    """Read `{image_id: path}`; relative paths are relative to the map file's folder and stay inside it lexically
    (no `..`; symlinks inside it are followed: `pacs.metric.common.contained_paths.UserFolder`, the rule of `--images`),
    absolute paths are taken as given."""
    data = read_json_file(path, "image map")
    if not isinstance(data, dict):
        raise InputError(f"{path}: an image map must be a JSON object {{image_id: path}}")
    base = Path(path).resolve().parent
    folder = UserFolder(base, f"the image map's folder {base} (or be absolute)")
    result: dict[str, Path] = {}
    for image_id, image_path in data.items():
        if not isinstance(image_path, str):
            raise InputError(f"{path}: path of image id {image_id!r} is not a string: {image_path!r}")
        if os.path.isabs(image_path):
            result[str(image_id)] = Path(image_path)
        else:
            result[str(image_id)] = folder.join(image_path, f"{path}: the entry of image id {image_id!r} "
                                                            f"({image_path!r})")
    return result


def resolve_image(image_id: str, images_dir: Path | None, image_map: dict[str, Path] | None) -> Path:
    """Find the file of an image id (`pacs.metric.scoring.image_lookup.ImageFinder`: the map first, then DIR/<id>, then
    DIR/<id>.{jpg,jpeg,png} in any case); InputError naming the id when none or several match."""
    return ImageFinder(images_dir, image_map).resolve(image_id)
