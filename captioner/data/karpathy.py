"""Karpathy split files: `dataset_coco.json`, `dataset_flickr8k.json`, `dataset_flickr30k.json`."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pacs.captioner.data.datasets import CaptionDataset, CaptionItem, check_unique_ids, register_dataset
from pacs.captioner.data.json_stream import stream_array
from pacs.captioner.data.parsing import UserFolder, confined_root, image_file, nonempty_caption, require
from pacs.captioner.data.streaming import ItemStream, register_dataset_stream
from pacs.metric.common.errors import InputError

KARPATHY_SPLITS = ("train", "restval", "val", "test")


def _caption_of(sentence: object, where: str, use_tokens: bool) -> str:
    """The reference text of one Karpathy sentence: `raw`, or the space-joined `tokens` when asked."""
    if use_tokens:
        tokens = require(sentence, "tokens", list, where)
        if not all(isinstance(token, str) for token in tokens):
            raise InputError(f"{where}.tokens: every token must be a string")
        return nonempty_caption(" ".join(tokens), f"{where}.tokens")
    return nonempty_caption(require(sentence, "raw", str, where), f"{where}.raw")


def stream_karpathy(path: Path, dataset: str, image_root: Path | None = None, merge_restval: bool = True,
                    use_tokens: bool = False) -> ItemStream:
    """A Karpathy split file read one image at a time (ids as in `load_karpathy`; no check of repeated ids:
    `load_karpathy` and `StreamedDataset` make it)."""
    json_path = path / f"dataset_{dataset}.json" if path.is_dir() else path
    if not json_path.is_file():
        raise InputError(f"{json_path}: file not found")
    report = {"restval_merged_into_train": 0, "images_without_captions": 0}
    root = confined_root(image_root if image_root is not None else json_path.parent)
    items = _karpathy_items(json_path, root, merge_restval, use_tokens, report)
    return ItemStream(f"{dataset}-karpathy", items, str(json_path), report)


def _karpathy_items(json_path: Path, root: UserFolder, merge_restval: bool, use_tokens: bool,
                    report: dict[str, int]) -> Iterator[CaptionItem]:
    where = str(json_path)
    images = stream_array(json_path, "images")  # one image object at a time: no parse of the whole file at once
    for index, image in enumerate(images):
        at = f"{where}: images[{index}]"
        filename = require(image, "filename", str, at)
        split = require(image, "split", str, at)
        if split not in KARPATHY_SPLITS:
            raise InputError(f"{at}.split: unknown split {split!r} (expected one of {', '.join(KARPATHY_SPLITS)})")
        if "cocoid" in image:
            image_id = str(require(image, "cocoid", int, at))
        else:
            image_id = Path(filename).stem
        sentences = require(image, "sentences", list, at)
        captions = [_caption_of(sentence, f"{at}.sentences[{k}]", use_tokens) for k, sentence in enumerate(sentences)]
        if not captions:
            report["images_without_captions"] += 1
            continue
        extra: dict[str, object] = {"karpathy_split": split}
        if "imgid" in image:
            extra["imgid"] = image["imgid"]
        if split == "restval" and merge_restval:
            split = "train"
            report["restval_merged_into_train"] += 1
        filepath = image.get("filepath") or ""
        if not isinstance(filepath, str):
            raise InputError(f"{at}.filepath: expected a string")
        yield CaptionItem(image_id, image_file(root, Path(filepath) / filename, at), captions, split, extra)


def load_karpathy(path: Path, dataset: str, image_root: Path | None = None, merge_restval: bool = True,
                  use_tokens: bool = False) -> CaptionDataset:
    """Load a Karpathy split file; COCO ids are `cocoid`, Flickr ids the image file name without extension."""
    stream = stream_karpathy(path, dataset, image_root, merge_restval, use_tokens)
    items = list(stream.items)
    check_unique_ids(items, stream.where)
    return CaptionDataset(stream.name, items, source=stream.where, report=stream.report)


@register_dataset("coco-karpathy")
def load_coco_karpathy(path: Path, image_root: Path | None = None, merge_restval: bool = True,
                       use_tokens: bool = False) -> CaptionDataset:
    """COCO Karpathy splits (`dataset_coco.json`; images under `image_root/<filepath>/<filename>`)."""
    return load_karpathy(path, "coco", image_root, merge_restval, use_tokens)


@register_dataset_stream("coco-karpathy")
def stream_coco_karpathy(path: Path, image_root: Path | None = None, merge_restval: bool = True,
                         use_tokens: bool = False) -> ItemStream:
    """`coco-karpathy`, one image at a time."""
    return stream_karpathy(path, "coco", image_root, merge_restval, use_tokens)


@register_dataset("flickr8k-karpathy")
def load_flickr8k_karpathy(path: Path, image_root: Path | None = None, use_tokens: bool = False) -> CaptionDataset:
    """Flickr8k Karpathy splits (`dataset_flickr8k.json`; images under `image_root/<filename>`)."""
    return load_karpathy(path, "flickr8k", image_root, True, use_tokens)


@register_dataset_stream("flickr8k-karpathy")
def stream_flickr8k_karpathy(path: Path, image_root: Path | None = None, use_tokens: bool = False) -> ItemStream:
    """`flickr8k-karpathy`, one image at a time."""
    return stream_karpathy(path, "flickr8k", image_root, True, use_tokens)


@register_dataset("flickr30k-karpathy")
def load_flickr30k_karpathy(path: Path, image_root: Path | None = None, use_tokens: bool = False) -> CaptionDataset:
    """Flickr30k Karpathy splits (`dataset_flickr30k.json`; images under `image_root/<filename>`)."""
    return load_karpathy(path, "flickr30k", image_root, True, use_tokens)


@register_dataset_stream("flickr30k-karpathy")
def stream_flickr30k_karpathy(path: Path, image_root: Path | None = None, use_tokens: bool = False) -> ItemStream:
    """`flickr30k-karpathy`, one image at a time."""
    return stream_karpathy(path, "flickr30k", image_root, True, use_tokens)
