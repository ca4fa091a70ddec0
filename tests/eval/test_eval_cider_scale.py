"""CIDEr-D's compact tables: values equal to pycocoevalcap on hard corpora, in any chunking, and bounded memory.

Every expected value comes from pycocoevalcap (`Cider`, or its `CiderScorer` with the document frequencies of a
training corpus that pycocoevalcap itself counted); no timing is asserted.
"""
from __future__ import annotations

import gc
import json
import random
import tracemalloc
from collections import Counter, defaultdict

import numpy as np
import pytest
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.cider.cider_scorer import CiderScorer

from pacs.eval import cider_tables, ngram_index
from pacs.eval.cider import CiderD, DocumentFrequency, cider_d, cider_df
from pacs.metric.common.errors import InputError
from pacs.rewards import build_reward

TOLERANCE = 1e-12


def _coco(candidates, references):
    """pycocoevalcap's per-caption CIDEr-D (document frequencies from the references)."""
    _, scores = Cider().compute_score(dict(enumerate(references)), {i: [c] for i, c in enumerate(candidates)})
    return np.asarray(scores)


def _coco_fixed(candidates, references, corpus):
    """pycocoevalcap's CIDEr-D with the document frequencies and document count of `corpus` (the SCST rule)."""
    counter = CiderScorer()
    for refs in corpus:
        counter += (None, refs)
    counter.compute_doc_freq()

    class _CorpusSized(list):
        def __len__(self) -> int:
            return len(corpus)

    scorer = CiderScorer()
    for candidate, refs in zip(candidates, references):
        scorer += (candidate, refs)
    scorer.crefs = _CorpusSized(scorer.crefs)
    scorer.document_frequency = defaultdict(float, counter.document_frequency)
    return np.asarray(scorer.compute_cider())


def _edge_corpus(seed: int = 3):
    """Repeated n-grams, empty candidates and references, unseen words, 1-6 references, repeated sets."""
    rng = random.Random(seed)
    words = ["a", "the", "dog", "cat", "on", "in", "grass", "field", "man", "horse", "runs", "sits", "red", "small"]
    candidates, references = [], []
    for i in range(240):
        refs = [" ".join(rng.choices(words, k=rng.randint(1, 12))) for _ in range(1 + i % 6)]
        kind = i % 8
        if kind == 0:
            candidate = refs[0]  # identical to a reference
        elif kind == 1:
            candidate = " ".join([rng.choice(words)] * rng.randint(2, 9))  # one word repeated
        elif kind == 2:
            candidate = ""  # empty
        elif kind == 3:
            candidate = "zebra xylophone " + " ".join(rng.choices(words, k=4)) + " quokka zebra"  # unseen words
        elif kind == 4:
            candidate = "the dog the dog the dog on on"  # repeated bigrams and trigrams
        else:
            candidate = " ".join(rng.choices(words, k=rng.randint(1, 14)))
        candidates.append(candidate)
        references.append(refs)
    references[5] = ["", "a dog"]  # an empty reference
    references[9] = ["a  dog\truns ", "  the cat "]  # irregular whitespace
    references[13] = ["un café au lait", "café"]  # non-ASCII words
    candidates[13] = "un café"
    references[17] = [" ".join(rng.choices(words, k=70))]  # one long reference
    candidates += candidates[:30]  # repeated entries: each counts as a document, as in pycocoevalcap
    references += references[:30]
    references[-1] = list(references[-1])  # an equal set held by another list object
    return candidates, references


@pytest.fixture()
def small_chunks(monkeypatch):
    """Chunks of about 40 tokens and partitions of 16 keys, so that a small corpus spans many of both."""
    monkeypatch.setattr(cider_tables, "CHUNK_TOKENS", 40)
    monkeypatch.setattr(ngram_index, "PARTITION_SIZE", 16)


