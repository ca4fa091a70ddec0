"""The video metric on the VATEX-EVAL and ActivityNet-FOIL protocols, with real videos and frame folders."""
from __future__ import annotations

import numpy as np
import pytest

from pacs.eval.benchmarks import RunContext, get_benchmark
from pacs.eval.benchmarks.activitynet_foil import (
    default_idf_corpus,
    foil_accuracy,
    load_activitynet_foil,
    video_paragraph_scores,
)
from pacs.eval.benchmarks.vatex_eval import correlations, load_vatex_eval, setting_name, video_metric_scores
from pacs.eval.benchmarks.vatex_eval import default_idf_corpus as vatex_idf_corpus
from pacs.eval.caption_scoring import MetricSuite
from pacs.metric.common.errors import InputError
from pacs.metric.models.backbones import save_backbone
from pacs.metric.scoring.model_options import ModelOptions
from pacs.metric.video.frames import FrameSampling, find_videos
from pacs.metric.video.options import VideoOptions
from pacs.metric.video.scorer import VideoScorer

from .video_support import (
    build_tiny_backbone,
    frame_array,
    pair_accuracy_by_hand,
    write_activitynet_foil,
    write_frame_folder,
    write_vatex_eval,
)


def test_vatex_eval_video_scores_with_0_1_9_references(tiny_backbone, tmp_path):
    folder = write_vatex_eval(tmp_path / "vatex", n_videos=2, per_video=3, n_refs=10, videos_dir=tmp_path / "videos")
    data = load_vatex_eval(folder)
    videos, missing = find_videos(tmp_path / "videos", data.video_ids)
    assert not missing and set(videos) == {"vid0", "vid1"}
    scorer = VideoScorer(tiny_backbone, FrameSampling(num_frames=10), progress=False)
    idf = scorer.idf(vatex_idf_corpus(data))
    by_setting = {n: video_metric_scores(data, scorer, videos, n, idf) for n in (0, 1, 9)}
    one_ref = scorer.score([videos[v] for v in data.video_ids], data.candidates,
                           [[refs[0]] for refs in data.references], idf=idf)
    np.testing.assert_allclose(by_setting[1], one_ref.scores)
    assert not np.allclose(by_setting[0], by_setting[9])
    assert scorer.stats["videos_embedded"] == 2  # each video embedded once for all settings
    result = correlations(by_setting[9], data.human_scores)
    assert set(result) == {"tau_b", "tau_c", "spearman", "n"} and result["n"] == 6
    assert setting_name("ref-pac-s++", 9) == "ref-pac-s++@9" and setting_name("pac-s++", 0) == "pac-s++"


def test_activitynet_foil_segments_see_only_their_frames(tiny_backbone, tmp_path):
    folder = write_activitynet_foil(tmp_path / "anet")
    data = load_activitynet_foil(folder)
    first, second = frame_array(1), frame_array(2)
    # v_a: 20 s annotated; 8 frames, the first half one image and the second half another
    write_frame_folder(tmp_path / "videos" / "v_a", [first] * 4 + [second] * 4)
    write_frame_folder(tmp_path / "videos" / "v_b", [frame_array(3 + i) for i in range(4)])
    write_frame_folder(tmp_path / "parts" / "first", [first] * 4)
    write_frame_folder(tmp_path / "parts" / "second", [second] * 4)
    write_frame_folder(tmp_path / "parts" / "b0", [frame_array(3)])  # v_b segment [0, 2] of 8 s: frame 0 of 4
    videos, missing = find_videos(tmp_path / "videos", [v.video_id for v in data.videos])
    assert not missing
    scorer = VideoScorer(tiny_backbone, FrameSampling(fps=None), progress=False)
    idf = scorer.idf(default_idf_corpus(data))
    for use_references in (False, True):
        right, foil = video_paragraph_scores(data, scorer, videos, use_references, idf)
        parts = [tmp_path / "parts" / name for name in ("first", "second", "b0")]
        segments = [s for video in data.videos for s in video.segments]
        refs = [s.references for s in segments] if use_references else None
        expected_right = scorer.score(parts, [s.right for s in segments], refs, idf=idf).scores
        expected_foil = scorer.score(parts, [s.foil for s in segments], refs, idf=idf).scores
        np.testing.assert_allclose(right, [expected_right[:2].mean(), expected_right[2]], atol=1e-6)
        np.testing.assert_allclose(foil, [expected_foil[:2].mean(), expected_foil[2]], atol=1e-6)
        assert foil_accuracy(right, foil) == pytest.approx(pair_accuracy_by_hand(right, foil))
    # the correct and foiled first segments of v_a are the same sentence: only the second segment differs
    assert data.videos[0].segments[0].right == data.videos[0].segments[0].foil


