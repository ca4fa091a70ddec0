"""Caption datasets: the common result type, the `DATASETS` registry and `load_dataset`."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pacs.metric.common.errors import InputError
from pacs.metric.common.suggest import known_hint

logger = logging.getLogger(__name__)

MISSING_IMAGE_POLICIES = ("skip", "error", "keep")


@dataclass
class CaptionItem:
    """One image and its reference captions."""

    image_id: str
    image_path: Path | None
    captions: list[str]
    split: str
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class CaptionDataset:
    """A loaded caption data set: items plus the counts of everything skipped or dropped while loading."""

    name: str
    items: list[CaptionItem]
    source: str = ""
    report: dict[str, int] = field(default_factory=dict)
    missing_image_ids: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[CaptionItem]:
        return iter(self.items)

    def references(self) -> dict[str, list[str]]:
        """Return `{image_id: [reference captions]}` in item order."""
        return {item.image_id: list(item.captions) for item in self.items}

    def image_paths(self) -> dict[str, Path]:
        """Return `{image_id: image path}` for items that have one."""
        return {item.image_id: item.image_path for item in self.items if item.image_path is not None}

    def by_split(self) -> dict[str, CaptionDataset]:
        """Return one sub-dataset per split name, in first-seen order."""
        groups: dict[str, list[CaptionItem]] = {}
        for item in self.items:
            groups.setdefault(item.split, []).append(item)
        return {split: dataclasses.replace(self, items=items, report=dict(self.report))
                for split, items in groups.items()}

    def split(self, *names: str) -> CaptionDataset:
        """Return the items of the given split(s); an unknown split name is an InputError."""
        check_splits(self.name, {item.split for item in self.items}, names)
        wanted = set(names)
        return dataclasses.replace(self, items=[i for i in self.items if i.split in wanted], report=dict(self.report))

    def summary(self) -> str:
        """One line: item and caption counts per split plus every non-zero skip/drop count."""
        splits = {name: len(sub) for name, sub in self.by_split().items()}
        return summary_line(self.name, splits, sum(len(i.captions) for i in self.items), self.report)


def summary_line(name: str, split_counts: dict[str, int], captions: int, report: dict[str, int]) -> str:
    """`<name>: N images, M captions; splits a=.., b=..; <every non-zero count>` (a data set's summary)."""
    parts = [f"{name}: {sum(split_counts.values())} images, {captions} captions",
             "splits " + ", ".join(f"{k}={v}" for k, v in split_counts.items())]
    parts += [f"{key}={value}" for key, value in report.items() if value]
    return "; ".join(parts)


def check_splits(name: str, known: Iterable[str], names: Iterable[str]) -> None:
    """InputError naming the first of `names` that is not among the `known` splits of data set `name`."""
    known = set(known)
    unknown = [split for split in names if split not in known]
    if unknown:
        raise InputError(f"{name}: no split {unknown[0]!r} (splits: {', '.join(sorted(known))})")


DatasetLoader = Callable[..., CaptionDataset]
DATASETS: dict[str, DatasetLoader] = {}


def register_dataset(name: str) -> Callable[[DatasetLoader], DatasetLoader]:
    """Decorator registering a loader `fn(path, image_root=None, **options) -> CaptionDataset` under `name`."""
    key = name.lower()

    def decorate(fn: DatasetLoader) -> DatasetLoader:
        if key in DATASETS:
            raise ValueError(f"dataset {name!r} is already registered")
        DATASETS[key] = fn
        return fn

    return decorate


def get_dataset_loader(name: str) -> DatasetLoader:
    """Return the loader registered under `name` (case-insensitive); InputError lists the known names."""
    try:
        return DATASETS[name.lower()]
    except KeyError:
        raise InputError(f"unknown dataset {name!r} {known_hint(name, sorted(DATASETS))}") from None


@dataclass
class DatasetConfig:
    """Which data set to load and how (YAML-friendly)."""

    name: str = "flickr8k"
    path: str = ""
    image_root: str | None = None
    missing_images: str = "skip"
    options: dict[str, Any] = field(default_factory=dict)


def load_dataset(name: str, path: str | Path, image_root: str | Path | None = None,
                 missing_images: str = "skip", **options: Any) -> CaptionDataset:
    """Load data set `name` from `path`; images that are not on disk are skipped (counted), kept, or an error."""
    if missing_images not in MISSING_IMAGE_POLICIES:
        raise InputError(f"missing_images={missing_images!r}: choose one of {', '.join(MISSING_IMAGE_POLICIES)}")
    path = Path(path)
    if not path.exists():
        raise InputError(f"{name}: {path} does not exist")
    loader = get_dataset_loader(name)
    dataset = loader(path, image_root=Path(image_root) if image_root is not None else None, **options)
    dataset = apply_missing_image_policy(dataset, missing_images)
    logger.info(dataset.summary())
    return dataset


def load_dataset_config(config: DatasetConfig) -> CaptionDataset:
    """Load the data set described by a `DatasetConfig`."""
    return load_dataset(config.name, config.path, config.image_root, config.missing_images, **config.options)


def apply_missing_image_policy(dataset: CaptionDataset, policy: str) -> CaptionDataset:
    """Count items whose image file is absent; drop them ('skip'), keep them ('keep') or raise ('error')."""
    missing = [item for item in dataset.items if item.image_path is None or not item.image_path.is_file()]
    dataset.report["missing_images"] = len(missing)
    dataset.missing_image_ids = [item.image_id for item in missing]
    if not missing:
        return dataset
    report_missing_images(dataset.name, policy, len(missing), len(dataset.items), missing[0])
    if policy == "skip":
        missing_ids = set(dataset.missing_image_ids)
        dataset.items = [item for item in dataset.items if item.image_id not in missing_ids]
    return dataset


def report_missing_images(name: str, policy: str, missing: int, total: int, example: CaptionItem) -> None:
    """The missing-image policy's outcome for `missing` of `total` images: InputError ('error') or a warning."""
    if policy == "error":
        raise InputError(f"{name}: {missing} of {total} images are missing, e.g. image {example.image_id!r} at "
                         f"{example.image_path} (use missing_images='skip' to skip them)")
    if policy == "skip":
        logger.warning("%s: skipped %d images whose file is missing (e.g. %s)", name, missing, example.image_path)
    else:
        logger.warning("%s: %d images have no file on disk (kept; e.g. %s)", name, missing, example.image_path)


def check_unique_ids(items: Iterable[CaptionItem], where: str) -> None:
    """Raise InputError naming the first image id that occurs twice."""
    seen: set[str] = set()
    for item in items:
        if item.image_id in seen:
            raise InputError(f"{where}: image id {item.image_id!r} occurs twice")
        seen.add(item.image_id)
