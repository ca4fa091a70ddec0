"""Compact training captions (issue 22): the flat stores give exactly the examples, ids and batches of the Python
lists they replace, and hold a bounded number of bytes per caption (no Python object per caption)."""
from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from captioner_testkit import overlap_reward, tiny_checkpoint, tiny_data, tiny_model_config

from pacs.captioner.data.compact_captions import CaptionStore
from pacs.captioner.data.datasets import CaptionItem
from pacs.captioner.modeling.caption_ids import EncodedCaptions
from pacs.captioner.modeling.train_scst import SCSTConfig, train_scst
from pacs.captioner.modeling.train_xe import XEConfig, caption_images, encode_captions, train_xe
from pacs.captioner.modeling.training_setup import ScheduleConfig
from pacs.captioner.modeling.vocab import EOS_ID, PAD_ID, build_vocab


def _flickr8k_items(shared_data: Path, n_images: int) -> list[CaptionItem]:
    """The first `n_images` Flickr8k images (sorted file names) with their five raw captions."""
    by_image: dict[str, list[str]] = {}
    for line in (shared_data / "flickr8k" / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines():
        key, _, caption = line.partition("\t")
        by_image.setdefault(key.split("#")[0], []).append(caption)
    return [CaptionItem(key, None, by_image[key], "train") for key in sorted(by_image)[:n_images]]


def _old_targets(vocab, captions):
    """encode_captions as it was (a tensor row filled per caption), the reference implementation."""
    out = torch.full((len(captions), vocab.max_length + 1), PAD_ID, dtype=torch.long)
    for row, caption in enumerate(captions):
        ids = vocab.encode(caption) + [EOS_ID]
        out[row, :len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out


def test_caption_store_views_equal_the_python_lists(shared_data):
    items = _flickr8k_items(shared_data, 300)
    items[7].captions = ["Ünïcödé café — naïve", "a", "b"]  # multi-byte text, an image with 3 captions
    store = CaptionStore.from_items(items)
    pairs = [(i.image_id, c) for i in items for c in i.captions]
    sets = [(i.image_id, i.captions) for i in items]
    assert len(store.pairs()) == len(pairs) == store.num_captions
    assert list(store.pairs()) == pairs
    assert store.pairs()[-1] == pairs[-1] and store.pairs()[5:9] == pairs[5:9]
    assert list(store.reference_sets()) == sets and store.reference_sets()[7] == sets[7]
    assert dict(store.reference_map()) == {i.image_id: i.captions for i in items}
    with pytest.raises(IndexError):
        store.pairs()[len(pairs)]
    ids, index = caption_images(store.pairs())
    assert [ids[k] for k in index] == [image_id for image_id, _ in pairs]
    plain_ids, plain_index = caption_images(pairs)  # the generic path (any sequence of pairs)
    assert plain_ids == list(ids) and plain_index.tolist() == index.to_numpy().tolist()
    assert "nope" not in store.reference_map() and items[3].image_id in store.reference_map()
    with pytest.raises(KeyError):
        store.reference_map()["nope"]


def test_encoded_captions_give_the_same_targets_as_before(shared_data):
    captions = [c for item in _flickr8k_items(shared_data, 400) for c in item.captions]
    vocab = build_vocab("word", captions, min_count=3, max_length=12)  # long captions get truncated
    old = _old_targets(vocab, captions)
    assert torch.equal(encode_captions(vocab, captions), old)
    encoded = EncodedCaptions.encode(vocab, iter(captions), block=97)  # streamed in blocks that do not divide N
    rows = torch.randperm(len(captions), generator=torch.Generator().manual_seed(0))[:256]
    assert torch.equal(encoded.targets(rows.tolist()), old[rows])
    assert torch.equal(encoded.targets(rows), old[rows])
    assert encoded.caption_ids(3) == vocab.encode(captions[3])
    assert (old == EOS_ID).sum().item() == len(captions)  # every row got its <eos>, even the truncated ones


def test_xe_and_scst_train_identically_on_the_compact_views(tmp_path):
    """Same losses, step by step, from the Python lists and from the CaptionStore views (same examples, same
    batches, same targets)."""
    cache, train, val = tiny_data(tmp_path)
    vocab = build_vocab("word", [c for _, c in train], min_count=1, max_length=8)
    grouped: dict[str, list[str]] = {}
    for image_id, caption in train:
        grouped.setdefault(image_id, []).append(caption)
    store = CaptionStore.from_pairs(grouped.items())
    assert list(store.pairs()) == train

    def xe(name, examples):
        config = XEConfig(output_dir=str(tmp_path / name), max_steps=6, batch_size=16, micro_batch_size=8,
                          schedule=ScheduleConfig(warmup_steps=2, constant_until=4, decay_until=6, peak_lr=3e-3,
                                                  final_lr=1e-4), eval_every=0, save_every=0, log_every=1,
                          trackers=[])
        return train_xe(config, tiny_model_config(), vocab, cache, examples, val).losses

    assert xe("xe-compact", store.pairs()) == xe("xe-lists", train)

    init = tiny_checkpoint(tmp_path)

    def scst(name, examples):
        config = SCSTConfig(output_dir=str(tmp_path / name), reward="overlap", lr=1e-3, batch_size=8,
                            micro_batch_size=8, max_steps=3, k=3, save_every=0, trackers=[])
        return train_scst(config, init, cache, examples, overlap_reward).losses

    assert scst("scst-compact", store.reference_sets()) == scst("scst-lists", list(grouped.items()))


def _traced_build(build):
    tracemalloc.start()
    try:
        result = build()
        current, _peak = tracemalloc.get_traced_memory()
        blocks = len(tracemalloc.take_snapshot().traces)
    finally:
        tracemalloc.stop()
    return result, current, blocks


def test_caption_storage_in_memory_does_not_grow_with_the_captions(shared_data, tmp_path):
    """4,000 then 8,000 Flickr8k images (20,000 and 40,000 captions): the store, its XE view and the encoded ids
    keep their data in unnamed files (counted by the files' sizes) and the same fixed buffers in memory whatever
    the number of captions (< 16 bytes per added caption, from the vocabulary's caches and the allocator); the
    Python lists they replace need an object (>= 56 bytes) per caption, measured the same way."""
    kept_by_size = {}
    for n_images in (4000, 8000):
        items = _flickr8k_items(shared_data, n_images)
        captions = [c for item in items for c in item.captions]
        text_bytes = sum(len(c.encode("utf-8")) for c in captions)
        vocab = build_vocab("word", captions, min_count=5, max_length=16)
        tokens = sum(len(vocab.encode(c)) for c in captions)
        store, kept, blocks = _traced_build(lambda items=items: CaptionStore.from_items(items, folder=tmp_path))
        assert len(store.texts.blob) == text_bytes and len(store.texts.offsets) == len(captions) + 1
        pairs, kept_pairs, _ = _traced_build(store.pairs)
        encoded, kept_ids, id_blocks = _traced_build(
            lambda vocab=vocab, captions=captions: EncodedCaptions.encode(vocab, captions, folder=tmp_path))
        assert encoded.stored_bytes() == 2 * tokens + 8 * (len(captions) + 1)  # int16 ids: a small vocabulary
        assert list(tmp_path.iterdir()) == []  # the files have no name: nothing is left in the folder
        kept_by_size[len(captions)] = (kept, kept_pairs, kept_ids, blocks, id_blocks)
    (small, *small_rest), (large, *large_rest) = kept_by_size[20000], kept_by_size[40000]
    assert (large - small) / 20000 < 1 and large < 64 * 1024  # the store: fixed buffers only
    assert small_rest[0] < 4096 and large_rest[0] < 4096  # the XE view: nothing
    assert (large_rest[1] - small_rest[1]) / 20000 < 16  # the ids: the vocabulary's word cache at most
    assert large_rest[2] < 200 and large_rest[3] < 200  # a few blocks, not one per caption

    old_pairs, kept_old_pairs, _ = _traced_build(lambda: [(i.image_id, c) for i in items for c in i.captions])
    old_ids, kept_old_ids, _ = _traced_build(lambda: [vocab.encode(c) for c in captions])
    assert kept_old_pairs > 56 * len(captions) > 50 * (large + large_rest[0])
    assert kept_old_ids > 56 * len(captions) + 8 * tokens > 10 * large_rest[1]
    assert len(pairs) == len(old_pairs) and len(old_ids) == len(encoded)
    assert np.array_equal(encoded.ids.to_numpy(), np.concatenate([np.asarray(x, dtype=np.int16) for x in old_ids]))
    assert list(pairs) == old_pairs
