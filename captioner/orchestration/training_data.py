"""What `pacs train` keeps of its data set, read in one pass: the training captions and image paths on disk,
the validation references and the test sets' items in memory (bounded by those splits, not by N).

`read_training_data(config, folder)` streams the data set (`pacs.captioner.data.stream_dataset`: one item at a time
for the data sets with a streaming form, e.g. the Karpathy files; the loaded items otherwise) and routes each item:
the first `max_train_images` of the training splits to a `CaptionStore` and `ImagePaths` in unnamed files of
`folder`, the first `max_val_images` of the validation split to the references, and each test set read from the
same file (same loader, file and settings) its first `max_images` of its split. The kept objects are then rebuilt
in fresh memory (`FrozenCopy`), so that the process shrinks back once the reading is done.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from pacs.captioner.data import CaptionItem, stream_dataset
from pacs.captioner.data.compact_captions import CaptionStore, ImagePaths
from pacs.metric.common.heap import FrozenCopy


@dataclasses.dataclass
class TrainingData:
    """The training captions and paths (on disk), the validation references, the test sets' items."""

    store: CaptionStore
    image_paths: ImagePaths
    val_references: dict[str, list[str]]
    test_items: dict[str, list[CaptionItem]]


class _TestSet:
    """The items of one test set taken while the file is read: its split ('' for every item), at most `limit`."""

    def __init__(self, split: str, limit: int) -> None:
        self.split, self.limit, self.items = split, limit, []

    def offer(self, item: CaptionItem) -> None:
        if (not self.split or item.split == self.split) and (not self.limit or len(self.items) < self.limit):
            self.items.append(item)


def read_training_data(config: Any, folder: Path, same_file_test_sets: dict[str, dict[str, Any]]) -> TrainingData:
    """One pass over `config.data` (a `PipelineConfig`'s): see the module. `same_file_test_sets`: `{name: test set
    config}` of the test sets read from the same file; one whose split the file lacks is left out."""
    data = config.data
    dataset = stream_dataset(*data.loader_arguments(), **data.options)
    train_splits, val_split = set(data.train_splits), data.val_split
    max_train, max_val = data.max_train_images, data.max_val_images
    store_builder = CaptionStore.builder(folder)
    paths_builder = ImagePaths.builder(folder)
    val_items: list[CaptionItem] = []
    test_sets = {name: _TestSet(set_config.get("split", "test"), config.evaluation.max_images)
                 for name, set_config in same_file_test_sets.items()}
    for item in dataset:
        if item.split in train_splits and (not max_train or store_builder.num_images < max_train):
            store_builder.add(item.image_id, item.captions)
            paths_builder.add(item.image_id, item.image_path)
        if item.split == val_split and (not max_val or len(val_items) < max_val):
            val_items.append(item)
        for test_set in test_sets.values():
            test_set.offer(item)
    dataset.check_splits(*data.train_splits)
    dataset.check_splits(val_split)
    for item in val_items:  # after the training images, as before
        paths_builder.add(item.image_id, item.image_path)
    test_items = {name: test_set.items for name, test_set in test_sets.items()
                  if not test_set.split or test_set.split in dataset.split_counts}
    frozen = FrozenCopy(({i.image_id: i.captions for i in val_items}, test_items))
    del dataset, val_items, test_items, test_sets
    val_references, test_items = frozen.thaw()
    return TrainingData(store_builder.finish(), paths_builder.finish(), val_references, test_items)
