"""The Python PTB tokenizer equals pycocoevalcap's Java PTBTokenizer on every caption of the shared data sets.

Both tokenizers get the same list in one call each (Java reads the captions as consecutive lines, and a caption's
tokens can depend on the next one: "the letter S." keeps its period unless the next caption starts a sentence),
so the comparison is list against list, exact string equality.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.io

from pacs.eval.ptb import python_ptb_tokenize
from pacs.eval.text_metrics import compute_text_metrics
from pacs.eval.tokenize import java_ptb_tokenize, ptb_tokenize
from pacs.metric.common.errors import InputError, MissingResourceError


def _mat_strings(value) -> list[str]:
    """Every string inside a (nested) MATLAB cell / struct field."""
    array = np.asarray(value).ravel()
    if array.dtype.kind in "US":
        return [str(item) for item in array]
    return [text for item in array for text in _mat_strings(item)]


def _shared_captions(data: Path) -> dict[str, list[str]]:
    """Every caption of Flickr8k, Pascal-50S and the hallucination sets, per data set, in file order."""
    flickr = [line.split("\t", 1)[1] for line in
              (data / "flickr8k" / "Flickr8k.token.txt").read_text(encoding="utf-8").splitlines() if line.strip()]
    pascal: list[str] = []
    for entry in scipy.io.loadmat(data / "pascal50s" / "pair_pascal.mat")["new_input"].ravel():
        pascal += _mat_strings(entry["sent1"]) + _mat_strings(entry["sent2"])
    for name, key in (("pascal50S.mat", "refs"), ("pascal_cands.mat", "cands"), ("pascal_single.mat", "cands")):
        for entry in scipy.io.loadmat(data / "pascal50s" / name)[key].ravel():
            pascal += _mat_strings(entry["sent"])
    hallucination: list[str] = []
    for item in json.loads((data / "hallucination" / "hat-trainval.json").read_text(encoding="utf-8")):
        hallucination += [item["caption"], *item["references"]]
    for item in json.loads((data / "hallucination" / "nocaps-val-foil.json").read_text(encoding="utf-8")):
        hallucination += [item["baseline"], item["foil"], *item["references"]]
    return {"flickr8k": flickr, "pascal50s": pascal, "hallucination": hallucination}


@pytest.mark.skipif(shutil.which("java") is None, reason="the comparison needs pycocoevalcap's Java tokenizer")
def test_python_equals_java_on_every_shared_caption(shared_data):
    sets = _shared_captions(shared_data)
    assert len(sets["flickr8k"]) == 40460 and len(sets["pascal50s"]) > 50000 and len(sets["hallucination"]) > 25000
    captions = list(dict.fromkeys(c for texts in sets.values() for c in texts))  # 122k distinct strings
    java = java_ptb_tokenize(captions)  # one Java process for all of them
    python = python_ptb_tokenize(captions)
    different = [(c, j, p) for c, j, p in zip(captions, java, python) if j != p]
    assert not different, different[:5]


# cases written by hand for the tokenizer's rules (the expected strings are what pycocoevalcap's Java tokenizer
# prints for them, checked against it below when Java is present)
HAND_CASES = {
    "A man's dog (black) jumps over a log.": "a man 's dog -lrb- black -rrb- jumps over a log",
    "He can't and won't; she isn't \"quoted\" -- yes - no...": "he ca n't and wo n't she is n't quoted yes no",
    "A t-shirt and/or 1,000 dollars $5 at 50% in St. Louis, U.S.A.": "a t-shirt and/or 1,000 dollars $ 5 at 50 % in "
                                                                    "st. louis u.s.a.",
    "An eggplant,2 carrots and M&Ms on a table.,": "an eggplant ,2 carrots and m&m s on a table.",
    "It’s 5:30, what is this?? :)": "it 's 5:30 what is this ?? :-rrb-",
    "hors d' oevures and o'clock &apos;ve¬": "hors d' oevures and o'clock 've ¬",
    "impersonators.(Cheese!) friends/ family": "impersonators -lrb- cheese -rrb- friends / family",
}


def test_python_tokenizer_on_hand_written_cases():
    assert python_ptb_tokenize(list(HAND_CASES)) == list(HAND_CASES.values())


def test_a_one_letter_abbreviation_keeps_its_period_unless_a_sentence_follows():
    # Java reads the next caption as the next line: "The" there starts a sentence, "a" does not
    assert python_ptb_tokenize(["the letter S.", "The end"])[0] == "the letter s"
    assert python_ptb_tokenize(["the letter S.", "a dog"])[0] == "the letter s."
    assert python_ptb_tokenize(["the letter S. The dog", "x"])[0] == "the letter s the dog"
    assert python_ptb_tokenize(["Washington D.C.", "The end"])[0] == "washington d.c."


# forms absent from the shared data sets that the rules also cover
BEYOND_THE_DATA = ["o'clock, O'Neil's rock 'n' roll of the '90s; y'all 'Tis", "C++ at http://www.example.com/a/b",
                   "mail a.b@c.org or @home #hashtag __init__ snake_case", "a ½ cup, x² and 5€ or £10…",
                   "gonna wanna cannot ain't DON'T", "St. Louis, Mr. Smith vs. Dr. Who and no. 5 (fig. 2)"]


@pytest.mark.skipif(shutil.which("java") is None, reason="needs pycocoevalcap's Java tokenizer")
def test_hand_written_cases_are_what_java_prints():
    lines = [*HAND_CASES, "the letter S.", "The end", "the letter S.", "a dog", "the letter S. The dog", "x",
             *BEYOND_THE_DATA]
    assert python_ptb_tokenize(lines) == java_ptb_tokenize(lines)


def test_bad_input_is_named():
    with pytest.raises(InputError, match="not a single string"):
        python_ptb_tokenize("a dog")
    with pytest.raises(InputError, match="caption 1 is int"):
        python_ptb_tokenize(["a dog", 3])
    with pytest.raises(InputError, match="choose one of python, java"):
        ptb_tokenize(["a"], "jar")


def test_bleu_rouge_cider_need_no_java_meteor_does(no_java):
    candidates = ["A dog runs on the grass.", "A man rides a horse."]
    references = [["a dog running on grass", "the dog is in a field"], ["a man on a horse", "a rider and his horse"]]
    values = compute_text_metrics(candidates, references, ["bleu1", "rouge", "cider"])
    # the corpus values pycocoevalcap prints for these pairs (its Java tokenizer; the module's doctest)
    assert round(values["bleu1"].corpus, 4) == 0.8182 and round(values["rouge"].corpus, 4) == 0.7697
    assert round(values["cider"].corpus, 4) == 1.7764
    with pytest.raises(MissingResourceError, match="meteor need it"):
        compute_text_metrics(candidates, references, ["bleu1", "meteor"])
    with pytest.raises(MissingResourceError, match="Java PTB tokenizer"):
        compute_text_metrics(candidates, references, ["bleu1"], tokenizer="java")
