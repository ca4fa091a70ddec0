"""`pacs score-video`: truncated captions marked per instance, `--score sigmoid`, and `--long-captions chunk` refused."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from pacs.cli import main
from pacs.metric.common.errors import InputError
from pacs.metric.models.backbones import build_backbone_from_config, save_backbone, tiny_clip_config
from pacs.metric.video.frames import FrameSampling
from pacs.metric.video.scorer import VideoScorer

from .video_support import frame_array, write_frame_folder

SCALE, BIAS = 4.0, -0.5
LONG = " ".join(["a striped pattern moves left and right across the screen"] * 9)  # > 77 BPE tokens


def sigmoid_backbone():
    """A tiny CLIP-architecture video backbone with a logit bias (sigmoid-loss calibration: scale 4, bias -0.5)."""
    config = tiny_clip_config(vision_cfg={"image_size": 32, "patch_size": 8, "layers": 1, "width": 32,
                                          "head_width": 16}, init_logit_scale=math.log(SCALE), init_logit_bias=BIAS)
    return build_backbone_from_config(config, seed=3, name="tiny-video-sigmoid")


def logistic(x: np.ndarray) -> np.ndarray:
    """The logistic function, by hand."""
    return 1.0 / (1.0 + np.exp(-x))


@pytest.fixture
def task(tmp_path):
    """Two frame folders, candidates (one longer than the context) and references."""
    write_frame_folder(tmp_path / "videos" / "v1", [frame_array(i) for i in range(3)])
    write_frame_folder(tmp_path / "videos" / "v2", [frame_array(5 + i) for i in range(3)])
    (tmp_path / "cands.json").write_text(json.dumps({"v1": LONG, "v2": "colourful stripes"}))
    (tmp_path / "refs.json").write_text(json.dumps({"v1": ["stripes move"], "v2": ["stripes of colour", LONG]}))
    return tmp_path


def test_score_video_marks_truncated_captions_and_maps_sigmoid(task):
    backbone = sigmoid_backbone()
    checkpoint = save_backbone(backbone, task / "tiny.safetensors")
    out = task / "out.json"
    assert main(["--log-level", "WARNING", "score-video", "--metric", "ref-clip-s", "--videos", str(task / "videos"),
                 "--candidates", str(task / "cands.json"), "--references", str(task / "refs.json"),
                 "--checkpoint", str(checkpoint), "--no-idf", "--score", "sigmoid", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["score"] == "sigmoid" and data["long_captions"] == "truncate"
    assert [row["truncated"] for row in data["per_instance"]] == [True, False] and data["n_truncated"] == 1
    # the cosine-convention terms of Eqs. 13-14, then the calibration applied by hand to each term
    plain = VideoScorer(backbone, FrameSampling(fps=None), progress=False)
    videos = [task / "videos" / "v1", task / "videos" / "v2"]
    base = plain.score(videos, [LONG, "colourful stripes"], [["stripes move"], ["stripes of colour", LONG]])
    expected = (logistic(SCALE * base.video_scores + BIAS) + logistic(SCALE * base.ref_terms + BIAS)) / 2
    np.testing.assert_allclose([row["score"] for row in data["per_instance"]], expected, atol=1e-5)
    assert all(0 < row["score"] < 1 for row in data["per_instance"])


def test_video_refuses_sigmoid_on_clip_and_chunking(task, capsys):
    from .video_support import build_tiny_backbone

    with pytest.raises(InputError, match="sigmoid"):
        VideoScorer(build_tiny_backbone(), score="sigmoid")
    with pytest.raises(InputError, match="chunking is not defined"):
        VideoScorer(build_tiny_backbone(), long_captions="chunk")
    checkpoint = save_backbone(build_tiny_backbone(), task / "clip.safetensors")
    assert main(["score-video", "--metric", "clip-s", "--videos", str(task / "videos"), "--candidates",
                 str(task / "cands.json"), "--checkpoint", str(checkpoint), "--long-captions", "chunk",
                 "--out", str(task / "x.json")]) == 2
    assert "--long-captions truncate" in capsys.readouterr().err
    assert not (task / "x.json").exists()
