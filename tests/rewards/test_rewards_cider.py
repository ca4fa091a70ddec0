"""The cider reward: pycocoevalcap's CIDEr-D values on real Flickr8k captions, tokenization, caches."""
from __future__ import annotations

import pytest
import torch
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

from pacs.captioner.data import load_dataset
from pacs.metric.common.errors import InputError
from pacs.rewards import build_reward
from pacs.rewards.text import PTB_PUNCTUATIONS, java_ptb_tokenizer, ptb_tokenize_fast


@pytest.fixture(scope="module")
def flickr8k(shared_data):
    """Real Flickr8k captions (all 8,000 split images, images not needed)."""
    return load_dataset("flickr8k", shared_data / "flickr8k", missing_images="keep")


def _java_tokenize(captions: dict[str, list[str]]) -> dict[str, list[str]]:
    return PTBTokenizer().tokenize({key: [{"caption": c} for c in caps] for key, caps in captions.items()})


@pytest.mark.parametrize("tokenizer", ["fast", "ptb"])
def test_values_equal_pycocoevalcap_cider_d(flickr8k, tokenizer):
    items = flickr8k.split("test").items[:40]
    ids = [item.image_id for item in items]
    refs = [item.captions[:4] for item in items]
    # column 0: the held-out 5th reference; column 1: a reference of the next image
    captions = [[item.captions[4], items[(i + 1) % len(items)].captions[0]] for i, item in enumerate(items)]
    reward = build_reward("cider", train_references=refs, cider_tokenizer=tokenizer)
    values = reward(ids, captions, refs)
    assert values.shape == (40, 2) and values.dtype == torch.float32
    gts = _java_tokenize(dict(zip(ids, refs)))
    for column in range(2):
        res = _java_tokenize({image_id: [row[column]] for image_id, row in zip(ids, captions)})
        _, expected = Cider().compute_score(gts, res)
        assert torch.allclose(values[:, column].double(), torch.tensor(expected), atol=1e-5)
    assert values[:, 0].mean() > 3 * values[:, 1].mean()  # own references score higher


def test_candidates_and_references_share_the_tokenization(flickr8k):
    refs = [["A dog runs on the grass.", "A brown dog's running"], ["Two men (friends) talk."]]
    reward = build_reward("cider", train_references=[item.captions for item in flickr8k.items[:500]] + refs)
    values = reward(["a", "b"], [["a dog runs on the grass", "A DOG RUNS ON THE GRASS ."],
                                 ["two men ( friends ) talk", "Two men (friends) talk!"]], refs)
    assert values[0, 0] == values[0, 1] and values[1, 0] == values[1, 1] and values.min() > 0


def test_fast_tokenizer_agrees_with_java_ptb_on_flickr8k(flickr8k):
    captions = [caption for item in flickr8k for caption in item.captions]
    assert len(captions) == 40000
    java = java_ptb_tokenizer(captions)
    fast = [ptb_tokenize_fast(caption) for caption in captions]
    disagreements = [(c, j, f) for c, j, f in zip(captions, java, fast) if j != f]
    assert not disagreements, disagreements[:5]  # pacs.eval.ptb: equal on every caption


@pytest.mark.parametrize("caption", [
    "A man's dog (black) jumps over a log.",
    "He can't and won't; she'd've \"quoted\" text -- yes - no...",
    "A t-shirt and/or 1,000 dollars $5 at 50% & St. Louis Mr. Smith U.S.A. e.g. a.m.",
    "Two dogs , one brown , wait!? [brackets] {braces} It's 5:30 don't they're I'm we'll you've cannot gonna",
    "An at&t sign, x=y * z.",
])
def test_fast_tokenizer_on_hard_cases(caption):
    assert ptb_tokenize_fast(caption) == java_ptb_tokenizer([caption])[0]
    assert not set(ptb_tokenize_fast(caption).split()) & PTB_PUNCTUATIONS


def test_reference_statistics_are_cached(monkeypatch):
    calls: list[int] = []
    from pacs.rewards import text

    original = text.TOKENIZERS["fast"]
    monkeypatch.setitem(text.TOKENIZERS, "fast", lambda captions: calls.append(len(captions)) or original(captions))
    refs = [["a cat on a mat", "a cat"], ["a dog", "the dog barks"]]
    reward = build_reward("cider", train_references=refs)
    assert calls == [4]  # the training corpus
    reward(["x", "y"], [["a cat", "a dog"], ["dog", "a dog barks"]], refs)
    reward(["y", "x"], [["cat", "dog"], ["a cat mat", "mat"]], refs[::-1])
    assert calls == [4, 4, 4, 4]  # references once (2 images x 2), then only the 4 candidates per call
    assert len(reward.fn.tokenized_references) == 2


def test_document_frequency_disk_cache_and_errors(tmp_path):
    refs = [["a cat on a mat"], ["a dog in the park", "a dog"]]
    cache = tmp_path / "df.json.gz"
    first = build_reward("cider", train_references=refs, cider_df_cache=str(cache))
    assert cache.is_file()
    second = build_reward("cider", document_frequency=str(cache))
    batch = (["a", "b"], [["a cat", "a mat"], ["dog", "a dog in a park"]], refs)
    assert torch.equal(first(*batch), second(*batch))
    with pytest.raises(InputError, match="needs the training references"):
        build_reward("cider")
    with pytest.raises(InputError, match="cider_tokenizer='spacy'"):
        build_reward("cider", train_references=refs, cider_tokenizer="spacy")
    with pytest.raises(InputError, match="cider reward: image 'b' has no references"):
        first(["a", "b"], [["x"], ["y"]], [["a cat"], []])
