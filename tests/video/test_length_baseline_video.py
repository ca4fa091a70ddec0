"""`--metrics length` (the caption-length baseline, in words) on the video benchmarks, checked by hand."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from pacs.eval import correlate

from .video_support import tau_b_by_pairs, write_activitynet_foil, write_vatex_eval


def test_vatex_eval_length_column_is_tau_b_of_word_counts(tmp_path):
    folder = write_vatex_eval(tmp_path / "vatex", n_videos=3, per_video=4, n_refs=2, seed=1)
    table = correlate("vatex-eval", folder, "length")
    candidates = pickle.loads((folder / "candidates_list.pkl").read_bytes()).tolist()
    human = np.asarray(pickle.loads((folder / "human_scores.pkl").read_bytes()), dtype=float).reshape(3, -1)
    words = [len(caption.split()) for caption in candidates]
    assert words[:4] == [4, 5, 6, 7]  # "candidate 0-c for vid0" + " again" * c
    expected = 100 * np.mean([tau_b_by_pairs(words, annotator) for annotator in human])
    assert table["length"]["tau_b"] == pytest.approx(expected, abs=1e-9)
    assert table["length"]["n"] == len(candidates)


def test_activitynet_foil_length_column_is_the_paragraph_word_count_accuracy(tmp_path):
    folder = write_activitynet_foil(tmp_path / "anet")
    table = correlate("activitynet-foil", folder, "length")
    # v_a: right and foil paragraphs both average 5 words (tie: half); v_b: 5 words each (tie: half)
    assert table["length"]["mean"] == 50.0 and table["length"]["n"] == 2
