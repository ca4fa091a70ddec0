"""`score="cosine" | "sigmoid"` on every surface: the hand formulas, the refusal on CLIP, the recorded convention."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image

from pacs import cli as pacs_cli
from pacs.metric import load_backbone, score
from pacs.metric.common.errors import InputError
from pacs.metric.models.backbones import build_backbone_from_config, save_backbone, tiny_clip_config
from pacs.metric.scoring.conventions import calibration
from pacs.metric.scoring.model_options import ModelOptions, build_scorer
from pacs.metric.scoring.scorer import DEFAULT_PROMPT, Scorer

SCALE, BIAS = 7.0, -1.5


def sigmoid(x: float) -> float:
    """The logistic function, by hand."""
    return 1.0 / (1.0 + math.exp(-x))


@pytest.fixture(scope="module")
def sigmoid_backbone():
    """A tiny CLIP-architecture model with a logit bias (as trained with the sigmoid loss): scale 7, bias -1.5."""
    config = tiny_clip_config(init_logit_scale=math.log(SCALE), init_logit_bias=BIAS,
                              text_cfg={"context_length": 16})
    return build_backbone_from_config(config, seed=2, name="tiny-sigmoid")


@pytest.fixture(scope="module")
def clip_backbone():
    """The tiny random CLIP (no logit bias)."""
    return load_backbone("tiny-random")


@torch.no_grad()
def hand_text(backbone, texts: list[str]) -> torch.Tensor:
    """Normalised text embeddings from the model's own full-context forward."""
    return torch.nn.functional.normalize(backbone.model.encode_text(backbone.tokenize(texts)).float(), dim=-1)


@torch.no_grad()
def hand_image(backbone, image: Image.Image) -> torch.Tensor:
    """Normalised image embedding from the model's own forward."""
    return torch.nn.functional.normalize(backbone.model.encode_image(backbone.preprocess(image)[None]), dim=-1)[0]


def harmonic(a: float, b: float) -> float:
    """2ab / (a + b)."""
    return 2 * a * b / (a + b)


IMAGES = [Image.new("RGB", (64, 64), "red"), Image.new("RGB", (50, 70), (10, 200, 30))]
CAPTIONS = ["a red square", "green grass in a field"]
REFERENCES = [["a red image", "red"], ["a field", "grass grows", "a green thing"]]


def test_calibration_reads_scale_and_bias(sigmoid_backbone):
    found = calibration(sigmoid_backbone)
    assert found.scale == pytest.approx(SCALE, rel=1e-6) and found.bias == pytest.approx(BIAS)


def test_sigmoid_equals_the_hand_formula(sigmoid_backbone):
    result = Scorer(sigmoid_backbone, score="sigmoid", progress=False).score(IMAGES, CAPTIONS, REFERENCES)
    expected_free, expected_ref = [], []
    for image, caption, refs in zip(IMAGES, CAPTIONS, REFERENCES):
        candidate = hand_text(sigmoid_backbone, [DEFAULT_PROMPT + caption])[0]
        cos = float(hand_image(sigmoid_backbone, image) @ candidate)
        ref_cos = float((hand_text(sigmoid_backbone, [DEFAULT_PROMPT + r for r in refs]) @ candidate).max())
        free, ref = sigmoid(SCALE * cos + BIAS), sigmoid(SCALE * ref_cos + BIAS)
        expected_free.append(free)
        expected_ref.append(harmonic(free, ref))
    np.testing.assert_allclose(result.clip_scores, expected_free, atol=1e-5)
    np.testing.assert_allclose(result.scores, expected_ref, atol=1e-5)
    assert result.score_kind == "sigmoid"


def test_cosine_stays_the_default_and_equals_w_max_cos(sigmoid_backbone):
    result = Scorer(sigmoid_backbone, progress=False).score(IMAGES, CAPTIONS)
    cosines = [float(hand_image(sigmoid_backbone, image) @ hand_text(sigmoid_backbone, [DEFAULT_PROMPT + c])[0])
               for image, c in zip(IMAGES, CAPTIONS)]
    np.testing.assert_allclose(result.scores, [2.5 * max(c, 0.0) for c in cosines], atol=1e-5)
    assert result.score_kind == "cosine"


