"""nocaps validation: `nocaps_val_4500_captions.json` (COCO-style, with a `domain` per image)."""
from __future__ import annotations

from pathlib import Path

from pacs.captioner.data.coco_style import group_coco_captions
from pacs.captioner.data.datasets import CaptionDataset, CaptionItem, register_dataset
from pacs.captioner.data.parsing import confined_root, image_file, read_json, require
from pacs.metric.common.errors import InputError

NOCAPS_FILE = "nocaps_val_4500_captions.json"
NOCAPS_DOMAINS = ("in-domain", "near-domain", "out-domain")


@register_dataset("nocaps")
def load_nocaps(path: Path, image_root: Path | None = None, split: str = "val") -> CaptionDataset:
    """nocaps captions; `extra["domain"]` is in-domain, near-domain or out-domain; ids are the nocaps ids."""
    json_path = path / NOCAPS_FILE if path.is_dir() else path
    where = str(json_path)
    images, captions, _ = group_coco_captions(read_json(json_path), where)
    root = confined_root(image_root if image_root is not None else json_path.parent / split)
    items: list[CaptionItem] = []
    report = {"images_without_captions": 0}
    for index, image in enumerate(images):
        domain = require(image, "domain", str, f"{where}: images[{index}]")
        if domain not in NOCAPS_DOMAINS:
            raise InputError(f"{where}: images[{index}].domain: unknown domain {domain!r} "
                             f"(expected one of {', '.join(NOCAPS_DOMAINS)})")
        refs = captions.get(image["id"], [])
        if not refs:
            report["images_without_captions"] += 1
            continue
        extra = {"domain": domain}
        if "open_images_id" in image:
            extra["open_images_id"] = image["open_images_id"]
        path = image_file(root, image["file_name"], f"{where}: images[{index}]")
        items.append(CaptionItem(str(image["id"]), path, refs, split, extra))
    return CaptionDataset("nocaps", items, source=where, report=report)