def test_activitynet_foil_default_idf_corpus(tmp_path):
    folder = write_activitynet_foil(tmp_path / "anet")
    (folder / "train.json").unlink()
    data = load_activitynet_foil(folder)
    assert data.idf_corpus is None
    assert default_idf_corpus(data) == ["a man picks up a ball", "he throws a ball far", "a dog runs", "the dog sleeps"]


def correlate_options(checkpoint, videos, **overrides) -> dict:
    """The options `pacs correlate` passes to a video benchmark: `model=` ModelOptions, `options=` VideoOptions."""
    return {"model": ModelOptions(checkpoint=str(checkpoint), batch_size=8),
            "options": VideoOptions(videos=str(videos), **overrides)}


def test_vatex_eval_benchmark_table(tmp_path):
    folder = write_vatex_eval(tmp_path / "vatex", n_videos=2, per_video=3, n_refs=10, videos_dir=tmp_path / "videos")
    checkpoint = save_backbone(build_tiny_backbone("pac-s++"), tmp_path / "tiny.safetensors")
    suite = MetricSuite(["pac-s++", "ref-pac-s++", "length", "bleu1"])
    context = RunContext(data=folder, suite=suite, **correlate_options(checkpoint, tmp_path / "videos"))
    table = get_benchmark("vatex-eval").run(context)
    assert set(table) == {"pac-s++", "ref-pac-s++@1", "ref-pac-s++@9", "length", "bleu1@1", "bleu1@9"}
    for row in table.values():
        assert row["n"] == 6 and set(row) >= {"tau_b", "tau_c", "spearman"}
    # the reference-free entry is the annotator-averaged correlation of the Python API's scores (10 frames)
    data = load_vatex_eval(folder)
    scorer = VideoScorer(build_tiny_backbone("pac-s++"), FrameSampling(num_frames=10), progress=False)
    videos = {v: tmp_path / "videos" / f"{v}.mp4" for v in ("vid0", "vid1")}
    expected = correlations(video_metric_scores(data, scorer, videos, 0, scorer.idf(vatex_idf_corpus(data))),
                            data.human_scores)
    assert table["pac-s++"]["tau_b"] == pytest.approx(expected["tau_b"])


def test_activitynet_foil_benchmark_table_and_missing_videos(tmp_path):
    folder = write_activitynet_foil(tmp_path / "anet", videos_dir=tmp_path / "videos")
    checkpoint = save_backbone(build_tiny_backbone("pac-s++"), tmp_path / "tiny.safetensors")
    suite = MetricSuite(["pac-s++", "ref-pac-s++", "length"])
    context = RunContext(data=folder, suite=suite, **correlate_options(checkpoint, tmp_path / "videos"))
    table = get_benchmark("activitynet-foil").run(context)
    assert set(table) == {"pac-s++", "ref-pac-s++", "length"}
    for row in table.values():
        assert row["n"] == 2 and row["1-ref"] == row["mean"]
    # the video rows: paragraph scores of the Python API (the benchmark's default 1 frame per second, IDF from the
    # released train corpus), compared pair by pair
    data = load_activitynet_foil(folder)
    scorer = VideoScorer(build_tiny_backbone("pac-s++"), FrameSampling(fps=1.0), progress=False)
    videos = {v: tmp_path / "videos" / f"{v}.mp4" for v in ("v_a", "v_b")}
    idf = scorer.idf(default_idf_corpus(data))
    for name, use_references in (("pac-s++", False), ("ref-pac-s++", True)):
        right, foil = video_paragraph_scores(data, scorer, videos, use_references, idf)
        assert table[name]["mean"] == pytest.approx(pair_accuracy_by_hand(right, foil))
    # length: v_a's paragraphs tie (50), v_b's foil has the same word count (tie again)
    assert table["length"]["mean"] == 50.0
    (tmp_path / "videos" / "v_b.mp4").unlink()
    with pytest.raises(InputError, match="v_b"):
        get_benchmark("activitynet-foil").run(
            RunContext(data=folder, suite=suite, **correlate_options(checkpoint, tmp_path / "videos")))
    skipping = RunContext(data=folder, suite=suite, skip_missing_images=True,
                          **correlate_options(checkpoint, tmp_path / "videos"))
    table = get_benchmark("activitynet-foil").run(skipping)
    assert table["pac-s++"]["n"] == 1 and skipping.notes["skipped_missing_video"] == 1