@pytest.mark.parametrize("chunking", ["default", "small"])
def test_edge_corpus_equals_pycocoevalcap_cold_and_cached(chunking, request):
    if chunking == "small":
        request.getfixturevalue("small_chunks")
    candidates, references = _edge_corpus()
    expected = _coco(candidates, references)
    scorer = CiderD()
    cold = scorer(candidates, references)
    cached = scorer(candidates, references)  # the same references: their statistics are reused
    np.testing.assert_allclose(cold, expected, atol=TOLERANCE, rtol=0)
    np.testing.assert_array_equal(cached, cold)
    assert expected[2] == 0.0 and cold[2] == 0.0  # the empty candidate
    assert expected.std() > 0.5


def test_chunking_changes_nothing(small_chunks):
    candidates, references = _edge_corpus(seed=11)
    candidates, references = candidates[::-1], references[::-1]  # other order: other chunk boundaries
    np.testing.assert_allclose(cider_d(candidates, references), _coco(candidates, references),
                               atol=TOLERANCE, rtol=0)


def test_fixed_corpus_table_equals_pycocoevalcap(small_chunks):
    """cider_df counts exactly pycocoevalcap's document frequencies; references and candidates hold n-grams
    absent from the corpus, and candidates of one image share one reference set (as in SCST)."""
    candidates, references = _edge_corpus(seed=7)
    corpus = references[40:200]
    table = cider_df(corpus)
    counter = CiderScorer()
    for refs in corpus:
        counter += (None, refs)
    counter.compute_doc_freq()
    ours = {(gram,) if isinstance(gram, str) else gram: value for gram, value in table.counts.items()}
    assert ours == dict(counter.document_frequency) and table.num_documents == len(corpus)
    scst_candidates = [c for c in candidates[:60] for _ in range(3)]
    scst_references = [r for r in references[:60] for _ in range(3)]
    rolled = scst_candidates[1:] + scst_candidates[:1]
    expected = _coco_fixed(rolled, scst_references, corpus)
    scorer = CiderD(document_frequency=table)
    np.testing.assert_allclose(scorer(rolled, scst_references), expected, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(scorer(rolled, scst_references), expected, atol=TOLERANCE, rtol=0)  # cached


def test_reward_ids_collide_across_data_sets():
    """Two data sets use the same image ids with other captions: the reward keys nothing by id."""
    rng = random.Random(1)
    words = ["a", "the", "dog", "cat", "on", "in", "grass", "field", "man", "horse", "runs", "sits", "red", "small"]

    def sentences(count):
        return [" ".join(rng.choices(words, k=rng.randint(3, 10))) for _ in range(count)]

    train = [sentences(5) for _ in range(60)]
    first = [sentences(4), sentences(5)]
    second = [sentences(3), sentences(5)]
    captions = [sentences(2), sentences(2)]
    reward = build_reward("cider", train_references=train)
    ids = ["1", "2"]
    for references in (first, second, first):
        got = reward(ids, captions, references).double().numpy()
        flat = [c for row in captions for c in row]
        expected = _coco_fixed(flat, [r for r in references for _ in range(2)], train).reshape(2, 2)
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)  # float32 rewards
    assert reward.fn.document_frequency.num_documents == 60


def test_document_frequency_files_and_views(tmp_path):
    corpus = [["a dog runs", "the dog"], ["a cat sits on a mat", "a cat"], ["a dog and a cat"]]
    table = cider_df(corpus)
    assert table.counts["a"] == 3.0 and table.counts[("a", "dog")] == 2.0 and ("dog", "a") not in table.counts
    assert len(table.counts) == len(set(table.counts)) == len(table.keys)
    assert DocumentFrequency(dict(table.counts), 3.0, corpus_sha256=table.corpus_sha256) == table
    path = tmp_path / "df.json"
    table.save(path)
    assert json.loads(path.read_text())["format"] == "pacs-cider-df/2"
    assert DocumentFrequency.load(path) == table
    legacy = tmp_path / "legacy.json"  # the format of pacs 0.3 and 0.4
    legacy.write_text(json.dumps({"format": "pacs-cider-df/1", "n": 4, "num_documents": 3.0,
                                  "corpus_sha256": table.corpus_sha256,
                                  "counts": {" ".join([g] if isinstance(g, str) else g): v
                                             for g, v in table.counts.items()}}))
    loaded = DocumentFrequency.load(legacy)
    assert loaded == table
    candidates, references = ["a dog sits", "a cat"], [["a dog runs"], ["a cat sits", "the mat"]]
    np.testing.assert_allclose(cider_d(candidates, references, loaded), cider_d(candidates, references, table),
                               atol=TOLERANCE, rtol=0)


