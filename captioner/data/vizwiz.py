"""VizWiz-Captions validation: `annotations/val.json`; rejected and pre-canned captions are dropped and counted."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from pacs.captioner.data.coco_style import group_coco_captions
from pacs.captioner.data.datasets import CaptionDataset, CaptionItem, register_dataset
from pacs.captioner.data.parsing import confined_root, image_file, read_json
from pacs.metric.common.errors import InputError


def vizwiz_drop_reason(annotation: dict[str, Any], at: str) -> str | None:
    """'rejected' or 'precanned' when the caption must be dropped (rejected wins when both), else None."""
    for flag, reason in (("is_rejected", "dropped_rejected"), ("is_precanned", "dropped_precanned")):
        value = annotation.get(flag, False)
        if not isinstance(value, bool):
            raise InputError(f"{at}.{flag}: expected true or false, got {value!r}")
        if value:
            return reason
    return None


@register_dataset("vizwiz")
def load_vizwiz(path: Path, image_root: Path | None = None, split: str = "val") -> CaptionDataset:
    """VizWiz captions from the data-set folder (holding `annotations/<split>.json`) or the json file itself."""
    json_path = path / "annotations" / f"{split}.json" if path.is_dir() else path
    where = str(json_path)
    images, captions, drops = group_coco_captions(read_json(json_path), where, keep=vizwiz_drop_reason)
    dataset_root = json_path.parent.parent if json_path.parent.name == "annotations" else json_path.parent
    root = confined_root(image_root if image_root is not None else dataset_root / split)
    items: list[CaptionItem] = []
    report = {"dropped_rejected": drops.get("dropped_rejected", 0),
              "dropped_precanned": drops.get("dropped_precanned", 0), "images_without_captions": 0}
    for index, image in enumerate(images):
        refs = captions.get(image["id"], [])
        if not refs:
            report["images_without_captions"] += 1
            continue
        extra = {"text_detected": image["text_detected"]} if "text_detected" in image else {}
        path = image_file(root, image["file_name"], f"{where}: images[{index}]")
        items.append(CaptionItem(str(image["id"]), path, refs, split, extra))
    return CaptionDataset("vizwiz", items, source=where, report=report)