def test_sigmoid_is_refused_on_clip_with_one_clear_error(clip_backbone):
    with pytest.raises(InputError, match="sigmoid needs a model trained with the sigmoid loss") as error:
        Scorer(clip_backbone, score="sigmoid")
    assert error.value.parameters == ("score",)
    with pytest.raises(InputError, match="sigmoid"):
        score(IMAGES, CAPTIONS, metric="clip-s", backbone=clip_backbone, score="sigmoid")
    with pytest.raises(InputError, match="sigmoid"):
        build_scorer("clip-s", ModelOptions(device="cpu", score="sigmoid"), Scorer(clip_backbone))
    with pytest.raises(InputError, match="sigmoid"):
        Scorer(clip_backbone).score(IMAGES, CAPTIONS, score="sigmoid")
    from pacs.rewards import build_reward

    with pytest.raises(InputError, match="sigmoid"):
        build_reward("clip-s", backbone=clip_backbone, score="sigmoid")


def test_unknown_score_kind_is_an_error(sigmoid_backbone):
    with pytest.raises(InputError, match="unknown score= 'logit'"):
        Scorer(sigmoid_backbone, score="logit")


def test_score_api_and_build_scorer_record_the_convention(sigmoid_backbone):
    result = score(IMAGES, CAPTIONS, REFERENCES, metric="ref-clip-s", backbone=sigmoid_backbone, score="sigmoid")
    assert result.score_kind == "sigmoid" and result.details.score_kind == "sigmoid"
    free = [sigmoid(SCALE * float(c) + BIAS) for c in result.details.cosines]
    np.testing.assert_allclose(result.details.clip_scores, free, atol=1e-6)
    scorer = build_scorer("clip-s", ModelOptions(device="cpu", score="sigmoid"), sigmoid_backbone)
    assert scorer.score_kind == "sigmoid"
    # a Scorer keeps its own convention unless the call names one
    assert score(IMAGES, CAPTIONS, metric="clip-s", backbone=scorer).score_kind == "sigmoid"
    assert score(IMAGES, CAPTIONS, metric="clip-s", backbone=scorer, score="cosine").score_kind == "cosine"


def test_torchmetrics_sigmoid(sigmoid_backbone):
    pytest.importorskip("torchmetrics")
    from pacs.metric.scoring.tm_metrics import CLIPScore

    metric = CLIPScore(backbone=sigmoid_backbone, score="sigmoid", return_per_sample=True)
    metric.update(IMAGES, CAPTIONS)
    per_sample = metric.compute()["per_sample"]
    expected = [sigmoid(SCALE * float(hand_image(sigmoid_backbone, image)
                                      @ hand_text(sigmoid_backbone, [DEFAULT_PROMPT + caption])[0]) + BIAS)
                for image, caption in zip(IMAGES, CAPTIONS)]
    np.testing.assert_allclose(per_sample.numpy(), expected, atol=1e-5)
    assert metric.score_kind == "sigmoid"
    with pytest.raises(InputError, match="sigmoid"):
        CLIPScore(backbone=load_backbone("tiny-random"), score="sigmoid")


def test_reward_and_trl_sigmoid(sigmoid_backbone):
    from pacs.rewards import build_reward
    from pacs.rewards.trl import reward_function

    red = IMAGES[0]
    reward = build_reward("clip-s", backbone=sigmoid_backbone, image_loader=lambda image_id: red, score="sigmoid")
    values = reward(["r"], [["a red square", "a dog"]], [[]])
    texts = hand_text(sigmoid_backbone, [DEFAULT_PROMPT + "a red square", DEFAULT_PROMPT + "a dog"])
    expected = [sigmoid(SCALE * float(hand_image(sigmoid_backbone, red) @ t) + BIAS) for t in texts]
    np.testing.assert_allclose(values[0].numpy(), expected, atol=1e-5)
    trl = reward_function("clip-s", backbone=sigmoid_backbone, score="sigmoid")
    scores = trl(prompts=["p", "p"], completions=["a red square", "a dog"], image=[red, red])
    np.testing.assert_allclose(scores, expected, atol=1e-5)


