"""`pacs score-video` end to end on real video files written with PyAV and on frame folders."""
from __future__ import annotations

import json

import numpy as np
import pytest

from pacs.cli import main
from pacs.metric.models.backbones import save_backbone
from pacs.metric.video.frames import FrameSampling
from pacs.metric.video.scorer import VideoScorer

from .video_support import build_tiny_backbone, frame_array, write_frame_folder, write_video


@pytest.fixture
def checkpoint(tmp_path):
    """The tiny backbone's weights saved as a pacs PAC-S++ checkpoint."""
    return save_backbone(build_tiny_backbone("pac-s++"), tmp_path / "tiny-pacs++.safetensors")


@pytest.fixture
def video_task(tmp_path):
    """A folder with two real videos and one frame folder, candidates and references."""
    videos = tmp_path / "videos"
    write_video(videos / "v1.mp4", [frame_array(i) for i in range(6)], fps=3)
    write_video(videos / "v2.avi", [frame_array(10 + i) for i in range(5)], fps=3)
    write_frame_folder(videos / "v3", [frame_array(20 + i) for i in range(4)])
    candidates = [{"image_id": "v1", "caption": "a striped pattern moves"},
                  {"image_id": "v2", "caption": "colourful stripes"},
                  {"image_id": "v3", "caption": "a man rides a horse"},
                  {"image_id": "v1", "caption": ""}]
    references = {"v1": ["stripes move across", "a pattern"], "v2": ["stripes of colour"], "v3": ["a wall"]}
    (tmp_path / "cands.json").write_text(json.dumps(candidates))
    (tmp_path / "refs.json").write_text(json.dumps(references))
    return tmp_path


def run(*argv: str) -> int:
    return main(["--log-level", "WARNING", "score-video", *argv])


def test_score_video_reference_free_matches_python_api(checkpoint, video_task, tiny_backbone, capsys):
    out = video_task / "out.json"
    code = run("--metric", "PAC-S++", "--videos", str(video_task / "videos"), "--candidates",
               str(video_task / "cands.json"), "--checkpoint", str(checkpoint), "--fps", "2",
               "--batch-size", "3", "--out", str(out))
    assert code == 0
    assert "pac-s++ video" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["metric"] == "pac-s++" and result["w"] == 1.0 and result["n_videos"] == 3
    assert [row["video_id"] for row in result["per_instance"]] == ["v1", "v2", "v3", "v1"]
    assert result["n_empty"] == 1 and "provenance" in result
    assert result["provenance"]["config"]["idf_corpus"] == "candidates"
    # the same numbers through the Python API (IDF from the candidates, the CLI's default without references)
    scorer = VideoScorer(tiny_backbone, FrameSampling(fps=2), progress=False)
    captions = [row["caption"] for row in result["per_instance"]]
    videos = [video_task / "videos" / name for name in ("v1.mp4", "v2.avi", "v3", "v1.mp4")]
    expected = scorer.score(videos, captions, idf=scorer.idf(captions))
    np.testing.assert_allclose([row["score"] for row in result["per_instance"]], expected.scores, atol=1e-5)
    assert result["mean"] == pytest.approx(float(np.mean(expected.scores)), abs=1e-6)


def test_score_video_reference_based(checkpoint, video_task):
    out = video_task / "ref.json"
    assert run("--metric", "ref-pac-s++", "--videos", str(video_task / "videos"), "--candidates",
               str(video_task / "cands.json"), "--references", str(video_task / "refs.json"),
               "--checkpoint", str(checkpoint), "--num-frames", "3", "--w", "2", "--out", str(out)) == 0
    rows = json.loads(out.read_text())["per_instance"]
    for row in rows:
        assert row["score"] == pytest.approx(2.0 * (row["video_score"] + row["ref_term"]) / 2, abs=1e-6)
        assert row["video_score"] == pytest.approx((row["coarse"] + row["fine"]) / 2, abs=1e-6)


def test_score_video_reports_videos_short_of_num_frames(checkpoint, video_task, capsys):
    out = video_task / "short.json"
    assert run("--metric", "pac-s++", "--videos", str(video_task / "videos"), "--candidates",
               str(video_task / "cands.json"), "--checkpoint", str(checkpoint), "--num-frames", "5",
               "--out", str(out)) == 0
    result = json.loads(out.read_text())
    # v1 has 6 frames and v2 5; the folder v3 has 4: int(linspace(0, 3, 5)) = 0 0 1 2 3, four distinct
    assert result["n_short_videos"] == 1
    assert result["short_videos"] == [{"video": str((video_task / "videos" / "v3").resolve()), "requested": 5,
                                       "distinct": 4}]
    assert "1 video(s) short of --num-frames" in capsys.readouterr().out


def test_score_video_errors_leave_no_output(checkpoint, video_task, capsys):
    out = video_task / "never.json"
    cands = json.loads((video_task / "cands.json").read_text()) + [{"image_id": "ghost", "caption": "x"}]
    (video_task / "bad.json").write_text(json.dumps(cands))
    code = run("--metric", "pac-s++", "--videos", str(video_task / "videos"), "--candidates",
               str(video_task / "bad.json"), "--checkpoint", str(checkpoint), "--out", str(out))
    assert code == 2 and "'ghost'" in capsys.readouterr().err and not out.exists()
    code = run("--metric", "ref-pac-s++", "--videos", str(video_task / "videos"), "--candidates",
               str(video_task / "cands.json"), "--checkpoint", str(checkpoint), "--out", str(out))
    assert code == 2 and "--references" in capsys.readouterr().err and not out.exists()
    (video_task / "videos" / "v2.avi").write_bytes(b"broken")
    code = run("--metric", "pac-s++", "--videos", str(video_task / "videos"), "--candidates",
               str(video_task / "cands.json"), "--checkpoint", str(checkpoint), "--out", str(out))
    assert code == 2 and "v2.avi" in capsys.readouterr().err and not out.exists()


def test_score_video_with_a_video_map(checkpoint, video_task):
    (video_task / "map.json").write_text(json.dumps({"clipA": "videos/v1.mp4", "clipB": "videos/v3"}))
    (video_task / "mapped.json").write_text(json.dumps([{"video_id": "clipA", "caption": "stripes"},
                                                        {"video_id": "clipB", "caption": "a frame folder"}]))
    out = video_task / "mapped_out.json"
    assert run("--metric", "pac-s++", "--video-map", str(video_task / "map.json"), "--candidates",
               str(video_task / "mapped.json"), "--checkpoint", str(checkpoint), "--out", str(out)) == 0
    result = json.loads(out.read_text())
    assert [row["video_id"] for row in result["per_instance"]] == ["clipA", "clipB"] and result["n_videos"] == 2
    (video_task / "mapped.json").write_text(json.dumps({"clipA": "stripes", "v1": "not in the map"}))
    assert run("--metric", "pac-s++", "--video-map", str(video_task / "map.json"), "--candidates",
               str(video_task / "mapped.json"), "--checkpoint", str(checkpoint), "--out", str(out)) == 2


def test_score_video_refuses_a_reduced_precision_it_would_ignore(checkpoint, video_task, capsys):
    out = video_task / "out_bf16.json"
    code = run("--metric", "PAC-S++", "--videos", str(video_task / "videos"), "--candidates",
               str(video_task / "cands.json"), "--checkpoint", str(checkpoint), "--dtype", "bf16", "--out", str(out))
    assert code == 2 and not out.exists()
    assert "video scores are computed in fp32 only; --dtype bf16 is not supported" in capsys.readouterr().err
