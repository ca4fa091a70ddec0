"""Metric training's batches with images decoded by worker threads equal the serial DataLoader's, bit for bit.

torch.equal is justified: each item is the same deterministic PIL decode + preprocessing of the same file, and the
batches hold the same items in the same order whichever thread decoded them.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from pacs.metric.common.config import from_dict
from pacs.metric.common.errors import InputError
from pacs.metric.models.preprocess import ImagePreprocess
from pacs.metric.training.batches import ThreadedBatches, batch_loader
from pacs.metric.training.config import DataOptions
from pacs.metric.training.data import ManifestDataset, ManifestRecord, ShardedEpochBatches, collate_positives


@pytest.fixture(scope="module")
def positives(shared_data: Path) -> ManifestDataset:
    """24 positives from real Flickr8k JPEGs (the generated image of pair i is the photo of pair i + 1)."""
    paths = sorted((shared_data / "flickr8k" / "images").glob("*.jpg"))[:25]
    if len(paths) < 25:
        pytest.skip("the Flickr8k images are not in the shared data")
    records = [ManifestRecord(image_id=p.stem, caption_id=f"{p.stem}#0", real_image=p, caption=f"caption {i}",
                              gen_caption=f"generated {i}", gen_image=paths[i + 1]) for i, p in enumerate(paths[:24])]
    return ManifestDataset(records, ImagePreprocess(size=64))


def _same(batches_a, batches_b) -> bool:
    pairs = list(zip(batches_a, batches_b, strict=True))
    return all(torch.equal(a[0], b[0]) and a[1] == b[1] and torch.equal(a[2], b[2]) and a[3] == b[3]
               for a, b in pairs)


def test_threaded_batches_equal_the_serial_loader(positives):
    sampler = ShardedEpochBatches(len(positives), 8, seed=3, epoch=1)
    serial = list(DataLoader(positives, batch_sampler=sampler, collate_fn=collate_positives))
    for workers in (2, 3):
        threaded = batch_loader(positives, sampler, collate_positives, num_workers=0, workers=workers)
        assert isinstance(threaded, ThreadedBatches) and len(threaded) == len(serial) == 3
        assert _same(threaded, serial)
    assert isinstance(batch_loader(positives, sampler, collate_positives, num_workers=2), DataLoader)


def test_data_workers_is_checked_at_load():
    assert from_dict(DataOptions, {"workers": 4}).workers == 4
    assert from_dict(DataOptions, {}).workers == "auto"
    with pytest.raises(InputError, match="data.workers='lots'"):
        from_dict(DataOptions, {"workers": "lots"})