def test_vocabulary_capacity():
    huge = [[" ".join(f"w{i}x{j}" for j in range(10))] for i in range(6600)]  # 66,000 distinct words
    with pytest.raises(InputError, match="65,535 distinct"):
        CiderD()(["w1x1"] * len(huge), huge)
    half = [[" ".join(f"v{i}x{j}" for j in range(10))] for i in range(4000)]
    scorer = CiderD()
    scorer(["w1x1"] * 4000, huge[:4000])
    got = scorer(["v1x1 v1x2"] * 4000, half)  # together beyond the capacity: a fresh vocabulary is started
    np.testing.assert_allclose(got, _coco(["v1x1 v1x2"] * 4000, half), atol=TOLERANCE, rtol=0)


def _occurrences(corpus, n=4):
    return sum(max(0, len(ref.split()) - k + 1) for refs in corpus for ref in refs for k in range(1, n + 1))


def _per_ngram_table(corpus, n=4):
    """The pre-0.5 table in a few lines: a Counter keyed by one Python tuple per distinct n-gram."""
    counts: Counter = Counter()
    for refs in corpus:
        grams = set()
        for ref in refs:
            words = ref.split()
            grams.update(tuple(words[i:i + k]) for k in range(1, n + 1) for i in range(len(words) - k + 1))
        counts.update(grams)
    return counts


def _traced(build):
    gc.collect()
    tracemalloc.start()
    try:
        result = build()
        peak = tracemalloc.get_traced_memory()[1]
        gc.collect()  # what the interpreter's free lists cache (tuples, lists) is not held by the result
        current = tracemalloc.get_traced_memory()[0]
        blocks = sum(stat.count for stat in tracemalloc.take_snapshot().statistics("filename"))
    finally:
        tracemalloc.stop()
    return result, peak, current, blocks


def test_table_memory_is_bounded_by_the_arrays(shared_data):
    """Building the tables of 20,000 Flickr8k captions: peak below 32 bytes per n-gram occurrence (four 8-byte
    values), what stays is the arrays (12 bytes per distinct n-gram) and one string per word, and both are far
    below the per-n-gram table of pacs <= 0.4 measured the same way."""
    by_image: dict[str, list[str]] = {}
    for line in (shared_data / "flickr8k" / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines():
        key, _, caption = line.partition("\t")
        words = caption.lower().replace(".", " ").replace(",", " ").replace('"', " ").split()
        by_image.setdefault(key.split("#")[0], []).append(" ".join(words))
    corpus = [by_image[key][:5] for key in sorted(by_image)[:4000]]
    assert sum(map(len, corpus)) == 20000
    occurrences = _occurrences(corpus)

    table, peak, retained, blocks = _traced(lambda: cider_df(corpus, tokenized=True))  # tokenized above
    distinct = len(table.keys)
    assert peak < 32 * occurrences
    assert table.nbytes <= 12 * distinct
    assert blocks < len(table.words) + 1000 < distinct / 20  # no Python object per n-gram
    old, old_peak, old_retained, old_blocks = _traced(lambda: _per_ngram_table(corpus))
    assert len(old) == distinct
    assert old_blocks > distinct  # one tuple (at least) per n-gram
    assert peak < 0.75 * old_peak and retained < old_retained / 5

    scorer = CiderD(document_frequency=table)
    _, state_peak, _, _ = _traced(lambda: scorer(["a dog"] * len(corpus), corpus))
    assert scorer.nbytes < 32 * occurrences  # the prepared reference statistics
    assert state_peak < 64 * occurrences
