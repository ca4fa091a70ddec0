"""Training data for the metric: the positives manifest (JSONL), file-backed and in-memory datasets, collation.

A dataset item is ``(image, caption, gen_image, gen_caption)``: a real pair (v, t), the image v' generated from
the caption t, and the caption t' generated from the image v; images are ``FloatTensor[3, H, W]``.
Manifest lines: ``{"image_id", "caption_id", "real_image", "caption", "gen_caption", "gen_image"}`` (+ optional
``"split"``, ``"seed"``); relative image paths are resolved against ``image_root`` (default: the manifest's folder).
"""
from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError
from torch.utils.data import Dataset

from pacs.metric.common.contained_paths import user_path
from pacs.metric.common.errors import InputError
from pacs.metric.common.json_input import DuplicateKeyError, unique_keys

logger = logging.getLogger(__name__)

MANIFEST_KEYS = ("image_id", "caption_id", "real_image", "caption", "gen_caption", "gen_image")
Preprocess = Callable[[Image.Image], torch.Tensor]


@dataclass
class ManifestRecord:
    """One manifest line: a real pair and its two generated positives."""

    image_id: str
    caption_id: str
    real_image: Path
    caption: str
    gen_caption: str
    gen_image: Path
    split: str | None = None
    line: int = 0


@dataclass
class Manifest:
    """The records read from a manifest and what was skipped (line numbers and reasons)."""

    path: Path
    records: list[ManifestRecord]
    skipped: list[str] = field(default_factory=list)


def _resolve(value: str, root: Path, where: str) -> Path:
    """An absolute path as written (a manifest may point anywhere on purpose); a relative one stays in `root`
    lexically (no `..`; symlinks inside it are followed: `UserFolder`)."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else user_path(root, path, where, f"the image root {root}")


def read_manifest(path: str | os.PathLike, image_root: str | os.PathLike | None = None, skip_missing: bool = False,
                  splits: Sequence[str] | None = None) -> Manifest:
    """Read a positives manifest; a line with missing files is an error naming it, or a counted skip.

    `splits` keeps only records whose ``split`` is listed (records without a split are kept only when
    `splits` is None). Malformed lines (bad JSON, missing keys) are always errors.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"manifest not found: {path}")
    root = Path(image_root) if image_root else path.parent
    records: list[ManifestRecord] = []
    skipped: list[str] = []
    with open(path, encoding="utf-8") as handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw, object_pairs_hook=unique_keys)
            except (json.JSONDecodeError, DuplicateKeyError) as error:
                raise InputError(f"{path} line {number}: invalid JSON: {error}") from None
            if not isinstance(row, dict):
                raise InputError(f"{path} line {number}: expected a JSON object")
            missing_keys = [key for key in MANIFEST_KEYS if key not in row]
            if missing_keys:
                raise InputError(f"{path} line {number}: missing key(s) {', '.join(missing_keys)}")
            record = ManifestRecord(
                image_id=str(row["image_id"]), caption_id=str(row["caption_id"]),
                real_image=_resolve(str(row["real_image"]), root, f"{path} line {number}: real_image"),
                caption=str(row["caption"]),
                gen_caption=str(row["gen_caption"]), gen_image=_resolve(str(row["gen_image"]), root, f"{path} line {number}: gen_image"),
                split=row.get("split"), line=number)
            if splits is not None and record.split not in splits:
                continue
            missing_files = [str(p) for p in (record.real_image, record.gen_image) if not p.is_file()]
            if missing_files:
                reason = f"{path} line {number}: file(s) not found: {', '.join(missing_files)}"
                if not skip_missing:
                    raise InputError(reason + " (use skip_missing= to skip such lines)", parameter="skip_missing")
                skipped.append(reason)
                continue
            records.append(record)
    if skipped:
        logger.warning("%s: skipped %d line(s) with missing files (first: %s)", path, len(skipped), skipped[0])
    return Manifest(path=path, records=records, skipped=skipped)


def load_rgb(path: Path) -> Image.Image:
    """Open an image file as PIL (the preprocess converts to RGB); unreadable files are an InputError."""
    try:
        with Image.open(path) as image:
            image.load()
            return image
    except (OSError, UnidentifiedImageError, Image.DecompressionBombError) as error:  # as `pacs score` refuses it
        raise InputError(f"cannot read image {path}: {error}") from None


class ManifestDataset(Dataset):
    """File-backed positives: images read and preprocessed on access."""

    def __init__(self, records: Sequence[ManifestRecord], preprocess: Preprocess):
        self.records = list(records)
        self.preprocess = preprocess
        self.image_ids = [record.image_id for record in self.records]

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, str, torch.Tensor, str]:
        record = self.records[index]
        return (self.preprocess(load_rgb(record.real_image)), record.caption,
                self.preprocess(load_rgb(record.gen_image)), record.gen_caption)

    def item_pixels(self, index: int) -> torch.Tensor:
        """The two images of item `index` as `__getitem__` gives them, stacked `[2, 3, H, W]` (decoding processes
        compute this; `pacs.metric.training.batches`)."""
        item = self[index]
        return torch.stack([item[0], item[2]])

    def item_texts(self, index: int) -> tuple[str, str]:
        """The two captions of item `index` (what `__getitem__` gives besides the pixels)."""
        record = self.records[index]
        return record.caption, record.gen_caption


