"""Tokenizer: OpenAI CLIP rules (special-token spelling, truncation) and exact trimmed text encoding."""
from __future__ import annotations

import json

import torch
from open_clip.tokenizer import SimpleTokenizer

from pacs.metric.models.tokenizer import EOT_ID, SOT_ID, ClipTokenizer


def test_fixture_prompt_ids_match_official(pacscore_fixtures):
    expected = json.loads((pacscore_fixtures / "A" / "expected.json").read_text())
    tokenizer = ClipTokenizer()
    batch = tokenizer.encode([expected["prompt_prefix"] + i["candidate"] for i in expected["instances"]])
    for instance, ids in zip(expected["instances"], batch.ids):
        assert ids == instance["prompt_token_ids"], instance["note"]
    truncated_notes = [i["note"] for i, cut in zip(expected["instances"], batch.truncated) if cut]
    assert batch.n_truncated == len(truncated_notes) == 3
    assert all("truncated" in note and "no truncation" not in note for note in truncated_notes)


def test_literal_special_tokens_use_openai_spelling():
    tokenizer = ClipTokenizer()
    ids = tokenizer.encode(["<|endoftext|> child"]).ids[0]
    assert ids[:2] == [SOT_ID, EOT_ID] and ids[-1] == EOT_ID
    # open_clip's own spelling is ordinary text for OpenAI's tokenizer ...
    plain = tokenizer.encode(["<end_of_text>"]).ids[0]
    assert EOT_ID not in plain[1:-1] and len(plain) > 3
    # ... while open_clip maps it to EOT: the two tokenizers really differ here.
    assert SimpleTokenizer().encode("<end_of_text>") == [EOT_ID]


def test_truncation_keeps_first_ids_and_ends_with_eot():
    tokenizer = ClipTokenizer()
    long_text = " ".join(["dog"] * 100)
    batch = tokenizer.encode([long_text, "a dog"])
    assert batch.truncated == [True, False] and batch.n_truncated == 1
    ids = batch.ids[0]
    assert len(ids) == 77 and ids[0] == SOT_ID and ids[-1] == EOT_ID
    assert ids[1:76] == tokenizer.encode_text(long_text)[:75]
    padded = tokenizer(["a dog"])
    assert padded.shape == (1, 77) and padded[0, 4:].eq(0).all()


def test_trimmed_text_encoding_equals_full_padding(tiny_backbone):
    tokenizer = tiny_backbone.tokenize
    texts = ["a dog", "a man riding a horse on the beach at sunset", "!", " ".join(["cat"] * 90)]
    ids = tokenizer.encode(texts).ids
    full = tokenizer.pad(ids, 77)
    assert max(map(len, ids)) == 77
    with torch.no_grad():
        reference = tiny_backbone.model.encode_text(full)  # open_clip's own 77-token forward
        for length in (max(map(len, ids[:3])), 40, 77):
            subset = [i for i, seq in enumerate(ids) if len(seq) <= length]
            trimmed = tiny_backbone.encode_text(tokenizer.pad([ids[i] for i in subset], length))
            assert torch.allclose(trimmed, reference[subset], atol=1e-5, rtol=0)
    # The padding really is cut: the trimmed forward runs on fewer positions.
    assert max(map(len, ids[:3])) < 20


def test_remembered_texts_give_the_ids_a_fresh_tokenizer_gives(monkeypatch):
    """The text -> ids memory: the same ids as a tokenizer that never saw the text (also after the memory was
    emptied when full), and a caller changing a returned list does not change what the next call returns."""
    import pacs.metric.models.tokenizer as tokenizer_module

    texts = ["a red circle", "A  red circle &amp; a dog", "a red circle", "<|endoftext|> child", "caf\u00e9 \u2013 x"] * 3
    monkeypatch.setattr(tokenizer_module, "ENCODED_CACHE_SIZE", 3)  # emptied several times over the list
    remembering = ClipTokenizer()
    for text in texts:
        ids = remembering.encode_text(text)
        assert ids == ClipTokenizer().encode_text(text), text
        ids.append(-1)  # the caller's list is its own
        assert remembering.encode_text(text) == ClipTokenizer().encode_text(text)
    assert len(remembering._encoded) <= 3
