"""Batches of a positives dataset with their images decoded by workers, ahead of the training step.

`batch_loader` is what training and validation iterate: with `num_workers` > 0 a torch `DataLoader` with that
many worker processes (as before); otherwise the items of each batch (`dataset[i]`: two images read and
preprocessed) are computed by `workers` decoders, the next batches while the model trains on the current one:
for a file-backed dataset (one with `item_pixels` / `item_texts`, e.g. `ManifestDataset`) of at least
`decode_pool.MIN_IMAGES` items, forked processes writing into shared memory (`pacs.metric.scoring.decode_pool`,
one pool per pass over the data); else threads (`pacs.metric.common.parallel`). The items, their order and the
collated batches are those of the serial loader, bit for bit.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from torch.utils.data import DataLoader, Dataset

from pacs.metric.common.parallel import ordered_map, resolve_workers
from pacs.metric.scoring import decode_pool


class ThreadedBatches:
    """An iterable of collated batches: `collate([dataset[i] for i in batch])` per index batch of `sampler`."""

    def __init__(self, dataset: Dataset, sampler: Iterable[Sequence[int]], collate: Callable[[list[Any]], Any],
                 workers: int) -> None:
        self.dataset, self.sampler, self.collate, self.workers = dataset, sampler, collate, workers

    def __len__(self) -> int:
        return len(self.sampler)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        batches = [list(batch) for batch in self.sampler]
        flat = [index for batch in batches for index in batch]
        largest = max((len(batch) for batch in batches), default=1)
        if hasattr(self.dataset, "item_pixels") and decode_pool.use_pool(len(flat), self.workers):
            items = self._from_processes(flat, largest)
        else:
            items = ordered_map(self.dataset.__getitem__, flat, self.workers, ahead=2 * largest)
        for batch in batches:
            yield self.collate([next(items) for _ in batch])

    def _from_processes(self, flat: list[int], largest: int) -> Iterator[tuple[Any, ...]]:
        """`dataset[i]` for each index of `flat`: the pixels from decoding processes, the captions from here."""
        dataset = self.dataset
        pixels = decode_pool.ordered_pixels(dataset.item_pixels, flat, self.workers,  # type: ignore[attr-defined]
                                            lambda: tuple(dataset.item_pixels(flat[0]).shape), batch_size=largest)
        for index, pair in zip(flat, pixels):
            caption, other = dataset.item_texts(index)  # type: ignore[attr-defined]
            yield pair[0], caption, pair[1], other


def batch_loader(dataset: Dataset, sampler: Iterable[Sequence[int]], collate: Callable[[list[Any]], Any],
                 num_workers: int = 0, workers: int | str = "auto") -> Iterable[Any]:
    """Collated batches of `dataset` for the index batches of `sampler` (processes or threads, see the module)."""
    if num_workers > 0:
        return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=num_workers)
    return ThreadedBatches(dataset, sampler, collate, resolve_workers(workers, "data.workers"))
