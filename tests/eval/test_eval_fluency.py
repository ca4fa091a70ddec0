"""Rep-n and %Incorrect on hand-checked captions."""
from __future__ import annotations

import math

import pytest

from pacs.eval import fluency
from pacs.metric.common.errors import InputError


def test_repetitions_hand_checked():
    # "a man on a bench on a street": a x3 (+2), on x2 (+1) -> 3 repeated unigrams
    caption = "A man on a bench on a street."
    assert fluency.repetitions(caption, 1) == 3
    # bigrams: "on a" x2 (+1); "a man","man on","a bench","bench on","a street" once -> 1
    assert fluency.repetitions(caption, 2) == 1
    assert fluency.repetitions(caption, 3) == 0
    # CLIP-S reward hacking tail: "area area area" -> area x3 (+2), "area area" x2 (+1)
    assert fluency.repetitions("a park area area area", 1) == 2
    assert fluency.repetitions("a park area area area", 2) == 1
    assert fluency.repetitions("", 1) == 0
    assert fluency.repetitions("dog", 2) == 0


def test_rep_n_is_mean_over_captions():
    captions = ["A man on a bench on a street.", "a dog", "setting setting setting setting"]
    # rep1: 3, 0, 3 -> mean 2; rep2: 1, 0, 2 -> 1; rep4: 0, 0, 0
    assert fluency.rep_n(captions, 1) == pytest.approx(2.0)
    assert fluency.rep_n(captions, 2) == pytest.approx(1.0)
    assert fluency.rep_n(captions, 3) == pytest.approx(1 / 3)
    assert fluency.rep_n(captions, 4) == 0.0
    assert math.isnan(fluency.rep_n([], 1))


def test_ends_incorrectly_hand_checked():
    assert fluency.ends_incorrectly("Three people sitting on a bench on a.")  # determiner
    assert fluency.ends_incorrectly("A street sign on the side of")  # preposition
    assert fluency.ends_incorrectly("a man riding a horse and")  # conjunction
    assert fluency.ends_incorrectly("two dogs playing with the")
    assert not fluency.ends_incorrectly("A street sign on the side of a road.")
    assert not fluency.ends_incorrectly("a dog jumping up")  # particle, well-formed
    assert not fluency.ends_incorrectly("people standing outside")
    assert not fluency.ends_incorrectly("")
    assert not fluency.ends_incorrectly("...")


def test_incorrect_rate_percentage():
    captions = ["a cat on a", "a cat on a mat", "a dog with", "a dog"]
    assert fluency.incorrect_rate(captions) == pytest.approx(50.0)
    assert fluency.incorrect_rate(["the"]) == 100.0
    assert math.isnan(fluency.incorrect_rate([]))


def test_bad_input():
    with pytest.raises(InputError, match="single string"):
        fluency.rep_n("a dog", 1)
    with pytest.raises(InputError, match="caption 1 is NoneType"):
        fluency.incorrect_rate(["a", None])
    with pytest.raises(InputError, match="n must be"):
        fluency.repetitions("a", 0)
