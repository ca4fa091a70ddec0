"""The cider reward's table built block by block from compact captions: the same values as the whole-corpus
build on real Flickr8k references, errors named by index, Python-object memory bounded by the block."""
from __future__ import annotations

import tracemalloc
from collections import Counter

import numpy as np
import pytest
from pycocoevalcap.cider.cider_scorer import precook

import pacs.rewards.cider as cider_module
from pacs.captioner.data import load_dataset
from pacs.captioner.data.compact_captions import CaptionStore
from pacs.eval import cider_tables
from pacs.eval.cider_tables import DocumentFrequency, cider_df, corpus_sha256
from pacs.metric.common import spill
from pacs.metric.common.errors import InputError
from pacs.rewards import build_reward
from pacs.rewards.text import fast_tokenizer


@pytest.fixture(scope="module")
def flickr8k(shared_data):
    """Real Flickr8k captions (all 8,000 split images, images not needed)."""
    return load_dataset("flickr8k", shared_data / "flickr8k", missing_images="keep")


def _whole_corpus_table(references: list[list[str]]) -> DocumentFrequency:
    """The reward's table as it was built before: every reference tokenized in one call, then `cider_df`."""
    flat = fast_tokenizer([ref for refs in references for ref in refs])
    tokenized, start = [], 0
    for refs in references:
        tokenized.append(flat[start:start + len(refs)])
        start += len(refs)
    return cider_df(tokenized)


def test_block_built_reward_equals_the_whole_corpus_build(flickr8k, monkeypatch):
    items = flickr8k.split("train").items[:3000]
    store = CaptionStore.from_items(items)
    references = [item.captions for item in items]
    monkeypatch.setitem(cider_module.BLOCK_IMAGES, "fast", 97)  # 31 blocks, the last one partial
    reward = build_reward("cider", train_references=store.reference_map()).fn
    before = _whole_corpus_table(references)
    table = reward.document_frequency
    assert table == before and table.words == before.words  # same n-gram keys, frequencies and word order
    tokenized = [fast_tokenizer(refs) for refs in references]
    assert table.corpus_sha256 == corpus_sha256(tokenized)  # a disk cache of the old build stays valid
    # document frequencies counted independently with pycocoevalcap's own n-gram extraction (first 400 images)
    expected: Counter = Counter()
    for refs in tokenized[:400]:
        expected.update({gram for ref in refs for gram in precook(ref, 4)})
    small = build_reward("cider", train_references=references[:400]).fn
    assert len(small.document_frequency.counts) == len(expected)
    assert all(small.document_frequency.counts[gram] == count for gram, count in expected.items())
    # reward values: the block-built reward against one built on the old table, on real captions
    old = cider_module.CiderDReward(before, fast_tokenizer)
    batch = items[:64]
    ids = [item.image_id for item in batch]
    refs = [item.captions[:4] for item in batch]
    captions = [[item.captions[4], batch[(i + 1) % 64].captions[0], "a dog runs"] for i, item in enumerate(batch)]
    new_values, old_values = reward(ids, captions, refs), old(ids, captions, refs)
    assert new_values.shape == (64, 3) and bool((new_values == old_values).all())
    assert new_values[:, 0].mean() > 3 * new_values[:, 1].mean()  # own references score higher


def test_an_empty_reference_set_is_named_by_its_index(monkeypatch):
    monkeypatch.setitem(cider_module.BLOCK_IMAGES, "fast", 4)
    references = {f"img{i}": [f"caption number {i}"] for i in range(10)}
    references["img6"] = []
    with pytest.raises(InputError, match=r"train_references\[6\] must be a non-empty list"):
        build_reward("cider", train_references=references)


