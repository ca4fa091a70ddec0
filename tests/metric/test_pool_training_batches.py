"""Metric training's batches from decoding processes (issue 43 item 1) equal the serial DataLoader's, bit for bit.

torch.equal is justified: each item is the same deterministic PIL decode + preprocessing of the same file
(`ManifestDataset.item_pixels` is `__getitem__`'s pixels, stacked), copied unchanged through shared memory, and the
batches hold the same items in the same order whichever process decoded them.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from pacs.metric.common.errors import InputError
from pacs.metric.models.preprocess import ImagePreprocess
from pacs.metric.scoring import decode_pool
from pacs.metric.training.batches import batch_loader
from pacs.metric.training.data import ManifestDataset, ManifestRecord, ShardedEpochBatches, collate_positives

pytestmark = pytest.mark.skipif(not decode_pool.fork_available(), reason="decoding processes need fork")
N = decode_pool.MIN_IMAGES + 6


@pytest.fixture(scope="module")
def positives(shared_data: Path) -> ManifestDataset:
    """N positives from real Flickr8k JPEGs (the generated image of pair i is the photo of pair i + 1)."""
    paths = sorted((shared_data / "flickr8k" / "images").glob("*.jpg"))[:N + 1]
    if len(paths) < N + 1:
        pytest.skip("the Flickr8k images are not in the shared data")
    records = [ManifestRecord(image_id=p.stem, caption_id=f"{p.stem}#0", real_image=p, caption=f"caption {i}",
                              gen_caption=f"generated {i}", gen_image=paths[i + 1]) for i, p in enumerate(paths[:N])]
    return ManifestDataset(records, ImagePreprocess(size=48))


def _started_pools(monkeypatch) -> list[int]:
    started: list[int] = []
    original = decode_pool.DecodePool.__init__

    def counting(self, function, workers, shape):
        started.append(workers)
        original(self, function, workers, shape)

    monkeypatch.setattr(decode_pool.DecodePool, "__init__", counting)
    return started


def test_batches_from_processes_equal_the_serial_loader(positives, monkeypatch):
    sampler = ShardedEpochBatches(len(positives), 16, seed=3, epoch=1)
    serial = list(DataLoader(positives, batch_sampler=sampler, collate_fn=collate_positives))
    started = _started_pools(monkeypatch)
    pooled = list(batch_loader(positives, sampler, collate_positives, num_workers=0, workers=2))
    assert started == [2]  # one pool of two processes for the pass
    assert len(pooled) == len(serial) == N // 16  # full global batches only
    for a, b in zip(pooled, serial):
        assert torch.equal(a[0], b[0]) and a[1] == b[1] and torch.equal(a[2], b[2]) and a[3] == b[3]


def test_few_items_stay_in_process(positives, monkeypatch):
    started = _started_pools(monkeypatch)
    sampler = ShardedEpochBatches(decode_pool.MIN_IMAGES - 1, 16, seed=3, epoch=1)
    list(batch_loader(positives, sampler, collate_positives, num_workers=0, workers=2))
    assert started == []


def test_an_unreadable_image_is_its_own_error(positives, tmp_path):
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg")
    records = list(positives.records)
    records[40] = ManifestRecord(**{**vars(records[40]), "gen_image": broken})
    dataset = ManifestDataset(records, positives.preprocess)
    sampler = ShardedEpochBatches(len(dataset), 16, seed=3, epoch=1)
    with pytest.raises(InputError, match="cannot read image .*broken.jpg"):
        list(batch_loader(dataset, sampler, collate_positives, num_workers=0, workers=2))
