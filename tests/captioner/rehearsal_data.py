"""Four caption data sets in their released file formats, built from the shared Flickr8k images.

COCO Karpathy (`dataset_coco.json`, cocoids), nocaps (`nocaps_val_4500_captions.json`, nocaps ids, three
domains), VizWiz (`annotations/val.json`) and CC3M (an img2dataset folder). The test sets' ids collide on
purpose: every set numbers its images 1, 2, 3, ... while each set uses different images, which is what
happens with real COCO / nocaps / VizWiz ids.
"""
from __future__ import annotations

import json
import shutil
from collections import defaultdict
from pathlib import Path


def flickr8k_captions(flickr8k: Path) -> dict[str, list[str]]:
    """{image file name: its captions} for the Flickr8k images present in `flickr8k/images`."""
    present = {p.name for p in (flickr8k / "images").glob("*.jpg")}
    captions: dict[str, list[str]] = defaultdict(list)
    for line in (flickr8k / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines():
        key, _, caption = line.partition("\t")
        name = key.split("#")[0]
        if name in present and caption.strip():
            captions[name].append(caption.strip())
    return dict(sorted(captions.items()))


def _link(source: Path, target: Path) -> None:
    """Copy an image into a data set's folder (a symlink pointing outside the image root is refused)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)


def build_rehearsal_sets(flickr8k: Path, root: Path, n_train: int = 24, n_val: int = 4,
                         n_test: int = 4) -> dict[str, dict]:
    """Write the four data sets under `root`; return {set name: test-set config mapping} (+ 'train')."""
    captions = flickr8k_captions(flickr8k)
    names = list(captions)
    cursor = 0

    def take(n: int) -> list[str]:
        nonlocal cursor
        chosen = names[cursor:cursor + n]
        cursor += n
        return chosen

    images = flickr8k / "images"
    # COCO Karpathy: train + val + test, cocoids 1..N in file order (test ids collide with the other sets)
    coco_dir = root / "coco"
    entries = []
    cocoid = 0
    for split, count in (("test", n_test), ("train", n_train), ("val", n_val)):
        for name in take(count):
            cocoid += 1
            folder = "val2014" if split != "train" else "train2014"
            filename = f"COCO_{folder}_{cocoid:012d}.jpg"
            _link(images / name, coco_dir / folder / filename)
            entries.append({"filepath": folder, "filename": filename, "imgid": cocoid - 1, "cocoid": cocoid,
                            "split": split, "sentences": [{"raw": c, "tokens": c.lower().split()}
                                                          for c in captions[name]]})
    (coco_dir / "dataset_coco.json").write_text(json.dumps({"images": entries, "dataset": "coco"}))

    def coco_style(folder: Path, json_path: Path, image_dir: str, extra_of, annotation_extra: dict) -> None:
        images_json, annotations = [], []
        for index, name in enumerate(take(n_test), start=1):
            file_name = f"{index:08d}.jpg"
            _link(images / name, folder / image_dir / file_name)
            images_json.append({"id": index, "file_name": file_name, **extra_of(index)})
            for caption in captions[name]:
                annotations.append({"image_id": index, "id": len(annotations) + 1, "caption": caption,
                                    **annotation_extra})
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps({"images": images_json, "annotations": annotations}))

    domains = ("in-domain", "near-domain", "out-domain")
    nocaps_dir = root / "nocaps"
    coco_style(nocaps_dir, nocaps_dir / "nocaps_val_4500_captions.json", "val",
               lambda i: {"domain": domains[(i - 1) % 3], "open_images_id": f"oi{i:04d}"}, {})
    vizwiz_dir = root / "vizwiz"
    coco_style(vizwiz_dir, vizwiz_dir / "annotations" / "val.json", "val", lambda i: {"text_detected": i % 2 == 0},
               {"is_rejected": False, "is_precanned": False})
    # CC3M img2dataset folder: shard 00000 holding KEY.jpg + KEY.txt, keys "1", "2", ... (colliding too)
    cc3m_dir = root / "cc3m"
    for index, name in enumerate(take(n_test), start=1):
        _link(images / name, cc3m_dir / "00000" / f"{index}.jpg")
        (cc3m_dir / "00000" / f"{index}.txt").write_text(captions[name][0] + "\n")
    return {
        "train": {"name": "coco-karpathy", "path": str(coco_dir / "dataset_coco.json")},
        "coco": {"name": "coco-karpathy", "path": str(coco_dir / "dataset_coco.json"), "split": "test"},
        "nocaps": {"name": "nocaps", "path": str(nocaps_dir / "nocaps_val_4500_captions.json"), "split": "val"},
        "vizwiz": {"name": "vizwiz", "path": str(vizwiz_dir), "split": "val"},
        "cc3m": {"name": "cc3m", "path": str(cc3m_dir), "split": "val"},
    }
