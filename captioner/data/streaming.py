"""Data sets read one item at a time, for training sets too large to hold as objects (COCO: 113k images).

A loader registered with `register_dataset` builds every item (a `CaptionDataset`); a data set may also register
its streaming form with `register_dataset_stream`: `fn(path, image_root=None, **options) -> ItemStream`, whose
`items` yields the same items in the same order. `stream_dataset(...)` gives a `StreamedDataset` either way (a
loaded data set's items when the name has no streaming form), with the same checks and counts as `load_dataset`:
the missing-image policy per item, the `report`, the split counts, one id per image. A streamed data set keeps 8
bytes per image (its id's hash) while it is read; its checks run when its items are exhausted (an error then
names the file and the id, as `load_dataset` does).
"""
from __future__ import annotations

import logging
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pacs.captioner.data.datasets import (
    MISSING_IMAGE_POLICIES,
    CaptionItem,
    check_splits,
    load_dataset,
    report_missing_images,
    summary_line,
)
from pacs.metric.common.errors import InputError
from pacs.metric.common.spill import id_hash

logger = logging.getLogger(__name__)


@dataclass
class ItemStream:
    """A streaming reader's output: the data set's name, its items (a one-pass iterable), the file errors name,
    and its report (counts the reader fills in while it reads)."""

    name: str
    items: Iterable[CaptionItem]
    where: str
    report: dict[str, int] = field(default_factory=dict)


StreamReader = Callable[..., ItemStream]
DATASET_STREAMS: dict[str, StreamReader] = {}


def register_dataset_stream(name: str) -> Callable[[StreamReader], StreamReader]:
    """Decorator registering the streaming form `fn(path, image_root=None, **options) -> ItemStream` of data set
    `name` (registered with `register_dataset` too: the streaming form must yield the loader's items)."""
    key = name.lower()

    def decorate(fn: StreamReader) -> StreamReader:
        if key in DATASET_STREAMS:
            raise ValueError(f"dataset stream {name!r} is already registered")
        DATASET_STREAMS[key] = fn
        return fn

    return decorate


class StreamedDataset:
    """The items of a data set read once, in order, with `load_dataset`'s checks; `split_counts`, `report` and
    `summary()` are complete once the items are exhausted (their checks have run then)."""

    def __init__(self, name: str, path: str | Path, image_root: str | Path | None = None,
                 missing_images: str = "skip", **options: Any) -> None:
        if missing_images not in MISSING_IMAGE_POLICIES:
            raise InputError(f"missing_images={missing_images!r}: choose one of {', '.join(MISSING_IMAGE_POLICIES)}")
        self.path = Path(path)
        if not self.path.exists():
            raise InputError(f"{name}: {self.path} does not exist")
        self.policy = missing_images
        self.streamed = name.lower() in DATASET_STREAMS
        self._open: Callable[[], ItemStream]
        if self.streamed:
            reader = DATASET_STREAMS[name.lower()]
            root = Path(image_root) if image_root is not None else None
            self._open = lambda: reader(self.path, image_root=root, **options)
            self.name = name
        else:  # no streaming form: the loader's data set (its checks already ran)
            loaded = load_dataset(name, self.path, image_root, missing_images, **options)
            self._open = lambda: ItemStream(loaded.name, loaded.items, str(self.path), loaded.report)
            self.name = loaded.name
        self.split_counts: dict[str, int] = {}
        self.report: dict[str, int] = {}
        self.captions = 0
        self._used = False

    def __iter__(self) -> Iterator[CaptionItem]:
        if self._used:
            raise RuntimeError("a StreamedDataset is read once")
        self._used = True
        stream = self._open()
        self.name = stream.name
        hashes = array("Q")
        missing, example, total = 0, None, 0
        for item in stream.items:
            total += 1
            if self.streamed:
                hashes.append(id_hash(item.image_id))
                if item.image_path is None or not item.image_path.is_file():
                    missing += 1
                    example = example or item
                    if self.policy == "skip":
                        continue
            self.split_counts[item.split] = self.split_counts.get(item.split, 0) + 1
            self.captions += len(item.captions)
            yield item
        self.report = dict(stream.report)
        if self.streamed:
            self._check_unique_ids(np.frombuffer(hashes, dtype=np.uint64), stream.where)
            del hashes
            self.report["missing_images"] = missing
            self._apply_missing_policy(missing, total, example)
        logger.info(self.summary())

    def _check_unique_ids(self, hashes: np.ndarray, where: str) -> None:
        """InputError naming the first id that occurs twice (a second reading confirms a repeated hash)."""
        ordered = np.sort(hashes)
        repeated = set(ordered[1:][ordered[1:] == ordered[:-1]].tolist())
        if not repeated:
            return
        seen: set[str] = set()
        for item in self._open().items:
            if id_hash(item.image_id) in repeated:
                if item.image_id in seen:
                    raise InputError(f"{where}: image id {item.image_id!r} occurs twice")
                seen.add(item.image_id)

    def _apply_missing_policy(self, missing: int, total: int, example: CaptionItem | None) -> None:
        if missing and example is not None:
            report_missing_images(self.name, self.policy, missing, total, example)

    def check_splits(self, *names: str) -> None:
        """InputError, as `CaptionDataset.split`'s, when one of `names` is not a split of the data set read."""
        check_splits(self.name, self.split_counts, names)

    def summary(self) -> str:
        """One line, as `CaptionDataset.summary`: item and caption counts per split, every non-zero count."""
        return summary_line(self.name, self.split_counts, self.captions, self.report)


def stream_dataset(name: str, path: str | Path, image_root: str | Path | None = None,
                   missing_images: str = "skip", **options: Any) -> StreamedDataset:
    """Data set `name` read one item at a time (see the module); the same arguments as `load_dataset`."""
    return StreamedDataset(name, path, image_root, missing_images, **options)