def test_cli_score_sigmoid_chunk_end_to_end(sigmoid_backbone, tmp_path):
    checkpoint = save_backbone(sigmoid_backbone, tmp_path / "tiny-sigmoid.safetensors")
    images = tmp_path / "images"
    images.mkdir()
    IMAGES[0].save(images / "a.png")
    IMAGES[1].save(images / "b.png")
    long = "a red square sits. a blue dog runs fast. the sky is very blue today. grass grows."
    (tmp_path / "cands.json").write_text(json.dumps({"a": long, "b": "green grass"}))
    (tmp_path / "refs.json").write_text(json.dumps({"a": ["a red image"], "b": ["a field", long]}))
    out = tmp_path / "out.json"
    argv = ["score", "--metric", "ref-clip-s", "--checkpoint", str(checkpoint), "--images", str(images),
            "--candidates", str(tmp_path / "cands.json"), "--references", str(tmp_path / "refs.json"),
            "--score", "sigmoid", "--long-captions", "chunk", "--out", str(out)]
    assert pacs_cli.main(argv) == 0
    data = json.loads(out.read_text())
    assert data["score"] == "sigmoid" and data["long_captions"] == "chunk"
    assert data["provenance"]["score"] == "sigmoid" and data["provenance"]["config"]["long_captions"] == "chunk"
    assert data["n_truncated"] == 0 and data["n_chunked"] == 1
    assert [row["truncated"] for row in data["per_instance"]] == [False, False]

    def chunked(text: str) -> torch.Tensor:
        pieces = ["a red square sits. a blue dog runs fast.", "the sky is very blue today. grass grows."]
        if text != long:
            return hand_text(sigmoid_backbone, [DEFAULT_PROMPT + text])[0]
        mean = hand_text(sigmoid_backbone, [DEFAULT_PROMPT + p for p in pieces]).mean(0)
        return mean / mean.norm()

    expected = []
    for image, caption, refs in ((IMAGES[0], long, ["a red image"]), (IMAGES[1], "green grass", ["a field", long])):
        candidate = chunked(caption)
        free = sigmoid(SCALE * float(hand_image(sigmoid_backbone, image) @ candidate) + BIAS)
        ref = sigmoid(SCALE * max(float(chunked(r) @ candidate) for r in refs) + BIAS)
        expected.append(harmonic(free, ref))
    np.testing.assert_allclose([row["score"] for row in data["per_instance"]], expected, atol=1e-5)


def test_cli_refuses_sigmoid_on_clip_in_one_line(tmp_path, capsys):
    images = tmp_path / "images"
    images.mkdir()
    IMAGES[0].save(images / "a.png")
    (tmp_path / "cands.json").write_text(json.dumps({"a": "a red square"}))
    out = tmp_path / "out.json"
    assert pacs_cli.main(["score", "--metric", "clip-s", "--backbone", "tiny-random", "--images", str(images),
                          "--candidates", str(tmp_path / "cands.json"), "--score", "sigmoid",
                          "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--score sigmoid needs" in err[0] and "--score cosine" in err[0]
    assert not out.exists()


def test_correlate_takes_the_score_option_and_refuses_sigmoid_on_clip(tmp_path, sigmoid_backbone):
    from pacs.eval import correlate

    IMAGES[0].save(tmp_path / "img0.png")
    judged = [("a red square", 5), ("a dog", 1), ("red", 4)]
    data = {"img0": {"image_path": "img0.png", "ground_truth": ["a red image"],
                     "human_judgement": [{"caption": c, "rating": r} for c, r in judged]}}
    (tmp_path / "composite.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match="sigmoid needs"):
        correlate("composite", tmp_path / "composite.json", "clip-s", images=str(tmp_path), backbone="tiny-random",
                  score="sigmoid")
    checkpoint = save_backbone(sigmoid_backbone, tmp_path / "tiny-sigmoid.safetensors")
    table = correlate("composite", tmp_path / "composite.json", "clip-s", images=str(tmp_path),
                      checkpoint=str(checkpoint), score="sigmoid", long_captions="chunk")
    assert table["clip-s"]["n"] == 3
