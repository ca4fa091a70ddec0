"""VATEX-EVAL and ActivityNet-FOIL loaders on small files in the released formats; their protocols."""
from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
from scipy import stats

from pacs.eval.benchmarks.activitynet_foil import (
    foil_accuracy,
    load_activitynet_foil,
    overlapping_references,
    paragraph_scores,
    segment_frames,
)
from pacs.eval.benchmarks.vatex_eval import correlations, load_pickle, load_vatex_eval
from pacs.metric.common.errors import InputError

from .video_support import write_activitynet_foil, write_vatex_eval


def test_vatex_eval_loader_reads_released_layout(tmp_path):
    folder = write_vatex_eval(tmp_path / "vatex", n_videos=2, per_video=3, n_refs=10)
    data = load_vatex_eval(folder)
    assert len(data) == 6
    assert data.video_ids == ["vid0", "vid0", "vid0", "vid1", "vid1", "vid1"]
    assert data.candidates[4] == "candidate 1-1 for vid1 again"
    assert len(data.references[0]) == 10 and data.references_at(1)[3] == ["reference 0 of vid1"]
    with open(folder / "human_scores.pkl", "rb") as handle:
        raw = pickle.load(handle)
    # annotator-major layout: the first N values are annotator 0's ratings of the N candidates
    np.testing.assert_array_equal(data.human_scores[:, 0], raw[:6])
    np.testing.assert_array_equal(data.human_scores[:, 2], raw[12:])
    assert data.idf_corpus == ["train caption one", "train caption two", "another train caption"]
    with pytest.raises(InputError, match="11 requested"):
        data.references_at(11)


def test_vatex_eval_missing_file_is_named(tmp_path):
    folder = write_vatex_eval(tmp_path / "vatex", n_videos=1, per_video=2, n_refs=2)
    os.remove(folder / "video_ids.pkl")
    with pytest.raises(InputError, match="video_ids.pkl"):
        load_vatex_eval(folder)


class Exploit:
    """Unpickling this would call os.system."""

    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_restricted_unpickler_refuses_objects(tmp_path):
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps(Exploit()))
    with pytest.raises(InputError, match="refusing to unpickle"):
        load_pickle(path)
    arrays = {"a": np.arange(6).reshape(2, 3), "s": np.array(["x", "yy"], dtype=object), "u": np.array(["ab"])}
    for protocol in (2, 4, 5):
        path.write_bytes(pickle.dumps(arrays, protocol=protocol))
        loaded = load_pickle(path)
        np.testing.assert_array_equal(loaded["a"], arrays["a"])
        assert loaded["s"].tolist() == ["x", "yy"] and loaded["u"].tolist() == ["ab"]
    legacy = pickle.dumps(np.array(["old", "numpy"], dtype=object), protocol=2)
    assert b"numpy._core.multiarray" in legacy
    path.write_bytes(legacy.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))  # as numpy 1.x wrote it
    assert load_pickle(path).tolist() == ["old", "numpy"]
    path.write_bytes(b"garbage")
    with pytest.raises(InputError, match="evil.pkl"):
        load_pickle(path)


def test_vatex_correlations_average_over_annotators():
    rng = np.random.default_rng(0)
    human = rng.integers(1, 6, size=(40, 3)).astype(float)
    scores = human.mean(axis=1) + rng.normal(0, 1, size=40)
    result = correlations(scores, human)
    rounded = np.around(scores, 4)
    expected_tau = np.mean([stats.kendalltau(rounded, human[:, i]).statistic for i in range(3)])
    expected_rho = np.mean([stats.spearmanr(rounded, human[:, i]).statistic for i in range(3)])
    assert result["tau_b"] == pytest.approx(100 * expected_tau)
    assert result["spearman"] == pytest.approx(100 * expected_rho)
    assert result["n"] == 40 and result["tau_b"] > 0
    assert correlations(-scores, human)["tau_b"] == pytest.approx(-result["tau_b"])


def test_activitynet_foil_loader_and_reference_choice(tmp_path):
    folder = write_activitynet_foil(tmp_path / "anet")
    data = load_activitynet_foil(folder)
    assert [v.video_id for v in data.videos] == ["v_a", "v_b"]
    first = data.videos[0]
    assert first.duration == 20.0 and len(first.segments) == 2
    assert first.segments[1].right == "a man throws a ball" and first.segments[1].foil == "a man throws a cat"
    # segment [10, 20] covers the second reference span [9, 19] by 10/11 and the first [0, 8] not at all
    assert first.segments[1].references == ["he throws a ball far"]
    # v_b's only segment overlaps no reference span: every reference is used
    assert data.videos[1].segments[0].references == ["a dog runs", "the dog sleeps"]
    assert data.idf_corpus == ["a short train sentence"]  # the 70-word sentence is left out


def test_activitynet_foil_inconsistent_files_are_named(tmp_path):
    folder = write_activitynet_foil(tmp_path / "anet")
    foil = json.loads((folder / "final_foil_video_sentences.json").read_text())
    foil["results"]["v_a"].pop()
    (folder / "final_foil_video_sentences.json").write_text(json.dumps(foil))
    with pytest.raises(InputError, match="v_a"):
        load_activitynet_foil(folder)


def test_activitynet_protocol_helpers():
    assert overlapping_references((10, 20), [(0, 8), (9, 19), (15, 40)]) == [1]
    assert overlapping_references((0, 30), [(5, 4)]) == []  # an empty span never matches
    assert segment_frames((10, 20), 20.0, 20) == slice(10, 20)
    assert segment_frames((19.9, 20), 20.0, 10) == slice(9, 10)  # never empty
    assert segment_frames((0, 0.1), 20.0, 10) == slice(0, 1)
    from pacs.eval.benchmarks.activitynet_foil import ActivityNetFoilData, FoilSegment, FoilVideo

    data = ActivityNetFoilData([FoilVideo("a", 1.0, [FoilSegment((0, 1), "x", "y", ["r"])] * 2),
                                FoilVideo("b", 1.0, [FoilSegment((0, 1), "x", "y", ["r"])])])
    np.testing.assert_allclose(paragraph_scores(data, np.array([1.0, 3.0, 5.0])), [2.0, 5.0])
    assert foil_accuracy(np.array([2.0, 1.0, 3.0, 1.0]), np.array([1.0, 1.0, 4.0, 0.0])) == pytest.approx(62.5)
