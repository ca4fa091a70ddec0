"""Text metrics PTB-tokenize by default, with a flag for pre-tokenized input (issue 42 item 7).

"A dog, running." scores as "a dog running" through `cider_d`, `cider_df`, `compute_text_metrics`,
`evaluate_systems` and `pacs evaluate`; with the flag (`tokenized=True`, `--tokenized`) the strings are scored as
given: the numbers of pycocoevalcap's scorers called on the raw strings, computed here independently.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider

from pacs import cli as pacs_cli
from pacs.eval import cider_d, cider_df, compute_text_metrics, evaluate_systems

REFERENCES = [["A dog runs on the grass.", "The dog is running, fast!"],
              ["A man rides a horse.", "A rider and his horse."],
              ["Two cats sleep on a sofa.", "Cats asleep, on the couch."]]
RAW = ["A dog, running.", "A man on a horse!", "Two cats, sleeping."]
CLEAN = ["a dog running", "a man on a horse", "two cats sleeping"]
CLEAN_REFERENCES = [["a dog runs on the grass", "the dog is running fast"],
                    ["a man rides a horse", "a rider and his horse"],
                    ["two cats sleep on a sofa", "cats asleep on the couch"]]


def _coco_cider(candidates: list[str], references: list[list[str]]) -> np.ndarray:
    """pycocoevalcap's Cider on the strings as given (it splits on white space)."""
    _, scores = Cider().compute_score(dict(enumerate(references)), {i: [c] for i, c in enumerate(candidates)})
    return np.asarray(scores, dtype=np.float64)


def test_cider_d_tokenizes_by_default():
    """Raw captions and references score as their hand-tokenized forms; the flag gives the untokenized number."""
    expected = _coco_cider(CLEAN, CLEAN_REFERENCES)
    assert expected.min() > 0.5  # the clean captions do match their references
    np.testing.assert_allclose(cider_d(RAW, REFERENCES), expected, atol=1e-12, rtol=0)
    untokenized = _coco_cider(RAW, REFERENCES)
    np.testing.assert_allclose(cider_d(RAW, REFERENCES, tokenized=True), untokenized, atol=1e-12, rtol=0)
    assert not np.allclose(untokenized, expected)  # the trap the default closes


def test_cider_df_tokenizes_like_cider_d():
    """A table built from raw references equals one built from their tokens (the scores it gives are equal)."""
    raw_table, clean_table = cider_df(REFERENCES), cider_df(CLEAN_REFERENCES, tokenized=True)
    assert raw_table.corpus_sha256 == clean_table.corpus_sha256
    np.testing.assert_array_equal(cider_d(RAW, REFERENCES, raw_table), cider_d(CLEAN, CLEAN_REFERENCES, clean_table))
    untokenized = cider_df(REFERENCES, tokenized=True)
    assert untokenized.corpus_sha256 != clean_table.corpus_sha256


def test_compute_text_metrics_flag():
    """BLEU and CIDEr-D: PTB by default, the raw strings with `tokenized=True` (pycocoevalcap on them)."""
    default = compute_text_metrics(RAW, REFERENCES, ["bleu1", "cider"])
    flagged = compute_text_metrics(RAW, REFERENCES, ["bleu1", "cider"], tokenized=True)
    gts, res = dict(enumerate(REFERENCES)), {i: [c] for i, c in enumerate(RAW)}
    bleu_raw, _ = Bleu(4).compute_score(gts, res, verbose=0)
    clean_gts, clean_res = dict(enumerate(CLEAN_REFERENCES)), {i: [c] for i, c in enumerate(CLEAN)}
    bleu_clean, _ = Bleu(4).compute_score(clean_gts, clean_res, verbose=0)
    assert default["bleu1"].corpus == pytest.approx(bleu_clean[0], abs=1e-12)
    assert flagged["bleu1"].corpus == pytest.approx(bleu_raw[0], abs=1e-12)
    np.testing.assert_allclose(default["cider"].per_caption, _coco_cider(CLEAN, CLEAN_REFERENCES), atol=1e-12)
    np.testing.assert_allclose(flagged["cider"].per_caption, _coco_cider(RAW, REFERENCES), atol=1e-12)


def test_evaluate_systems_and_cli_flag(tmp_path):
    """`evaluate_systems(..., tokenized=True)` and `pacs evaluate --tokenized` score the strings as given."""
    ids = [str(i) for i in range(len(RAW))]
    captions, references = dict(zip(ids, RAW)), dict(zip(ids, REFERENCES))
    clean = _coco_cider(CLEAN, CLEAN_REFERENCES).mean()
    raw = _coco_cider(RAW, REFERENCES).mean()
    for options, expected in (({}, clean), ({"tokenized": True}, raw)):
        table = evaluate_systems({"A": captions}, references, "cider", bootstrap=0, **options)
        assert table["rows"][0]["values"]["cider"] == pytest.approx(expected, abs=1e-12)
    candidates_file, references_file = tmp_path / "captions.json", tmp_path / "refs.json"
    candidates_file.write_text(json.dumps(captions))
    references_file.write_text(json.dumps(references))
    for flags, expected in (([], clean), (["--tokenized"], raw)):
        out = tmp_path / f"out{len(flags)}.json"
        code = pacs_cli.main(["evaluate", "--candidates", str(candidates_file), "--references", str(references_file),
                              "--metrics", "cider", "--out", str(out), *flags])
        assert code == 0
        assert json.loads(out.read_text())["metrics"]["cider"] == pytest.approx(expected, abs=1e-12)