def _python_bytes(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes of the traced Python objects (NumPy's array buffers, traced in their own domain, left out)."""
    outside = tracemalloc.DomainFilter(inclusive=False, domain=np.lib.tracemalloc_domain)
    return sum(stat.size for stat in snapshot.filter_traces([outside]).statistics("filename"))


def _peak_python_bytes(references, monkeypatch) -> tuple[int, DocumentFrequency]:
    """Most Python-object bytes held while the reward's table is built (sampled at every tokenizer call, when a
    block's strings are alive), above what was held before; and the table."""
    samples = []

    def tokenizer(captions):
        tokens = fast_tokenizer(captions)
        samples.append(_python_bytes(tracemalloc.take_snapshot()))
        return tokens

    monkeypatch.setitem(cider_module.TOKENIZERS, "fast", tokenizer)
    tracemalloc.start()
    try:
        baseline = _python_bytes(tracemalloc.take_snapshot())
        reward = build_reward("cider", train_references=references)
    finally:
        tracemalloc.stop()
    return max(samples) - baseline, reward.fn.document_frequency


def test_reward_table_python_memory_does_not_grow_with_the_references(flickr8k, monkeypatch):
    """A list of reference lists holds at least one string object per reference (>= 57 bytes: its header and a
    pointer); the block build holds one block of strings at a time, so doubling the references (the 8,000
    Flickr8k images, then the same captions under 8,000 more ids) adds less than 8 bytes per added reference
    (measured: 0.8; the whole-corpus build it replaces held every reference's string at its tokenizer call)."""
    monkeypatch.setitem(cider_module.BLOCK_IMAGES, "fast", 500)
    items = list(flickr8k.items)
    store = CaptionStore.from_items(items)
    doubled = CaptionStore.from_pairs([*((i.image_id, i.captions) for i in items),
                                       *((f"copy-{i.image_id}", i.captions) for i in items)])
    once, table_once = _peak_python_bytes(store.reference_map(), monkeypatch)
    twice, table_twice = _peak_python_bytes(doubled.reference_map(), monkeypatch)
    added = doubled.num_captions - store.num_captions
    assert added == 40000 and table_twice.num_documents == 2 * table_once.num_documents
    assert (twice - once) / added < 8
    # measured: 2.8 MB (the vocabulary, one block's strings, the spilled blocks' write buffers of 256 KiB each)
    assert twice < 57 * doubled.num_captions / 2 + 3 * spill.WRITE_BUFFER
    # the representation it replaces, measured the same way: more than 57 bytes per reference
    tracemalloc.start()
    try:
        baseline = _python_bytes(tracemalloc.take_snapshot())
        as_lists = [fast_tokenizer(refs) for refs in doubled.reference_map().values()]
        listed = _python_bytes(tracemalloc.take_snapshot()) - baseline
    finally:
        tracemalloc.stop()
    assert sum(map(len, as_lists)) == doubled.num_captions
    assert listed / doubled.num_captions > 57


def _df_peak_bytes(block: list[list[str]], copies: int) -> tuple[int, DocumentFrequency]:
    """Peak bytes of every traced allocation, NumPy's arrays included, while `cider_df_blocks` reads `copies`
    copies of one tokenized block (made one at a time, so the input never holds more than one block)."""
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        table = cider_tables.cider_df_blocks([list(refs) for refs in block] for _ in range(copies))
        peak = tracemalloc.get_traced_memory()[1] - baseline
    finally:
        tracemalloc.stop()
    return peak, table


def test_table_build_holds_the_table_and_one_block_not_the_corpus(flickr8k, monkeypatch):
    """NumPy arrays included: reading 64 copies of a 500-image block instead of 4 (the same n-grams: the same
    table) adds less than 24 bytes per added reference to the build's peak; keeping the encoded corpus until
    the table is made (an int32 per word, an int64 per sentence, as before) would add more than 50. The chunks'
    keys are summed into the table when they outnumber it (and at least every 4,096 keys here; 262,144 by
    default: a fixed 4 MB)."""
    monkeypatch.setattr(cider_tables, "MERGE_KEYS", 1 << 12)
    block = [fast_tokenizer(item.captions) for item in list(flickr8k.items)[:500]]
    few, table_few = _df_peak_bytes(block, 4)
    many, table_many = _df_peak_bytes(block, 64)
    assert np.array_equal(table_many.keys, table_few.keys) and np.array_equal(table_many.df, 16 * table_few.df)
    references = sum(map(len, block))
    assert (many - few) / (60 * references) < 24
    words = sum(len(ref.split()) for refs in block for ref in refs)
    assert 4 * words / references + 8 > 50  # what the encoded corpus would add per reference
