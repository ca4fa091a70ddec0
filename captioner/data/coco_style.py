"""COCO-style caption files (`images[]` + `annotations[]`), the form of nocaps and VizWiz annotations."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pacs.captioner.data.parsing import nonempty_caption, require
from pacs.metric.common.errors import InputError

AnnotationFilter = Callable[[dict[str, Any], str], str | None]


def group_coco_captions(data: Any, where: str, keep: AnnotationFilter | None = None
                        ) -> tuple[list[dict[str, Any]], dict[Any, list[str]], dict[str, int]]:
    """Return (images, {image id: captions}, drop counts); `keep(annotation, at)` names a drop reason or None."""
    images = require(data, "images", list, where)
    annotations = require(data, "annotations", list, where)
    image_ids: set[Any] = set()
    for index, image in enumerate(images):
        at = f"{where}: images[{index}]"
        image_id = require(image, "id", (int, str), at)
        require(image, "file_name", str, at)
        if image_id in image_ids:
            raise InputError(f"{at}.id: image id {image_id!r} occurs twice")
        image_ids.add(image_id)
    captions: dict[Any, list[str]] = {}
    drops: dict[str, int] = {}
    for index, annotation in enumerate(annotations):
        at = f"{where}: annotations[{index}]"
        image_id = require(annotation, "image_id", (int, str), at)
        if image_id not in image_ids:
            raise InputError(f"{at}.image_id: {image_id!r} is not in images[]")
        caption = require(annotation, "caption", str, at)
        reason = keep(annotation, at) if keep is not None else None
        if reason is not None:
            drops[reason] = drops.get(reason, 0) + 1
            continue
        captions.setdefault(image_id, []).append(nonempty_caption(caption, f"{at}.caption"))
    return images, captions, drops