class TensorPositivesDataset(Dataset):
    """In-memory positives: lists (or stacked tensors) of images and captions of the same length."""

    def __init__(self, images: Sequence[torch.Tensor] | torch.Tensor, captions: Sequence[str],
                 gen_images: Sequence[torch.Tensor] | torch.Tensor, gen_captions: Sequence[str],
                 image_ids: Sequence[str] | None = None):
        counts = {"images": len(images), "captions": len(captions), "gen_images": len(gen_images),
                  "gen_captions": len(gen_captions)}
        if image_ids is not None:
            counts["image_ids"] = len(image_ids)
        if len(set(counts.values())) != 1:
            raise InputError("mismatched image/caption counts: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
        for name, values in (("captions", captions), ("gen_captions", gen_captions)):
            for index, value in enumerate(values):
                if not isinstance(value, str):
                    raise InputError(f"{name}[{index}] is {type(value).__name__}, expected a string")
        self.images, self.captions = images, list(captions)
        self.gen_images, self.gen_captions = gen_images, list(gen_captions)
        self.image_ids = [str(i) for i in (image_ids if image_ids is not None else range(len(captions)))]

    def __len__(self) -> int:
        return len(self.captions)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, str, torch.Tensor, str]:
        return self.images[index], self.captions[index], self.gen_images[index], self.gen_captions[index]


class ReferencePositivesDataset(Dataset):
    """Cheap positives without generators: t' = another reference caption of the image, v' = an augmented view.

    `items` are ``(image_id, image, captions)`` with a PIL image (or path) and at least two captions; one
    dataset item per (image, caption). `augment` maps a PIL image to another PIL image (random crop + flip
    by default, drawn from python's `random`, so `seed_everything` makes it reproducible).
    """

    def __init__(self, items: Sequence[tuple[str, Image.Image | Path | str, Sequence[str]]], preprocess: Preprocess,
                 augment: Callable[[Image.Image], Image.Image] | None = None):
        self.pairs: list[tuple[int, int]] = []
        self.items = []
        for index, (image_id, image, captions) in enumerate(items):
            if len(captions) < 2:
                raise InputError(f"image {image_id}: needs at least two captions for reference positives, "
                                 f"got {len(captions)}")
            self.items.append((str(image_id), image, list(captions)))
            self.pairs.extend((index, k) for k in range(len(captions)))
        self.preprocess = preprocess
        self.augment = augment or random_view
        self.image_ids = [self.items[i][0] for i, _ in self.pairs]

    def __len__(self) -> int:
        return len(self.pairs)

    def _image(self, index: int) -> Image.Image:
        image = self.items[index][1]
        return image if isinstance(image, Image.Image) else load_rgb(Path(image))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, str, torch.Tensor, str]:
        item, k = self.pairs[index]
        _, _, captions = self.items[item]
        image = self._image(item)
        other = captions[(k + 1) % len(captions)]
        return self.preprocess(image), captions[k], self.preprocess(self.augment(image)), other


def random_view(image: Image.Image, min_scale: float = 0.6) -> Image.Image:
    """A random crop (60-100% of each side) and a random horizontal flip of a PIL image."""
    width, height = image.size
    scale = random.uniform(min_scale, 1.0)
    crop_w, crop_h = max(1, int(width * scale)), max(1, int(height * scale))
    left, top = random.randint(0, width - crop_w), random.randint(0, height - crop_h)
    view = image.crop((left, top, left + crop_w, top + crop_h))
    if random.random() < 0.5:
        view = view.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return view


class ShardedEpochBatches:
    """This process's shares of one epoch's global batches: the same seeded permutation on every process.

    Epoch `epoch` orders the items by ``randperm(n_items)`` seeded with (seed, epoch) (or keeps their order with
    ``shuffle=False``) and cuts full global batches of `batch_size` (the incomplete tail is left out and counted
    in `dropped`); from global batch `start` on, process `rank` of `processes` takes the rank-th of the
    `processes` equal contiguous slices of each, so the shards, concatenated in rank order, are the global batch.
    """

    def __init__(self, n_items: int, batch_size: int, seed: int, epoch: int, start: int = 0, rank: int = 0,
                 processes: int = 1, shuffle: bool = True):
        if batch_size < 1 or processes < 1 or batch_size % processes or not 0 <= rank < processes:
            raise InputError(f"batch_size ({batch_size}) must be a positive multiple of the number of processes "
                             f"({processes})")
        if shuffle:
            order = torch.randperm(n_items, generator=torch.Generator().manual_seed(seed * 100003 + epoch)).tolist()
        else:
            order = list(range(n_items))
        share = batch_size // processes
        self.batch_size, self.share, self.dropped = batch_size, share, n_items % batch_size
        full = [order[i:i + batch_size] for i in range(0, n_items - batch_size + 1, batch_size)]
        self.batches = [batch[rank * share:(rank + 1) * share] for batch in full[start:]]

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def split_micro_batches(batch: tuple[torch.Tensor, list[str], torch.Tensor, list[str]], micro_batch_size: int
                        ) -> list[tuple[torch.Tensor, list[str], torch.Tensor, list[str]]]:
    """Cut a collated positives batch into consecutive micro-batches of `micro_batch_size` (which must divide it)."""
    n = len(batch[1])
    if micro_batch_size < 1 or n % micro_batch_size:
        raise InputError(f"micro_batch_size ({micro_batch_size}) must divide the batch of {n} pairs")
    return [tuple(part[i:i + micro_batch_size] for part in batch)  # type: ignore[misc]
            for i in range(0, n, micro_batch_size)]


def collate_positives(batch: Sequence[tuple[torch.Tensor, str, torch.Tensor, str]]
                      ) -> tuple[torch.Tensor, list[str], torch.Tensor, list[str]]:
    """Stack images, keep captions as lists: ``(images, captions, gen_images, gen_captions)``."""
    images, captions, gen_images, gen_captions = zip(*batch)
    return torch.stack(images), list(captions), torch.stack(gen_images), list(gen_captions)
