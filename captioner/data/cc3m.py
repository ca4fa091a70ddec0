"""CC3M validation: img2dataset "files" output (`NNNNN/KEY.jpg` + `KEY.txt`) or a TSV `caption<TAB>path`."""
from __future__ import annotations

import csv
from pathlib import Path

from pacs.captioner.data.datasets import CaptionDataset, CaptionItem, register_dataset
from pacs.captioner.data.parsing import confined_root, image_file
from pacs.metric.common.errors import InputError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")


@register_dataset("cc3m")
def load_cc3m(path: Path, image_root: Path | None = None, split: str = "val") -> CaptionDataset:
    """CC3M from an img2dataset folder (ids = keys) or a TSV file (ids = image paths without extension)."""
    if path.is_dir():
        return _load_img2dataset(path, split)
    return _load_tsv(path, image_root if image_root is not None else path.parent, split)


def _load_img2dataset(root: Path, split: str) -> CaptionDataset:
    """Walk `NNNNN/` shard folders; each `KEY.txt` holds the caption of `KEY.<image suffix>`."""
    shards = sorted(p for p in root.iterdir() if p.is_dir() and p.name.isdigit())
    if not shards:
        raise InputError(f"{root}: no img2dataset shard folders (NNNNN/) found")
    items: list[CaptionItem] = []
    seen: dict[str, Path] = {}
    for shard in shards:
        images = {p.stem: p for p in shard.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES}
        texts = {p.stem: p for p in shard.glob("*.txt")}
        for key in sorted(set(images) - set(texts)):
            raise InputError(f"{images[key]}: image without its caption file {key}.txt")
        for key in sorted(texts):
            if key in seen:
                raise InputError(f"{texts[key]}: key {key} also in {seen[key]}")
            seen[key] = texts[key]
            caption = texts[key].read_text(encoding="utf-8").strip()
            if not caption:
                raise InputError(f"{texts[key]}: empty caption")
            image = images.get(key, shard / f"{key}.jpg")
            items.append(CaptionItem(key, image, [caption], split, {"shard": shard.name}))
    return CaptionDataset("cc3m", items, source=str(root))


def _load_tsv(tsv: Path, root: Path, split: str) -> CaptionDataset:
    """One `caption<TAB>path` row per caption; rows with the same path are captions of one image."""
    if not tsv.is_file():
        raise InputError(f"{tsv}: file not found")
    by_path: dict[str, CaptionItem] = {}
    confined = confined_root(root)
    with open(tsv, encoding="utf-8", newline="") as handle:
        for line_number, row in enumerate(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE), start=1):
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != 2:
                raise InputError(f"{tsv}: line {line_number}: expected 'caption<TAB>path', got {len(row)} fields")
            caption, relative = row[0].strip(), row[1].strip()
            if not caption:
                raise InputError(f"{tsv}: line {line_number}: empty caption")
            if not relative:
                raise InputError(f"{tsv}: line {line_number}: empty image path")
            if "://" in relative:
                raise InputError(f"{tsv}: line {line_number}: {relative[:60]!r} is a URL; download the images "
                                 "first (e.g. img2dataset) and list local paths")
            if relative not in by_path:
                image_id = Path(relative).with_suffix("").as_posix()
                image = image_file(confined, relative, f"{tsv}: line {line_number}")
                by_path[relative] = CaptionItem(image_id, image, [], split, {"line": line_number})
            by_path[relative].captions.append(caption)
    ids = {}
    for relative, item in by_path.items():
        if item.image_id in ids:
            raise InputError(f"{tsv}: paths {ids[item.image_id]!r} and {relative!r} give the same image id")
        ids[item.image_id] = relative
    return CaptionDataset("cc3m", list(by_path.values()), source=str(tsv))
