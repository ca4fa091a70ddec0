"""The on-disk tables (pacs.metric.common.spill) against their in-memory equivalents: a numpy array, a list of strings,
a dict from id to position."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from pacs.metric.common import spill
from pacs.metric.common.spill import DiskArray, DiskStrings, IdLookup


def test_disk_array_reads_what_numpy_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(spill, "WRITE_BUFFER", 64)  # many writes, so the chunk joins are exercised
    expected = np.random.default_rng(0).integers(-2**40, 2**40, size=5000)
    array = DiskArray(np.int64, tmp_path)
    for start in range(0, len(expected), 37):
        array.extend(expected[start:start + 37].tolist())
    with pytest.raises(RuntimeError, match="not finished"):
        array[0]
    array.finish()
    assert list(tmp_path.iterdir()) == []  # an unnamed file
    assert len(array) == 5000 and array[0] == expected[0] and array[-1] == expected[-1] and array[4999] == expected[-1]
    assert np.array_equal(array[10:20], expected[10:20]) and np.array_equal(array[4990:9999], expected[4990:])
    assert np.array_equal(array[::7], expected[::7]) and len(array[30:10]) == 0
    rows = np.array([4999, 0, 17, 17, 2500, -1])  # spread rows (one read each), repeats, a negative row
    assert np.array_equal(array[rows], expected[rows]) and np.array_equal(array.take([3, 4, 5]), expected[3:6])
    assert np.array_equal(array.to_numpy(), expected)
    assert np.array_equal(np.concatenate(list(array.blocks(999))), expected)
    with pytest.raises(IndexError):
        array[5000]
    with pytest.raises(IndexError):
        array[[0, 5000]]
    with pytest.raises(RuntimeError, match="cannot grow"):
        array.extend([1])
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(array)


def test_disk_array_casts_to_its_dtype_and_takes_bytes():
    small = DiskArray(np.int16)
    small.extend([1, 2, 300])
    assert small.finish()[2] == 300 and small.to_numpy().dtype == np.int16
    raw = DiskArray(np.uint8)
    raw.extend_bytes(b"caf\xc3\xa9")
    raw.finish()
    assert raw.read_bytes(0, 5).decode("utf-8") == "café" and raw.read_bytes(3, 3) == b""
    with pytest.raises(TypeError, match="uint8"):
        small.extend_bytes(b"x")


def test_disk_strings_equal_the_list(tmp_path, monkeypatch):
    monkeypatch.setattr(spill, "STRING_BLOCK", 3)  # iteration crosses block ends
    texts = ["a dog", "", "Ünïcödé café — naïve", "二匹の犬", "x" * 1000, "last one"]
    table = DiskStrings.of(texts, tmp_path)
    assert len(table) == len(texts) and list(table) == texts and table[-1] == "last one" and table[1] == ""
    assert table.span(1, 4) == texts[1:4] and table.span(4, 100) == texts[4:] and table.span(3, 3) == []
    with pytest.raises(IndexError):
        table[6]
    with pytest.raises(TypeError):
        table["0"]
    ids = DiskStrings.of(["img\udc80", "plain"], errors="surrogatepass")  # a lone surrogate kept as it was
    assert list(ids) == ["img\udc80", "plain"]
    with pytest.raises(UnicodeEncodeError):
        DiskStrings.of(["img\udc80"])  # strict: the caller sees the encoding error


def test_id_lookup_equals_a_dict_even_when_every_hash_collides(monkeypatch):
    ids = [f"img-{i % 50}" if i % 7 == 0 else f"img-{i}" for i in range(300)]  # repeated ids among them
    expected = {image_id: position for position, image_id in enumerate(ids)}  # a dict: the last position wins
    real = IdLookup(DiskStrings.of(ids))
    _check_lookup(real, ids, expected)
    monkeypatch.setattr(spill, "id_hash", lambda text: len(text) % 3)  # three hash values for 300 ids
    _check_lookup(IdLookup(DiskStrings.of(ids)), ids, expected)
    assert real.nbytes() == 12 * 300  # in memory: a hash and a position per id


def _check_lookup(lookup: IdLookup, ids: list[str], expected: dict[str, int]) -> None:
    assert {image_id: lookup.position(image_id) for image_id in ids} == expected
    assert lookup.position("img-300") is None and "img-300" not in lookup and "img-1" in lookup
    assert 3 not in lookup and len(lookup) == 300


def test_id_hash_is_the_same_in_every_process():
    assert spill.id_hash("COCO_val2014_000000391895") == int.from_bytes(
        __import__("hashlib").blake2b(b"COCO_val2014_000000391895", digest_size=8).digest(), "little")
