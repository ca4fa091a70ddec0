"""Empty captions (issue 21, item 10.3): why beam search returns them, `min_length`, and the warning of `pacs caption`.

An under-trained captioner may give <eos> at the first step more probability than any whole caption has: the
empty caption is then the most probable sequence, which beam search finds and greedy decoding does not. That is
the model's answer, not a search error; `min_length` forbids it and `pacs caption` counts and reports it.
"""
from __future__ import annotations

import itertools
import json
import logging
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from pacs.captioner.modeling.decoding import beam_search, greedy
from pacs.captioner.modeling.vocab import BOS_ID, EOS_ID, PAD_ID
from pacs.metric.common.errors import InputError

# ids 0..5: <pad>, <bos>, <eos>, <unk>, "a", "b"; the first step prefers "a", and <eos> beats any whole caption
FIRST = [0.0, 0.0, 0.30, 0.05, 0.45, 0.20]
LATER = [0.0, 0.0, 0.40, 0.10, 0.30, 0.20]
WORDS = (3, 4, 5)


class _State:
    def __init__(self, position: int = 0) -> None:
        self.position = position

    def select(self, index: torch.Tensor) -> _State:
        return _State(self.position)


class _TableModel:
    """A decoder whose next-token distribution depends on the step only (FIRST, then LATER)."""

    def __init__(self, max_length: int) -> None:
        self.config = SimpleNamespace(max_length=max_length)

    def start(self, features: torch.Tensor) -> _State:
        return _State()

    def step(self, previous: torch.Tensor, state: _State) -> torch.Tensor:
        table = FIRST if state.position == 0 else LATER
        state.position += 1
        return torch.tensor(table).log().expand(previous.shape[0], -1).clone()


def most_probable(max_words: int, min_words: int = 0) -> tuple[tuple[int, ...], float]:
    """The most probable (words, probability) by enumerating every caption of the table model."""
    best: tuple[tuple[int, ...], float] = ((), -1.0)
    for n in range(min_words, max_words + 1):
        for words in itertools.product(WORDS, repeat=n):
            tokens = (*words, EOS_ID)
            probability = math.prod((FIRST if t == 0 else LATER)[token] for t, token in enumerate(tokens))
            if probability > best[1]:
                best = (words, probability)
    return best


def _words(tokens: torch.Tensor) -> tuple[int, ...]:
    kept = []
    for token in tokens.tolist():
        if token in (EOS_ID, PAD_ID):
            break
        kept.append(token)
    return tuple(kept)


def test_beam_search_finds_the_most_probable_caption_even_when_it_is_empty() -> None:
    model, features = _TableModel(max_length=3), torch.zeros(2, 1, 1)
    words, probability = most_probable(3)
    assert words == () and probability == pytest.approx(0.30)  # the table's answer, by enumeration
    for beam_size in (2, 3, 5):
        decoded = beam_search(model, features, beam_size=beam_size, return_k=1)
        assert [_words(row[0]) for row in decoded.tokens] == [(), ()]
        assert decoded.log_probs[:, 0].exp().tolist() == pytest.approx([0.30, 0.30])
    first = greedy(model, features)  # one beam: "a" is the most probable first token
    assert [_words(row[0]) for row in first.tokens] == [(4,), (4,)]


def test_min_length_forbids_ending_before_that_many_words() -> None:
    model, features = _TableModel(max_length=3), torch.zeros(1, 1, 1)
    for min_length in (1, 2):
        words, probability = most_probable(3, min_words=min_length)
        decoded = beam_search(model, features, beam_size=5, return_k=1, min_length=min_length)
        assert _words(decoded.tokens[0, 0]) == words and len(words) == min_length
        assert float(decoded.log_probs[0, 0].exp()) == pytest.approx(probability)
    with pytest.raises(InputError, match="min_length must be in 0..3"):
        beam_search(model, features, beam_size=2, min_length=4)
    assert BOS_ID not in beam_search(model, features, beam_size=5).tokens.tolist()


def _ending_captioner(folder: Path) -> Path:
    """A captioner with one next-token distribution at every step: "a" first, then <eos> (logits 2.5 and 2.0).

    Greedy decoding repeats "a"; the most probable caption ends at once (p(<eos>) > p("a") p(<eos>)).
    """
    from pacs.captioner.modeling.checkpoints import save_captioner
    from pacs.captioner.modeling.model import Captioner, CaptionerConfig
    from pacs.captioner.modeling.vocab import build_vocab
    from pacs.metric.models.backbones import tiny_clip_config

    vocab = build_vocab("word", ["a dog runs", "a cat sits"], min_count=1, max_length=6)
    config = CaptionerConfig(d_model=32, n_heads=4, encoder_layers=1, decoder_layers=1, ffn_dim=64, dropout=0.0,
                             vocab_size=len(vocab), feature_dim=64, max_length=vocab.max_length)
    model = Captioner(config)
    with torch.no_grad():  # the decoder's output is the constant unit vector e0, whatever it reads
        model.decoder_norm.weight.zero_()
        model.decoder_norm.bias.zero_()
        model.decoder_norm.bias[0] = 1.0
        model.head.weight.zero_()
        model.head.weight[EOS_ID, 0], model.head.weight[vocab.encode("a")[0], 0] = 2.0, 2.5
    return save_captioner(folder / "captioner", model, vocab, {"random_config": tiny_clip_config(), "random_seed": 0})


def test_pacs_caption_counts_and_reports_empty_captions(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    from pacs.cli import main

    checkpoint = _ending_captioner(tmp_path)
    images = tmp_path / "images"
    images.mkdir()
    for name, colour in (("one", "red"), ("two", "blue"), ("three", "green")):
        Image.new("RGB", (40, 40), colour).save(images / f"{name}.png")
    out = tmp_path / "results.json"
    with caplog.at_level(logging.WARNING, logger="pacs.captioner.commands.caption_train"):
        assert main(["caption", "--checkpoint", str(checkpoint), "--images", str(images), "--out", str(out)]) == 0
    assert [row["caption"] for row in json.loads(out.read_text())] == ["", "", ""]
    assert "captioned 3 images" in (printed := capsys.readouterr().out) and "(3 empty" in printed
    assert next(r.message for r in caplog.records if "empty" in r.message).startswith("3 of 3 captions are empty")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pacs.captioner.commands.caption_train"):
        assert main(["caption", "--checkpoint", str(checkpoint), "--images", str(images), "--out", str(out),
                     "--min-length", "1"]) == 0
    assert [row["caption"] for row in json.loads(out.read_text())] == ["a"] * 3  # "a" + <eos>: the best with a word
    assert "empty" not in capsys.readouterr().out
    assert not [r for r in caplog.records if "empty" in r.message]
