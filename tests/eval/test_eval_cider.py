"""Fast CIDEr-D equals pycocoevalcap's Cider per caption (to 1e-12) on real Flickr8k captions."""
from __future__ import annotations

import random

import numpy as np
import pytest
from pycocoevalcap.cider.cider import Cider

import pacs.eval as pacs_eval
from pacs.eval.cider import KEPT_SCORER, CiderD, DocumentFrequency, cider_df
from pacs.metric.common.errors import InputError


def _simple_tokens(caption: str) -> str:
    return " ".join(caption.lower().replace(".", " ").replace(",", " ").replace('"', " ").split())


@pytest.fixture(scope="module")
def flickr_captions(shared_data):
    by_image: dict[str, list[str]] = {}
    for line in (shared_data / "flickr8k" / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines():
        key, _, caption = line.partition("\t")
        by_image.setdefault(key.split("#")[0], []).append(_simple_tokens(caption))
    return by_image


@pytest.fixture(scope="module")
def pairs(flickr_captions):
    """1,200 candidates (own caption, other image's caption, repeated words, edge cases) with 3-5 refs."""
    rng = random.Random(7)
    images = sorted(flickr_captions)[:1200]
    candidates, references = [], []
    for i, image in enumerate(images):
        caps = flickr_captions[image]
        kind = i % 4
        if kind == 0:
            candidate = caps[0]
        elif kind == 1:
            candidate = flickr_captions[images[rng.randrange(len(images))]][rng.randrange(5)]
        elif kind == 2:
            candidate = caps[1] + " " + caps[1].split()[-1] * 1 + " a a"
        else:
            candidate = " ".join(caps[2].split()[: rng.randint(1, 4)])
        candidates.append(candidate)
        references.append(caps[1:] if kind == 0 else caps[: 3 + i % 3])
    candidates[3] = ""  # empty candidate
    candidates[5] = "zebra"  # single unseen word
    references[7] = references[7] + ["sky"]  # one-word reference
    return candidates, references


def _coco(candidates, references):
    gts = {i: refs for i, refs in enumerate(references)}
    res = {i: [c] for i, c in enumerate(candidates)}
    corpus, scores = Cider().compute_score(gts, res)
    return corpus, np.asarray(scores)


def test_cider_d_equals_pycocoevalcap_per_caption(pairs):
    # the pairs are tokenized by _simple_tokens (tokenized=True below): pacs' CIDEr-D on given tokens is
    # pycocoevalcap's; the PTB default is checked in test_eval_tokenized_flag.py
    candidates, references = pairs
    corpus, expected = _coco(candidates, references)
    got = pacs_eval.cider_d(candidates, references, tokenized=True)
    assert got.shape == (len(candidates),)
    np.testing.assert_allclose(got, expected, atol=1e-12, rtol=0)
    assert abs(got.mean() - corpus) < 1e-9
    assert expected.std() > 0.1  # the inputs really spread the scores


def test_duplicate_entries_count_as_documents_like_pycocoevalcap(pairs):
    candidates, references = pairs
    candidates = candidates[:200] + candidates[:50]
    references = references[:200] + references[:50]
    _, expected = _coco(candidates, references)
    np.testing.assert_allclose(pacs_eval.cider_d(candidates, references, tokenized=True), expected, atol=1e-12, rtol=0)


def test_fixed_corpus_df_matches_when_corpus_is_the_references(pairs):
    candidates, references = pairs
    _, expected = _coco(candidates, references)
    table = pacs_eval.cider_df(references, tokenized=True)
    assert table.num_documents == len(references)
    np.testing.assert_allclose(pacs_eval.cider_d(candidates, references, table, tokenized=True), expected, atol=1e-12, rtol=0)
    scorer = table.kept[KEPT_SCORER]  # kept with the table: the next call reuses its cached statistics
    assert isinstance(scorer, CiderD)
    np.testing.assert_allclose(pacs_eval.cider_d(candidates, references, table, tokenized=True), expected, atol=1e-12, rtol=0)
    assert table.kept[KEPT_SCORER] is scorer


def test_fixed_corpus_df_uses_the_corpus_not_the_batch(pairs, flickr_captions):
    """SCST convention: a big training corpus fixes df; a small batch is scored against it."""
    candidates, references = pairs
    corpus = [flickr_captions[k] for k in sorted(flickr_captions)[:3000]]
    table = cider_df(corpus, tokenized=True)
    got = CiderD(document_frequency=table)(candidates[:40], references[:40])
    # reference: pycocoevalcap's CiderScorer with its df table replaced by the corpus table and its number of
    # documents (read through len(crefs)) by the corpus size
    from collections import defaultdict

    from pycocoevalcap.cider.cider_scorer import CiderScorer

    class _CorpusSized(list):
        def __len__(self) -> int:
            return int(table.num_documents)

    scorer = CiderScorer(n=4, sigma=6.0)
    for c, r in zip(candidates[:40], references[:40]):
        scorer += (c, r)
    scorer.crefs = _CorpusSized(scorer.crefs)
    scorer.document_frequency = defaultdict(
        float, {((k,) if isinstance(k, str) else k): v for k, v in table.counts.items()})
    expected = np.asarray(scorer.compute_cider())
    np.testing.assert_allclose(got, expected, atol=1e-12, rtol=0)
    assert not np.allclose(got, pacs_eval.cider_d(candidates[:40], references[:40], tokenized=True))  # df really differs


def test_reference_cache_across_calls_gives_fresh_results(pairs):
    candidates, references = pairs
    scorer = CiderD()
    first = scorer(candidates[:300], references[:300])
    again = scorer(candidates[:300], references[:300])
    shifted = scorer(candidates[100:500], references[100:500])  # half cached, half new references
    np.testing.assert_array_equal(first, again)
    np.testing.assert_allclose(shifted, pacs_eval.cider_d(candidates[100:500], references[100:500], tokenized=True), atol=1e-12)
    fixed = CiderD(document_frequency=cider_df(references, tokenized=True))
    a = fixed(candidates[:300], references[:300])
    b = fixed(candidates[:300], references[:300])
    np.testing.assert_array_equal(a, b)


def test_document_frequency_disk_cache(tmp_path, pairs):
    _, references = pairs
    path = tmp_path / "df.json.gz"
    table = cider_df(references[:100], cache_path=path)
    assert path.is_file()
    loaded = DocumentFrequency.load(path)
    assert loaded.counts == table.counts and loaded.num_documents == 100
    again = cider_df(references[:100], cache_path=path)  # loaded from disk (sha matches)
    assert again.corpus_sha256 == table.corpus_sha256
    other = cider_df(references[100:150], cache_path=path)  # another corpus: recomputed, not the stale table
    assert other.num_documents == 50
    candidates = [refs[0] for refs in references[:100]]
    np.testing.assert_array_equal(CiderD(document_frequency=str(path))(candidates[:50], references[100:150]),
                                  CiderD(document_frequency=other)(candidates[:50], references[100:150]))


def test_hand_checked_identical_caption_scores():
    """One image, candidate identical to its single reference: every cosine is 1 but idf of a one-document
    corpus is log(1) - log(1) = 0, so CIDEr-D is 0 (pycocoevalcap behaves the same)."""
    assert pacs_eval.cider_d(["a dog runs"], [["a dog runs"]])[0] == 0.0
    # two documents, so idf = log 2 for n-grams in one document and 0 for "a" (in both).
    # "a dog runs" vs itself: orders 1-3 have cosine 1, order 4 has no n-gram -> 10 * 3/4.
    # "a cat" vs "a cat sleeps": cosines 1/sqrt(2) for orders 1-2, 0 for 3-4; bigram lengths 1 vs 2.
    scores = pacs_eval.cider_d(["a dog runs", "a cat"], [["a dog runs"], ["a cat sleeps"]])
    assert scores[0] == pytest.approx(7.5, abs=1e-12)
    assert scores[1] == pytest.approx(10 * (2 / np.sqrt(2)) / 4 * np.exp(-1 / 72), abs=1e-12)
    _, expected = _coco(["a dog runs", "a cat"], [["a dog runs"], ["a cat sleeps"]])
    np.testing.assert_allclose(scores, expected, atol=1e-12)


@pytest.mark.parametrize("candidates, references, message", [
    (["a"], [["a"], ["b"]], "1 candidates but 2 reference sets"),
    (["a"], [[]], "references[0] has no references"),
    (["a"], ["a dog"], "references[0] is a string"),
    ([3], [["a"]], "candidates[0] is int"),
])
def test_bad_input_is_named(candidates, references, message):
    with pytest.raises(InputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        pacs_eval.cider_d(candidates, references)


def test_malformed_df_file(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(InputError, match="bad.json"):
        DocumentFrequency.load(path)
